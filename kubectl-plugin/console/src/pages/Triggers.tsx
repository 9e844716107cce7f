import type { Refusals } from "../api";
import { Failed, Page, Refused, usePoll, when } from "../ui";
import { Last, type LastRun, Ready } from "./Schedules";

type Trigger = {
  namespace: string;
  name: string;
  suspend: boolean;
  agent?: string;
  url?: string;
  received: number;
  duplicates: number;
  lastEventTime?: string;
  lastRun: LastRun;
  condition: { type: string; status: string; reason?: string; message?: string } | null;
};

export function Triggers() {
  const found = usePoll<{ available: boolean; said?: string; triggers: Trigger[]; refused: Refusals }>("/api/triggers", 5);
  return (
    <Page title="Triggers">
      {found === null ? (
        <p class="muted">Loading…</p>
      ) : !found.ok ? (
        <Failed error={found.error} status={found.status} />
      ) : !found.data.available ? (
        <p class="muted">{found.data.said}</p>
      ) : (
        <>
          <Refused refused={found.data.refused} />
          {found.data.triggers.length === 0 ? (
            <p class="muted">No triggers you may see.</p>
          ) : (
            <table>
              <thead>
                <tr>
                  <th>Namespace</th>
                  <th>Trigger</th>
                  <th>Agent</th>
                  <th>URL</th>
                  <th>Received / duplicates</th>
                  <th>Last event</th>
                  <th>Last run</th>
                  <th>Next run</th>
                  <th>State</th>
                </tr>
              </thead>
              <tbody>
                {found.data.triggers.map((t) => (
                  <tr key={`${t.namespace}/${t.name}`} data-trigger={`${t.namespace}/${t.name}`}>
                    <td>{t.namespace}</td>
                    <td>{t.name}</td>
                    <td>{t.agent}</td>
                    <td>
                      <code>{t.url ?? "—"}</code>
                    </td>
                    <td class="num">
                      {t.received} / {t.duplicates}
                    </td>
                    <td class="time">{when(t.lastEventTime)}</td>
                    <td>
                      <Last ns={t.namespace} last={t.lastRun} />
                    </td>
                    <td>{t.suspend ? "suspended" : "on its next event"}</td>
                    <td>
                      <Ready condition={t.condition} />
                    </td>
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
