// The console's own JSON API (kubectl-plugin/agentrun_kubectl/console/server.py). Every
// answer is the API server's or the operator's, passed on: a refusal carries their words.

export type Answer<T> = { ok: true; data: T } | { ok: false; status: number; error: string };

async function answer<T>(response: Response): Promise<Answer<T>> {
  let body: unknown = null;
  try {
    body = await response.json();
  } catch {
    body = null;
  }
  if (response.ok) return { ok: true, data: body as T };
  const said = (body as { error?: string } | null)?.error;
  return { ok: false, status: response.status, error: said ?? `${response.status} ${response.statusText}` };
}

export async function get<T>(path: string): Promise<Answer<T>> {
  try {
    return await answer<T>(await fetch(path, { credentials: "same-origin" }));
  } catch (e) {
    return { ok: false, status: 0, error: `the console cannot be reached (${String(e)})` };
  }
}

// State-changing requests: same origin (the browser sends Origin), the cookie, JSON.
export async function post<T>(path: string, body: object): Promise<Answer<T>> {
  try {
    return await answer<T>(
      await fetch(path, {
        method: "POST",
        credentials: "same-origin",
        headers: { "Content-Type": "application/json" },
        body: JSON.stringify(body),
      }),
    );
  } catch (e) {
    return { ok: false, status: 0, error: `the console cannot be reached (${String(e)})` };
  }
}

export type Queue = { queue: string | null; admitted: string | null; reason: string | null; message: string | null };

export type Pending = {
  attempt: number;
  seq: number;
  tool: string;
  argsDigest: string;
  args?: string;
  argsTruncated?: boolean;
  requestedAt?: string;
  expiresAt?: string;
};

export type Usage = {
  modelCalls?: number;
  toolCalls?: number;
  inputTokens?: number;
  outputTokens?: number;
  costMicroUSD?: number;
};

export type RunRow = {
  namespace: string;
  name: string;
  uid?: string;
  agent?: string;
  phase: string;
  reason?: string;
  message?: string;
  toolsExecuted: string[] | null;
  attempts: number;
  costMicroUSD?: number | null;
  usage?: Usage | null;
  live: boolean;
  queue: Queue | null;
  created?: string;
  createdBy?: string;
  replayOf?: string;
  pendingApproval?: Pending | null;
};

export type Call = {
  attempt: number;
  seq: number;
  tool: string;
  effect?: string;
  idempotencyKey?: string;
  calledAt?: string;
  endedAt?: string;
  outcome?: string;
};

export type Replay = {
  name: string;
  created?: string;
  resume: boolean;
  note?: string;
  forced: boolean;
  phase?: string;
  reason?: string;
  message?: string;
  toolsExecuted: string[] | null | "unset";
  replayRunName?: string;
  decidedAt?: string;
  said?: string;
};

export type Condition = { type: string; status: string; reason?: string; message?: string };

export type RunPage = RunRow & {
  spec: { agent?: string; input?: { text?: string }; model?: string };
  conditions: Condition[];
  result?: { text?: string; truncated?: boolean } | null;
  calls?: Call[] | null;
  callsOmitted?: number | null;
  replays: Replay[];
  replaysRefused?: string | null;
};

export type Entry = {
  attempt?: number;
  time?: string;
  author?: string;
  kind: string;
  tool?: string;
  args?: unknown;
  result?: unknown;
  text?: string;
  seq?: number;
  state?: string;
};

export type Transcript = {
  run?: { name?: string; phase?: string };
  result?: { text?: string } | null;
  usage?: Usage;
  entries?: Entry[];
};

export type Refusals = Record<string, string>;

export type Said = { said: string; phase?: string; reason?: string; message?: string };
