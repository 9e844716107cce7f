import { useEffect, useState } from "preact/hooks";
import { type Answer, type Call, type Entry, type RunPage, type Said as SaidT, type Transcript, get, post } from "../api";
import { Failed, Page, PhaseBadge, Said, Tools, runLink, usd, usePoll, when } from "../ui";
import { QueueCell } from "./Runs";

const TERMINAL = new Set(["Succeeded", "Failed", "Cancelled"]);

// What names an entry while it changes (a call's seq and state may come later), as
// `kubectl agentrun transcript` keys it.
function keyOf(e: Entry): string {
  return [e.attempt, e.kind, e.time, e.author, e.tool].join("|");
}

function json(value: unknown): string {
  return JSON.stringify(value, null, 2);
}

// The transcript, read once, then followed (?follow=true, through the console) while the
// run is live: entries appear as they come, without a reload.
function useTranscript(ns: string, name: string) {
  const [entries, setEntries] = useState<Map<string, Entry>>(new Map());
  const [failed, setFailed] = useState<{ error: string; status: number } | null>(null);
  const [following, setFollowing] = useState(false);
  useEffect(() => {
    let stopped = false;
    const abort = new AbortController();
    const base = `/api/runs/${encodeURIComponent(ns)}/${encodeURIComponent(name)}`;
    const merge = (list: Entry[]) =>
      setEntries((before) => {
        const after = new Map(before);
        for (const e of list) after.set(keyOf(e), e);
        return after;
      });
    const whole = async (): Promise<string | undefined | null> => {
      const found = await get<Transcript>(`${base}/transcript`);
      if (stopped) return null;
      if (!found.ok) {
        setFailed({ error: found.error, status: found.status });
        return null;
      }
      setFailed(null);
      merge(found.data.entries ?? []);
      return found.data.run?.phase;
    };
    (async () => {
      let phase = await whole();
      while (!stopped && phase !== null && !TERMINAL.has(phase ?? "Pending")) {
        setFollowing(true);
        try {
          const response = await fetch(`${base}/follow`, { credentials: "same-origin", signal: abort.signal });
          if (!response.ok || response.body === null) break;
          const reader = response.body.getReader();
          const decoder = new TextDecoder();
          let held = "";
          for (;;) {
            const { value, done } = await reader.read();
            if (done) break;
            held += decoder.decode(value, { stream: true });
            const lines = held.split("\n");
            held = lines.pop() ?? "";
            merge(lines.filter((l) => l.trim()).map((l) => JSON.parse(l) as Entry));
          }
        } catch {
          if (stopped) return;
          await new Promise((r) => setTimeout(r, 1000));
        }
        // A stream ends when its run settles, or at the API server's request timeout.
        phase = await whole();
      }
      if (!stopped) setFollowing(false);
    })();
    return () => {
      stopped = true;
      abort.abort();
    };
  }, [ns, name]);
  return { entries: [...entries.values()], failed, following };
}

function mark(e: Entry): string {
  if (e.state === "inDoubt") return "IN DOUBT: called, its end never recorded; it may or may not have happened";
  if (e.state === "denied") return "denied";
  if (e.state === "answered" && e.kind === "toolResult") return "answered from the journal: not run again";
  return "";
}

function EntryLine({ e }: { e: Entry }) {
  const call = e.seq !== undefined && e.seq !== null ? ` (call ${e.seq})` : "";
  const m = mark(e);
  let body;
  if (e.kind === "input" || e.kind === "text") body = <span class="text">{e.text}</span>;
  else if (e.kind === "toolCall")
    body = (
      <>
        calls <b>{e.tool}</b>
        {call} <pre>{json(e.args ?? {})}</pre>
      </>
    );
  else if (e.kind === "toolResult")
    body = (
      <>
        <b>{e.tool}</b>
        {call} returned <pre>{json(e.result)}</pre>
      </>
    );
  else if (e.kind === "approval" && e.author === "agentrun")
    body = (
      <>
        waits for an approval of <b>{e.tool}</b>
        {call} <pre>{json(e.args)}</pre>
      </>
    );
  else if (e.kind === "approval") {
    const decided = (e.result ?? {}) as { decision?: string; note?: string };
    body = (
      <>
        {decided.decision === "Deny" ? "denied" : "approved"} <b>{e.tool}</b>
        {call}
        {decided.note ? `: ${decided.note}` : ""}
      </>
    );
  }
  else body = <span class="text">error: {e.text}</span>;
  return (
    <li class={`entry entry-${e.kind}${e.state ? ` state-${e.state}` : ""}`}>
      <span class="time">{(e.time ?? "").slice(11, 19)}</span>
      <span class="author">{e.author}</span>
      <span class="body">
        {body}
        {m ? <span class="mark">[{m}]</span> : null}
      </span>
    </li>
  );
}

function ended(c: Call): string {
  if (c.outcome === "journal") return "answered from the journal (not run again)";
  if (c.outcome === "denied") return "denied by its approver (never run)";
  if (!c.endedAt) return "no (called, never answered): in doubt";
  return `ran: ${c.outcome ?? "ok"} at ${when(c.endedAt)}`;
}

function Actions({ run, onDone }: { run: RunPage; onDone: () => void }) {
  const [note, setNote] = useState("");
  const [force, setForce] = useState(false);
  const [busy, setBusy] = useState(false);
  const [answer, setAnswer] = useState<Answer<SaidT> | null>(null);
  const act = async (action: string) => {
    setBusy(true);
    setAnswer(null);
    const base = `/api/runs/${encodeURIComponent(run.namespace)}/${encodeURIComponent(run.name)}`;
    setAnswer(await post<SaidT>(`${base}/${action}`, { note, force }));
    setBusy(false);
    onDone();
  };
  return (
    <div class="actions">
      <input
        type="text"
        placeholder="note (why)"
        value={note}
        onInput={(e) => setNote((e.target as HTMLInputElement).value)}
        aria-label="note"
      />
      <label>
        <input type="checkbox" checked={force} onChange={(e) => setForce((e.target as HTMLInputElement).checked)} /> force
      </label>
      <button disabled={busy} onClick={() => act("replay")}>
        Replay
      </button>
      <button disabled={busy} onClick={() => act("resume")}>
        Resume
      </button>
      {run.live ? (
        <button disabled={busy} class="danger" onClick={() => act("cancel")}>
          Cancel
        </button>
      ) : null}
      <Said answer={answer} />
    </div>
  );
}

export function Run({ params }: { params: { ns: string; name: string } }) {
  const { ns, name } = params;
  const [again, setAgain] = useState(0);
  const found = usePoll<RunPage>(`/api/runs/${encodeURIComponent(ns)}/${encodeURIComponent(name)}`, 2, again);
  const transcript = useTranscript(ns, name);
  if (found === null) return <p class="muted">Loading…</p>;
  if (!found.ok)
    return (
      <Page title={`${ns}/${name}`}>
        <Failed error={found.error} status={found.status} />
      </Page>
    );
  const run = found.data;
  return (
    <Page title={`${run.namespace}/${run.name}`}>
      <dl class="summary">
        <dt>Phase</dt>
        <dd>
          <PhaseBadge phase={run.phase} reason={run.reason} />
        </dd>
        <dt>Message</dt>
        <dd class="message">{run.message ?? "—"}</dd>
        <dt>Agent</dt>
        <dd>{run.agent}</dd>
        <dt>Tools executed</dt>
        <dd>
          <Tools tools={run.toolsExecuted} />
        </dd>
        <dt>Attempts</dt>
        <dd>{run.attempts}</dd>
        <dt>Usage</dt>
        <dd>
          {run.usage
            ? `${run.usage.modelCalls ?? 0} model calls, ${run.usage.toolCalls ?? 0} tool calls, ${
                (run.usage.inputTokens ?? 0) + (run.usage.outputTokens ?? 0)
              } tokens, ${usd(run.usage.costMicroUSD)}`
            : "—"}
        </dd>
        <dt>Queue</dt>
        <dd>
          <QueueCell row={run} />
        </dd>
        <dt>Created</dt>
        <dd>
          {when(run.created)}
          {run.createdBy ? ` by ${run.createdBy}` : ""}
        </dd>
        {run.replayOf ? (
          <>
            <dt>Replay of</dt>
            <dd>
              <a href={runLink(run.namespace, run.replayOf)}>{run.replayOf}</a>
            </dd>
          </>
        ) : null}
      </dl>
      {run.pendingApproval ? (
        <p class="pending">
          Waits for an approval of <b>{run.pendingApproval.tool}</b> (call {run.pendingApproval.seq}): decide it in the{" "}
          <a href="/approvals">approval inbox</a>.
        </p>
      ) : null}
      <Actions run={run} onDone={() => setAgain((n) => n + 1)} />

      <h2>Replays</h2>
      {run.replaysRefused ? <Failed error={run.replaysRefused} /> : null}
      {run.replays.length === 0 ? (
        <p class="muted">None.</p>
      ) : (
        <table class="replays">
          <thead>
            <tr>
              <th>Replay</th>
              <th>Kind</th>
              <th>Decision</th>
              <th>In its own words</th>
              <th>Tools executed (then)</th>
              <th>Replay run</th>
            </tr>
          </thead>
          <tbody>
            {run.replays.map((r) => (
              <tr key={r.name} data-replay={r.name}>
                <td>{r.name}</td>
                <td>
                  {r.resume ? "resume" : "replay"}
                  {r.forced ? " (forced)" : ""}
                </td>
                <td>{r.phase ? <PhaseBadge phase={r.phase} reason={r.reason} /> : <span class="muted">pending</span>}</td>
                <td class="message">{r.message}</td>
                <td>{r.toolsExecuted === "unset" ? <span class="muted">—</span> : <Tools tools={r.toolsExecuted} />}</td>
                <td>{r.replayRunName ? <a href={runLink(run.namespace, r.replayRunName)}>{r.replayRunName}</a> : "—"}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}

      <h2>Calls</h2>
      {run.calls === null || run.calls === undefined ? (
        <p class="muted">{run.live ? "Published on the run when it settles; the transcript below shows them as they happen." : "No published ledger."}</p>
      ) : run.calls.length === 0 ? (
        <p class="muted">No tool call.</p>
      ) : (
        <table class="calls">
          <thead>
            <tr>
              <th>Attempt</th>
              <th>#</th>
              <th>Tool</th>
              <th>Effect</th>
              <th>Key</th>
              <th>Called at</th>
              <th>Outcome</th>
            </tr>
          </thead>
          <tbody>
            {run.calls.map((c) => (
              <tr key={`${c.attempt}-${c.seq}`}>
                <td class="num">{c.attempt}</td>
                <td class="num">{c.seq}</td>
                <td>{c.tool}</td>
                <td>{c.effect ?? "—"}</td>
                <td class="key" title={c.idempotencyKey}>
                  {(c.idempotencyKey ?? "—").slice(0, 18)}
                </td>
                <td class="time">{when(c.calledAt)}</td>
                <td>{ended(c)}</td>
              </tr>
            ))}
          </tbody>
        </table>
      )}
      {run.callsOmitted ? <p class="muted">… and {run.callsOmitted} more calls (the run store keeps them all)</p> : null}

      <h2>
        Transcript {transcript.following ? <span class="following">following</span> : null}
      </h2>
      {transcript.failed ? <Failed error={transcript.failed.error} status={transcript.failed.status} /> : null}
      <ol class="transcript">
        {transcript.entries.map((e) => (
          <EntryLine key={keyOf(e)} e={e} />
        ))}
      </ol>
      {run.result?.text ? (
        <>
          <h2>Answer</h2>
          <pre class="answer">{run.result.text}</pre>
        </>
      ) : null}
    </Page>
  );
}
