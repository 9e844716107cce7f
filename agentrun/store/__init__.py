"""The run store: the operator's and the store API's (async, SQLAlchemy 2; installed with
agentrun[store]). Nothing here imports ADK: ADK's session tables are read and copied by
column name (adk_tables.py); the ADK memory service is agentrun.store.memory, the store
API's (it needs google-adk).

Postgres (psycopg 3) in clusters, SQLite (aiosqlite, WAL) in the development cluster.
ADK's session tables live in the same database; ours are created by Alembic migrations
that only the operator runs. Every function takes an `AsyncEngine` from `make_engine`.

Engines and schema
    make_engine(url, pool_size=3, max_overflow=2) -> AsyncEngine
    session_service_url(url) -> str          the URL for ADK's DatabaseSessionService
    is_durable(url) -> bool                  False for missing / in-memory SQLite URLs
    await migrate(url)                       Alembic upgrade head; idempotent, concurrent-safe
    await check_schema(engine)               raises StoreNotReady unless at head (runner)

Inputs (content-addressed snapshots)
    await put_input(engine, text, files: dict[name, bytes], key=) -> "hmac-sha256:<hex>"
    await installation_key(engine) -> bytes      the input digests' key, made once
    await get_input(engine, digest) -> Input | None
    await delete_input(engine, digest) -> bool

Agent snapshots (content-addressed, never changed: agentrun.agents)
    await put_agent(engine, snapshot) -> "sha256:<hex>"                    operator, idempotent
    await get_agent(engine, digest) -> dict | None
    await image_refusal(engine, digest) -> str | None   a runner's AgentInvalid of it, latest

Runs and attempts (status: vocabulary.RunStatus)
    await record_run(engine, uid, namespace, name, agent, trigger, user_id, input_digest,
                     replay_of=None, agent_digest=None, labels=None, annotations=None,
                     spec=None)
                     -> bool                                               operator, idempotent
    await start_attempt(engine, uid, attempt, session_id, pod_name)        operator, idempotent
    await record_pod(engine, uid, attempt, pod_uid)      operator: the attempt's pod exists
    await begin_attempt(engine, uid, attempt, app_name, user_id, session_id)     runner
    await record_invocation(engine, uid, attempt, invocation_id)                 runner
    await record_outcome(engine, uid, attempt, status, reason=None, message=None) -> bool
                                                                          runner, first wins
    await get_outcome(engine, uid, attempt) -> Outcome | None
    await settle(engine, uid, attempt, status, reason, message, tools_executed) -> bool
        updates only while pending/running: True means this call settled it
    await settle_counting(engine, uid, attempt, status, reason, message) -> Settled
        settles, then counts the tools in the same transaction: after it, the ledger
        refuses new calls of that attempt (open_call raises AttemptSettled)
    await set_tools_executed(engine, uid, attempt, tools) -> bool         fills NULL only
    await get_run(engine, uid) -> Run | None
    await get_attempt(engine, uid, attempt) -> Attempt | None
    await attempt_identity(engine, uid, attempt) -> (AttemptIdentity, status) | None
                                             store API (agentrun.attempt's identity)
    await ensure_live(engine, uid, attempt)   store API: raises AttemptSettled once settled
    await attempt_usage(engine, uid, attempt) -> AttemptUsage     store API: its quotas

The operator's read and write of a sync (run_state.py)
    await run_state(engine, uid, attempt, previous=, approvals=, published=, usage=)
        -> RunState: the run's row, the attempt's, and as asked the attempt before, its
        approvals, ledger, answer and usage, in one transaction
    await settle_then_state(engine, uid, attempt, status, reason, message, count=, previous=,
                            approvals=, published=, usage=) -> RunState | None: the fence
        (settle, or settle_counting when count) committed, then run_state, on one connection
    await launch_attempt(engine, uid, attempt, session_id, pod_name, namespace=, agent=,
                         user_id=, resumes_attempt=, resumes_run_uid=, record=, snapshot=)
        -> SessionClaim: [input snapshot, run row,] session claim and, when granted, the
        attempt's row, in one transaction
    await record_launch(engine, record, snapshot=None)   the run (and its input) alone
    await warm(engine) -> bool   the statements of an eviction's sync run once, on a run
        written in a transaction rolled back (the first eviction after a start then costs
        what the later ones do)

Tools
    await tools_executed(engine, uid, attempt) -> list[str] | None
        the ledger and the attempt's session function calls, in call order; None = unknown
    await ledger(engine, uid) -> list[LedgerEntry]     by attempt, then call order
    await open_call(..., closes=[CallClose]) -> closed seqs / close_call(...) -> bool
                                                       the runner's write-ahead ledger
        (close_call closes only an open row: a finished one is never rewritten; both
        raise AttemptSettled once the operator settled the attempt)

The archive (every recorded run, its AgentRun in the API server or not; history.py)
    await run_records(engine, namespace | None, fields=[Field], since=, matches=, limit=,
                      after=Keyset) -> Page(records, after)        newest first, keyset pages
    await latest_named(engine, namespace, name) -> Run | None      a name's most recent run

Replays (approved AgentRunReplays; at most one non-forced approval per run, atomically)
    await approve_replay(engine, uid=, namespace=, name=, run_uid=, run_name=, forced=,
                         reason=, message=, replay_run_name=, tools_executed=) -> Claim
        granted, or the other replay's approval that holds the run's one non-forced slot
    await get_replay_approval(engine, replay_uid) -> ReplayApproval | None
    await approval_of_replay_run(engine, namespace, replay_run_name) -> ReplayApproval | None
    await replays_of(engine, run_uid) -> list[ReplayApproval]

Sessions (ADK app names are qualified by namespace: session_app(namespace, agent))
    await claim_session(engine, namespace=, session_id=, agent=, user_id=, run_uid=)
        -> SessionClaim: the first run owns a session for its agent and user; one live
        run at a time
    await fork_session(engine, app_name=, user_id=, source=, target=) -> bool
        a copy of a session to continue (a manual resume), in one transaction

Retention
    await purge_old_events(engine, older_than=90 days, batch=1000) -> int
    await purge_old_runs(engine, older_than, batch=500) -> int     settled records and their rows
        ADK events past retention, in batches; sessions keep their shell
    await purge_expired_memory(engine) -> int           memory entries past their expiry
    await purge(engine, older_than) -> {step: int | Exception}
                                                        the three above, each on its own

Outcome (the final answer and the usage; tool calls are counted from the ledger)
    await record_result(engine, uid, attempt, text, parsed=None) -> bool   first wins
    await get_result(engine, uid) -> Result | None        the latest attempt's answer
    await add_usage(engine, uid, attempt, model, input_tokens, output_tokens, cost|None)
    await run_usage(engine, uid, before_attempt=None) -> Usage     a resume continues
    await usage_changed_since(engine, since) -> set[run uid]

Approvals (a call that waits for a human's decision; decided once)
    await request_approval(engine, uid, attempt, seq, call_id, tool, args, digest, expires)
    await pending_approval(engine, uid, attempt=None) -> Approval | None
    await decide(engine, uid, call_id, decision, approver, note, approval_name) -> bool
    await approvals_of(engine, uid) -> list[Approval]

Transcript (the conversation of a run, for the store API's store.agentrun.dev)
    await transcript_facts(engine, uid) -> TranscriptFacts | None
        its attempts, their session turns' ADK events, ledger, approvals, answer and
        usage in one read; agentrun.transcript.entries_of makes the conversation of them

Memory (agentrun.store.memory, with google-adk) and samples
    StoreMemoryService(engine, ttl_days=90)            an ADK BaseMemoryService
    await record_side_effect(engine, tool, args, run_name, run_uid, attempt)
    await outbox(engine, run_name=None) -> list[OutboxRow]   the sample agents' side effects
"""

from agentrun.effects import args_digest
from agentrun.ledger import LedgerEntry
from agentrun.store.agent_snapshots import get_agent, image_refusal, put_agent
from agentrun.store.approvals import (
    Approval,
    TooManyPending,
    approvals_of,
    decide,
    pending_approval,
    request_approval,
)
from agentrun.store.engine import (
    async_url,
    is_durable,
    make_engine,
    redact,
    session_service_url,
)
from agentrun.store.history import Field, Keyset, Page, latest_named, run_records
from agentrun.store.inputs import (
    Input,
    delete_input,
    get_input,
    input_digest,
    installation_key,
    put_input,
)
from agentrun.store.ledger import (
    AttemptSettled,
    CallClose,
    JournalEntry,
    close_call,
    journal,
    ledger,
    open_call,
    tools_executed,
)
from agentrun.store.migrate import StoreNotReady, check_schema, head_revision, migrate
from agentrun.store.outbox import OutboxRow, outbox, record_side_effect
from agentrun.store.outcome import (
    Result,
    TooManyModels,
    Usage,
    add_usage,
    answer_digest,
    get_result,
    record_result,
    run_usage,
    usage_changed_since,
)
from agentrun.store.replays import (
    Claim,
    ReplayApproval,
    ReplayRace,
    approval_of_replay_run,
    approve_replay,
    get_replay_approval,
    lineage_root,
    release_replay,
    replays_of,
)
from agentrun.store.retention import (
    purge,
    purge_expired_memory,
    purge_old_events,
    purge_old_runs,
)
from agentrun.store.run_state import (
    RunState,
    Snapshot,
    launch_attempt,
    record_launch,
    run_state,
    settle_then_state,
    warm,
)
from agentrun.store.runs import (
    Attempt,
    InvocationRecorded,
    Outcome,
    Run,
    RunNotRecorded,
    Settled,
    attempt_identity,
    begin_attempt,
    close_run,
    ensure_live,
    get_attempt,
    get_outcome,
    get_run,
    record_invocation,
    record_outcome,
    record_pod,
    record_run,
    set_tools_executed,
    settle,
    settle_counting,
    start_attempt,
)
from agentrun.store.sessions import SessionClaim, claim_session, fork_session, session_app
from agentrun.store.transcript import (
    TranscriptSummary,
    transcript_facts,
    transcript_facts_after,
    transcript_summary,
)
from agentrun.store.usage import AttemptUsage, attempt_usage

__all__ = [
    "Approval",
    "Attempt",
    "AttemptSettled",
    "AttemptUsage",
    "CallClose",
    "Claim",
    "Field",
    "Input",
    "InvocationRecorded",
    "JournalEntry",
    "Keyset",
    "LedgerEntry",
    "OutboxRow",
    "Outcome",
    "Page",
    "ReplayApproval",
    "ReplayRace",
    "Result",
    "Run",
    "RunNotRecorded",
    "RunState",
    "SessionClaim",
    "Settled",
    "Snapshot",
    "StoreNotReady",
    "TooManyModels",
    "TooManyPending",
    "TranscriptSummary",
    "Usage",
    "add_usage",
    "answer_digest",
    "approval_of_replay_run",
    "approvals_of",
    "approve_replay",
    "args_digest",
    "async_url",
    "attempt_identity",
    "attempt_usage",
    "begin_attempt",
    "check_schema",
    "claim_session",
    "close_call",
    "close_run",
    "decide",
    "delete_input",
    "ensure_live",
    "fork_session",
    "get_agent",
    "get_attempt",
    "get_input",
    "get_outcome",
    "get_replay_approval",
    "get_result",
    "get_run",
    "head_revision",
    "image_refusal",
    "input_digest",
    "installation_key",
    "is_durable",
    "journal",
    "latest_named",
    "launch_attempt",
    "ledger",
    "lineage_root",
    "make_engine",
    "migrate",
    "open_call",
    "outbox",
    "pending_approval",
    "purge",
    "purge_expired_memory",
    "purge_old_events",
    "purge_old_runs",
    "put_agent",
    "put_input",
    "record_invocation",
    "record_launch",
    "record_outcome",
    "record_pod",
    "record_result",
    "record_run",
    "record_side_effect",
    "redact",
    "release_replay",
    "replays_of",
    "request_approval",
    "run_records",
    "run_state",
    "run_usage",
    "session_app",
    "session_service_url",
    "set_tools_executed",
    "settle",
    "settle_counting",
    "settle_then_state",
    "start_attempt",
    "tools_executed",
    "transcript_facts",
    "transcript_facts_after",
    "transcript_summary",
    "usage_changed_since",
    "warm",
]
