import type { ComponentChildren } from "preact";
import { useEffect, useState } from "preact/hooks";
import { type Answer, get } from "./api";

// Reads `path` now and again every `seconds` (after each answer, never two at once)
// while the page shows it; `key` changes read it again at once.
export function usePoll<T>(path: string, seconds: number, key: unknown = null): Answer<T> | null {
  const [found, setFound] = useState<Answer<T> | null>(null);
  useEffect(() => {
    let stopped = false;
    let timer: number | undefined;
    const read = async () => {
      const answer = await get<T>(path);
      if (stopped) return;
      setFound(answer);
      if (seconds > 0) timer = window.setTimeout(read, seconds * 1000);
    };
    read();
    return () => {
      stopped = true;
      window.clearTimeout(timer);
    };
  }, [path, seconds, key]);
  return found;
}

export function PhaseBadge({ phase, reason }: { phase: string; reason?: string | null }) {
  return (
    <span class={`phase phase-${phase.toLowerCase()}`} title={reason ?? undefined}>
      {phase}
      {reason ? <span class="reason"> · {reason}</span> : null}
    </span>
  );
}

export function Tools({ tools }: { tools: string[] | null | undefined }) {
  if (tools === undefined) return <span class="muted">—</span>;
  if (tools === null) return <span class="unknown" title="could not be checked">unknown</span>;
  if (tools.length === 0) return <span class="muted">none</span>;
  return <span class="tools">{tools.join(", ")}</span>;
}

export function usd(micro: number | null | undefined): string {
  if (micro === null || micro === undefined) return "—";
  return `$${(micro / 1_000_000).toFixed(micro < 10_000 ? 4 : 2)}`;
}

export function when(stamp: string | null | undefined): string {
  if (!stamp) return "—";
  const at = new Date(stamp);
  if (Number.isNaN(at.getTime())) return stamp;
  return at.toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
}

export function Refused({ refused }: { refused: Record<string, string> | undefined }) {
  const namespaces = Object.keys(refused ?? {});
  if (namespaces.length === 0) return null;
  return (
    <details class="refused">
      <summary>
        Not shown: {namespaces.length} namespace{namespaces.length === 1 ? "" : "s"} you may not
        list ({namespaces.join(", ")})
      </summary>
      <ul>
        {namespaces.map((ns) => (
          <li key={ns}>
            <b>{ns}</b>: {refused![ns]}
          </li>
        ))}
      </ul>
    </details>
  );
}

export function Failed({ error, status }: { error: string; status?: number }) {
  return (
    <p class="error" role="alert">
      {status ? <b>{status}: </b> : null}
      {error}
    </p>
  );
}

// What an action got back: the API server's or the operator's own words.
export function Said({ answer }: { answer: Answer<{ said: string }> | null }) {
  if (answer === null) return null;
  if (!answer.ok)
    return (
      <p class="said refusal" role="alert">
        {answer.error}
      </p>
    );
  return (
    <p class="said" role="status">
      {answer.data.said}
    </p>
  );
}

export function Page({ title, children }: { title: string; children: ComponentChildren }) {
  useEffect(() => {
    document.title = `${title} · agentrun`;
  }, [title]);
  return (
    <section>
      <h1>{title}</h1>
      {children}
    </section>
  );
}

export function runLink(ns: string, name: string): string {
  return `/runs/${encodeURIComponent(ns)}/${encodeURIComponent(name)}`;
}
