"""The run store's tables (ours; ADK's sessions/events tables live beside them).

Every timestamp is UTC. `tools_executed` columns are nullable JSON where SQL NULL means
"unknown" and `[]` means "checked: none" — the difference is the whole safety model.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Table,
    Text,
    UniqueConstraint,
)
from sqlalchemy.types import TypeDecorator

from agentrun.vocabulary import RunStatus


class UTCDateTime(TypeDecorator[datetime]):
    """A timestamp stored in UTC and always read back timezone-aware (SQLite forgets)."""

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            value = value.replace(tzinfo=UTC)
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Any) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=UTC)
        return value.astimezone(UTC)


# SQL NULL for None (unknown), JSON for lists including [] (known: none).
NullableJSON = JSON(none_as_null=True)
# An autoincrementing key that is BIGINT on Postgres and INTEGER (rowid) on SQLite.
AutoId = BigInteger().with_variant(Integer(), "sqlite")

metadata = MetaData(
    naming_convention={
        "ix": "ix_%(table_name)s_%(column_0_N_name)s",
        "uq": "uq_%(table_name)s_%(column_0_N_name)s",
        "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
        "pk": "pk_%(table_name)s",
    }
)

runs = Table(
    "runs",
    metadata,
    Column("uid", String(64), primary_key=True),
    Column("namespace", String(253), nullable=False),
    Column("name", String(253), nullable=False),
    Column("agent", String(253), nullable=False),
    Column("trigger", String(32), nullable=False),
    Column("user_id", String(253), nullable=False),
    Column("input_digest", String(80)),
    # The Agent snapshot the run pinned at launch (agent_snapshots); NULL: an image agent.
    Column("agent_digest", String(80)),
    Column("replay_of", String(253)),
    Column("status", String(16), nullable=False, default=RunStatus.PENDING),
    Column("reason", String(64)),
    Column("message", Text),
    Column("attempts", Integer, nullable=False, default=0),
    Column("tools_executed", NullableJSON),
    Column("created_at", UTCDateTime, nullable=False),
    Column("started_at", UTCDateTime),
    Column("finished_at", UTCDateTime),
    Column("updated_at", UTCDateTime, nullable=False),
    # The AgentRun's spec, labels and annotations at launch: the archive shows them, and a
    # replay of a run no longer in the API server runs this spec again on the input
    # snapshot input_digest names (history.py).
    Column("spec", NullableJSON),
    Column("labels", NullableJSON),
    Column("annotations", NullableJSON),
    Index(None, "namespace", "name"),
    # The archive pages newest first, in a namespace or across them.
    Index(None, "namespace", "created_at", "uid"),
    Index(None, "created_at", "uid"),
)

# One row per attempt. No foreign key to runs: a runner started by hand in development
# records its attempt even when no operator wrote the run.
attempts = Table(
    "attempts",
    metadata,
    Column("run_uid", String(64), primary_key=True),
    Column("attempt", Integer, primary_key=True),
    Column("pod_name", String(253)),
    # Set once the pod was created (None: not created yet, as far as the store knows).
    Column("pod_uid", String(64)),
    # The earlier attempt whose session (and invocation) this one resumes, if it does: of
    # this run, or of `resumes_run_uid` (a replay run resuming a fork of its original).
    Column("resumes_attempt", Integer),
    Column("resumes_run_uid", String(64)),
    # The ADK session this attempt used, and the invocation of its turn: only events of
    # that invocation belong to this attempt (a chat session holds earlier turns).
    Column("app_name", String(253)),
    Column("user_id", String(253)),
    Column("session_id", String(253)),
    Column("invocation_id", String(253)),
    # Settled by the operator (first writer wins, see settle()).
    Column("status", String(16), nullable=False, default=RunStatus.PENDING),
    Column("reason", String(64)),
    Column("message", Text),
    Column("tools_executed", NullableJSON),
    # Written by the runner when it finishes on its own.
    Column("outcome_status", String(16)),
    Column("outcome_reason", String(64)),
    Column("outcome_message", Text),
    Column("outcome_at", UTCDateTime),
    Column("started_at", UTCDateTime),
    Column("runner_started_at", UTCDateTime),
    Column("finished_at", UTCDateTime),
)

# The write-ahead ledger: a row is committed BEFORE its tool runs.
tool_calls = Table(
    "tool_calls",
    metadata,
    Column("id", AutoId, primary_key=True, autoincrement=True),
    Column("run_uid", String(64), nullable=False),
    Column("attempt", Integer, nullable=False),
    Column("seq", Integer, nullable=False),
    Column("tool", String(255), nullable=False),
    Column("call_id", String(255)),
    Column("args_digest", String(80), nullable=False),
    Column("started_at", UTCDateTime, nullable=False),
    Column("finished_at", UTCDateTime),
    Column("outcome", String(16)),
    # The journal: the tool's effect class and the call's idempotency key (agentrun.effects),
    # and, once it finished, its result.
    Column("effect", String(16)),
    Column("idempotency_key", String(80)),
    Column("result", NullableJSON),
    UniqueConstraint("run_uid", "attempt", "seq"),
)

# Content-addressed input snapshots: the digest covers the text and every file.
inputs = Table(
    "inputs",
    metadata,
    Column("digest", String(80), primary_key=True),
    Column("text", Text, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
)

input_files = Table(
    "input_files",
    metadata,
    Column(
        "digest",
        String(80),
        ForeignKey("inputs.digest", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("name", String(255), primary_key=True),
    Column("content", LargeBinary, nullable=False),
    Column("size", BigInteger, nullable=False),
)

# Content-addressed Agent snapshots (agentrun.agents): an Agent with the Agents it names,
# resolved at a run's launch. No Secret value is ever in one (headers name their Secret).
agent_snapshots = Table(
    "agent_snapshots",
    metadata,
    Column("digest", String(80), primary_key=True),
    Column("root", String(253), nullable=False),
    Column("snapshot", JSON, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
)

# Long-term memory, scoped per (agent, user).
memory = Table(
    "memory",
    metadata,
    Column("id", String(64), primary_key=True),
    Column("agent", String(253), nullable=False),
    Column("user_id", String(253), nullable=False),
    Column("session_id", String(253)),
    Column("author", String(253)),
    Column("text", Text, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    Column("expires_at", UTCDateTime, nullable=False),
    Index(None, "agent", "user_id", "expires_at"),
)

# The sample agents' side effects, so that anyone can count what was really sent.
sample_outbox = Table(
    "sample_outbox",
    metadata,
    Column("id", AutoId, primary_key=True, autoincrement=True),
    Column("run_name", String(253)),
    Column("run_uid", String(64)),
    Column("attempt", Integer),
    Column("tool", String(255), nullable=False),
    Column("args", JSON, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
    # An Idempotent tool's key: the same call made again is the same row.
    Column("idempotency_key", String(80), unique=True),
    Index(None, "run_name"),
)

# Approved replays (AgentRunReplay decisions that created a run), forced ones included.
# `unforced_run_uid` is the original's uid on a non-forced approval and NULL on a forced one:
# its unique constraint is what makes "at most one non-forced replay per run" atomic across
# concurrent handlers and operator replicas (NULLs never collide).
replays = Table(
    "replays",
    metadata,
    Column("uid", String(64), primary_key=True),
    Column("namespace", String(253), nullable=False),
    Column("name", String(253), nullable=False),
    Column("run_uid", String(64), nullable=False),
    Column("run_name", String(253), nullable=False),
    Column("forced", Boolean, nullable=False),
    # A resume (spec.resume): the replay run continues a fork of the original's session.
    Column("resume", Boolean, nullable=False, default=False),
    Column("unforced_run_uid", String(64), unique=True),
    Column("reason", String(64), nullable=False),
    Column("message", Text, nullable=False),
    Column("replay_run_name", String(253), nullable=False),
    Column("tools_executed", NullableJSON),
    Column("decided_at", UTCDateTime, nullable=False),
    Index(None, "run_uid"),
    # A replay run finds its approval (and so the original's input snapshot) by name.
    Index(None, "namespace", "replay_run_name"),
)

# Who may use an ADK session. Sessions are named by the namespace and the session id: the
# first run to use one owns it for its (agent, user); chat turns of the same namespace,
# agent and user continue it, anyone else is refused. `holder_run_uid` is the run using
# it now: a second live run on one session is refused (SessionBusy) instead of being left
# to ADK's stale-session error halfway through a turn.
session_owners = Table(
    "session_owners",
    metadata,
    Column("namespace", String(253), primary_key=True),
    Column("session_id", String(253), primary_key=True),
    Column("agent", String(253), nullable=False),
    Column("user_id", String(253), nullable=False),
    Column("owner_run_uid", String(64), nullable=False),
    Column("holder_run_uid", String(64)),
    Column("updated_at", UTCDateTime, nullable=False),
)

# The final answer of an attempt, whole (a run's status shows its first 4,096 bytes).
results = Table(
    "results",
    metadata,
    Column("run_uid", String(64), primary_key=True),
    Column("attempt", Integer, primary_key=True),
    Column("text", Text, nullable=False),
    # The parsed object, when the agent declares an output schema and the text is JSON.
    Column("json", NullableJSON),
    Column("digest", String(80), nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
)

# What an attempt's model calls used, per model, from the model's own usage report.
# `priced` turns false for good once a call of that model had no known price: its cost is
# then unknown, never a partial sum shown as the whole.
usage = Table(
    "usage",
    metadata,
    Column("run_uid", String(64), primary_key=True),
    Column("attempt", Integer, primary_key=True),
    Column("model", String(256), primary_key=True),
    Column("model_calls", Integer, nullable=False),
    Column("input_tokens", BigInteger, nullable=False),
    Column("output_tokens", BigInteger, nullable=False),
    Column("cost_micro_usd", BigInteger, nullable=False),
    Column("priced", Boolean, nullable=False),
    Column("updated_at", UTCDateTime, nullable=False),
    Index(None, "updated_at"),
)

# Tool calls that wait for a human's decision before they run (spec.tools[].approval, the
# agent's require_confirmation): written by the runner when the model asks for such a call,
# never started; decided once (first valid AgentRunApproval, or the timeout). The whole
# arguments are kept here (the ledger keeps only their digest): an approver must see them.
approvals = Table(
    "approvals",
    metadata,
    Column("run_uid", String(64), primary_key=True),
    Column("call_id", String(255), primary_key=True),
    Column("attempt", Integer, nullable=False),
    Column("seq", Integer, nullable=False),
    Column("tool", String(255), nullable=False),
    Column("args", Text, nullable=False),
    Column("args_digest", String(80), nullable=False),
    Column("requested_at", UTCDateTime, nullable=False),
    Column("expires_at", UTCDateTime, nullable=False),
    # Decision.APPROVE | Decision.DENY; NULL while pending.
    Column("decision", String(16)),
    Column("approver", String(253)),
    Column("note", Text),
    Column("decided_at", UTCDateTime),
    # The AgentRunApproval that decided (namespace-local name); NULL for the timeout.
    Column("approval_name", String(253)),
    Index(None, "expires_at"),
)

# Secrets of this installation the store makes once and keeps (store.installation_key).
installation = Table(
    "installation",
    metadata,
    Column("name", String(64), primary_key=True),
    Column("value", LargeBinary, nullable=False),
    Column("created_at", UTCDateTime, nullable=False),
)

OUR_TABLES = frozenset(t.name for t in metadata.sorted_tables)
