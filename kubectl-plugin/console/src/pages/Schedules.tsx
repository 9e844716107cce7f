import type { Refusals } from "../api";
import { Failed, Page, PhaseBadge, Refused, runLink, usePoll, when } from "../ui";

export type LastRun = { name: string; phase: string; created?: string } | null;
type Condition = { type: string; status: string; reason?: string; message?: string } | null;

type Schedule = {
  namespace: string;
  name: string;
  schedule: string;
  timeZone: string;
  suspend: boolean;
  agent?: string;
  concurrencyPolicy?: string;
  lastScheduleTime?: string;
  next?: string;
  active: string[];
  skipped: number;
  missed: number;
  lastRun: LastRun;
  condition: Condition;
};

export function Last({ ns, last }: { ns: string; last: LastRun }) {
  if (last === null) return <span class="muted">none yet</span>;
  return (
    <>
      <a href={runLink(ns, last.name)}>{last.name}</a> <PhaseBadge phase={last.phase} />
    </>
  );
}

export function Ready({ condition }: { condition: Condition }) {
  if (condition === null) return <span class="muted">—</span>;
  const ok = condition.type === "Ready" && condition.status === "True";
  return (
    <span class={ok ? "ok" : "unknown"} title={condition.message}>
      {condition.type} {condition.status}
      {condition.reason ? ` (${condition.reason})` : ""}
    </span>
  );
}

export function Schedules() {
  const found = usePoll<{ schedules: Schedule[]; refused: Refusals }>("/api/schedules", 5);
  return (
    <Page title="Schedules">
      {found === null ? (
        <p class="muted">Loading…</p>
      ) : !found.ok ? (
        <Failed error={found.error} status={found.status} />
      ) : (
        <>
          <Refused refused={found.data.refused} />
          {found.data.schedules.length === 0 ? (
            <p class="muted">No schedules you may see.</p>
          ) : (
            <table>
              <thead>
                <tr>
                  <th>Namespace</th>
                  <th>Schedule</th>
                  <th>When</th>
                  <th>Agent</th>
                  <th>Last run</th>
                  <th>Next run</th>
                  <th>Skipped / missed</th>
                  <th>State</th>
                </tr>
              </thead>
              <tbody>
                {found.data.schedules.map((s) => (
                  <tr key={`${s.namespace}/${s.name}`} data-schedule={`${s.namespace}/${s.name}`}>
                    <td>{s.namespace}</td>
                    <td>{s.name}</td>
                    <td>
                      <code>{s.schedule}</code> {s.timeZone}
                    </td>
                    <td>{s.agent}</td>
                    <td>
                      <Last ns={s.namespace} last={s.lastRun} />
                    </td>
                    <td class="time">{s.suspend ? "suspended" : when(s.next)}</td>
                    <td class="num">
                      {s.skipped} / {s.missed}
                    </td>
                    <td>
                      <Ready condition={s.condition} />
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
