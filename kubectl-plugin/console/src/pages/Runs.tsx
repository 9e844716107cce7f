import type { Refusals, RunRow } from "../api";
import { Failed, Page, PhaseBadge, Refused, Tools, runLink, usd, usePoll, when } from "../ui";

export function QueueCell({ row }: { row: RunRow }) {
  const q = row.queue;
  if (q === null) return <span class="muted">—</span>;
  const state = q.admitted === "True" ? "admitted" : q.reason ?? (q.admitted === "False" ? "waiting" : "—");
  return (
    <span class={`queue queue-${state.toLowerCase()}`} title={q.message ?? undefined}>
      {q.queue ?? ""} {state}
    </span>
  );
}

export function Runs() {
  const found = usePoll<{ runs: RunRow[]; refused: Refusals }>("/api/runs", 2);
  return (
    <Page title="Runs">
      {found === null ? (
        <p class="muted">Loading…</p>
      ) : !found.ok ? (
        <Failed error={found.error} status={found.status} />
      ) : (
        <>
          <Refused refused={found.data.refused} />
          {found.data.runs.length === 0 ? (
            <p class="muted">No runs you may see.</p>
          ) : (
            <table class="runs">
              <thead>
                <tr>
                  <th>Namespace</th>
                  <th>Run</th>
                  <th>Agent</th>
                  <th>Phase</th>
                  <th>Tools executed</th>
                  <th>Attempts</th>
                  <th>Cost</th>
                  <th>Queue</th>
                  <th>Created</th>
                </tr>
              </thead>
              <tbody>
                {found.data.runs.map((r) => (
                  <tr key={`${r.namespace}/${r.name}`} data-run={`${r.namespace}/${r.name}`} class={r.live ? "live" : ""}>
                    <td>{r.namespace}</td>
                    <td>
                      <a href={runLink(r.namespace, r.name)}>{r.name}</a>
                      {r.live ? <span class="dot" title="live" /> : null}
                    </td>
                    <td>{r.agent}</td>
                    <td>
                      <PhaseBadge phase={r.phase} reason={r.reason} />
                    </td>
                    <td>
                      <Tools tools={r.toolsExecuted} />
                    </td>
                    <td class="num">{r.attempts}</td>
                    <td class="num">{usd(r.costMicroUSD)}</td>
                    <td>
                      <QueueCell row={r} />
                    </td>
                    <td class="time">{when(r.created)}</td>
                  </tr>
                ))}
              </tbody>
            </table>
          )}
        </>
      )}
    </Page>
  );
}
