import { useState } from "preact/hooks";
import { type Answer, type Refusals, type RunRow, type Said as SaidT, post } from "../api";
import { Failed, Page, Refused, Said, runLink, usePoll, when } from "../ui";

type Waiting = RunRow & { args?: Record<string, unknown>; argsError?: string };

function Decide({ row }: { row: Waiting }) {
  const [note, setNote] = useState("");
  const [busy, setBusy] = useState(false);
  const [answer, setAnswer] = useState<Answer<SaidT> | null>(null);
  const call = row.pendingApproval!;
  const decide = async (action: "approve" | "deny") => {
    setBusy(true);
    setAnswer(null);
    const path = `/api/runs/${encodeURIComponent(row.namespace)}/${encodeURIComponent(row.name)}/${action}`;
    // The call and the digest of the arguments shown: nothing else is decided.
    setAnswer(await post<SaidT>(path, { note, seq: call.seq, argsDigest: call.argsDigest }));
    setBusy(false);
  };
  const unseen = row.args === undefined;
  return (
    <div class="decide">
      <input
        type="text"
        placeholder="note (a denial's note is what the model is told)"
        value={note}
        onInput={(e) => setNote((e.target as HTMLInputElement).value)}
        aria-label="note"
      />
      <button disabled={busy || unseen} onClick={() => decide("approve")} title={unseen ? "nothing is approved unseen" : ""}>
        Approve
      </button>
      <button disabled={busy || unseen} class="danger" onClick={() => decide("deny")}>
        Deny
      </button>
      <Said answer={answer} />
    </div>
  );
}

export function Approvals() {
  const found = usePoll<{ pending: Waiting[]; refused: Refusals }>("/api/approvals", 3);
  return (
    <Page title="Approvals">
      {found === null ? (
        <p class="muted">Loading…</p>
      ) : !found.ok ? (
        <Failed error={found.error} status={found.status} />
      ) : (
        <>
          <Refused refused={found.data.refused} />
          {found.data.pending.length === 0 ? <p class="muted">No call waits for a decision you may see.</p> : null}
          {found.data.pending.map((row) => {
            const call = row.pendingApproval!;
            const shown = row.args === undefined ? "" : JSON.stringify(row.args, null, 2);
            return (
              <article class="approval" key={`${row.namespace}/${row.name}/${call.seq}`} data-run={`${row.namespace}/${row.name}`}>
                <h2>
                  <a href={runLink(row.namespace, row.name)}>
                    {row.namespace}/{row.name}
                  </a>{" "}
                  calls <b>{call.tool}</b> (call {call.seq}, attempt {call.attempt})
                </h2>
                <p class="muted">
                  Asked {when(call.requestedAt)}, until {when(call.expiresAt)}
                  {row.createdBy ? ` · run created by ${row.createdBy}` : ""} · agent {row.agent}
                </p>
                {row.argsError ? (
                  <Failed error={row.argsError} />
                ) : (
                  <>
                    <p class="muted">
                      Arguments, whole ({new TextEncoder().encode(shown).length.toLocaleString("en")} bytes as shown), digest{" "}
                      <code>{call.argsDigest}</code>:
                    </p>
                    <pre class="args">{shown}</pre>
                  </>
                )}
                <Decide row={row} />
              </article>
            );
          })}
        </>
      )}
    </Page>
  );
}
