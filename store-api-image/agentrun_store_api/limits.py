"""Every number that bounds what the store API gives one runner, in one place.

Each is far above what a real run needs (the reason is beside it) and far below what would
let one runner slow down the others. Over a limit, the request is refused with a sentence
naming the limit: 413 for a request too large (its body, a memory query, a tool result),
429 for an attempt that has used its share (its rows in the store, its requests at once).
docs/security.md ("Limits of one runner") has the table.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

KiB: Final = 1024
MiB: Final = 1024 * KiB

# -- the database pool ----------------------------------------------------------------------

# The store API's own pool: every request of every runner goes through it, so it is the
# one place where the number of database connections is decided.
POOL_SIZE: Final = 5
POOL_OVERFLOW: Final = 0
# Requests of one attempt served at once: a runner sends one at a time, except a batch of
# parallel tool calls (ADK runs them concurrently) and a ledger close still on its way
# while the next request goes out. Two leave three of the five connections to the others,
# whatever one runner sends; the rest of its requests wait their turn, in order.
IN_FLIGHT_PER_ATTEMPT: Final = 2
# ...and no more than this many wait (a batch of parallel tool calls is a few dozen at
# most); beyond, 429.
WAITING_PER_ATTEMPT: Final = 64

# While other attempts' requests are here too, an attempt whose requests took more than
# FAIR_SHARE of the store API's time lately (decayed by half each SHARE_HALF_LIFE_SECONDS)
# waits up to FAIR_PAUSE_SECONDS before each of them, in its turn, and is then served one
# request at a time: a runner that writes as fast as it can (within its quotas) leaves the
# others the rest. A runner whose model thinks between calls never comes near it.
FAIR_SHARE: Final = 0.5
FAIR_PAUSE_SECONDS: Final = 0.01
SHARE_HALF_LIFE_SECONDS: Final = 1.0
# A request refused because its attempt spent a quota is answered after this pause, in the
# attempt's turn: a runner that keeps asking gets its refusals at most
# IN_FLIGHT_PER_ATTEMPT / OVER_QUOTA_PAUSE_SECONDS a second (200, where it got 1,500 here
# unpaused), so a flood of them costs the other tenants little (bench/store_flood.py: the
# other tenant's p99 1.1x idle while the refusals come, 4.5x unpaused, 2.7x at 5 ms). A
# real run never reaches a quota.
OVER_QUOTA_PAUSE_SECONDS: Final = 0.01

# -- tokens ---------------------------------------------------------------------------------

# A verified token is trusted for this long before TokenReview is asked again (the pod
# read is cached as long): the kubelet refreshes a projected token well before it expires.
TOKEN_CACHE_SECONDS: Final = 30.0
# A refused token is answered from memory for this long: a flood of one bad token costs
# one TokenReview, and a token that becomes good (a pod just created) waits little.
REFUSED_TOKEN_SECONDS: Final = 10.0
# Entries of each cache (tokens, refusals, pods, attempts); past it, the oldest go first.
CACHE_ENTRIES: Final = 10_000
# A projected ServiceAccount token is a JWT of about 1 KiB; anything much longer, or not
# shaped like one, is refused without asking the API server.
TOKEN_BYTES: Final = 16 * KiB
# TokenReviews in flight at once: each holds a thread; more wait.
TOKEN_REVIEWS_IN_FLIGHT: Final = 4

# The agent's final answer: the store keeps it whole (the run's status shows 4 KiB of it),
# and an answer is a message for a human, not a document.
ANSWER_BYTES: Final = 1 * MiB
# The arguments of a call that waits for an approval, JSON.
APPROVAL_ARGS_BYTES: Final = 256 * KiB

# -- request bodies, by route (routes.ROUTES names) -----------------------------------------

# The first event of a run carries its input files inline, base64: up to 16 files of up to
# 1 MiB each (a ConfigMap or Secret holds at most 1 MiB) are 21.4 MiB of base64, plus the
# text and the event around them. The runner's memory write carries the same event.
EVENT_BYTES: Final = 32 * MiB
# One tool result, as journalled on its ledger row: what a tool returns goes to the model
# too, and 1 MiB of it is already a quarter of a million tokens.
RESULT_BYTES: Final = 1 * MiB
# A call's open carries the closes of earlier calls still on their way (one commit where
# there were two): at most this many, each with a result of at most this size (a larger
# one is closed on its own).
CLOSES_PER_OPEN: Final = 8
CARRIED_RESULT_BYTES: Final = 16 * KiB
# ...and the model's turn that made the call, held by the runner for its first open (one
# request where there were two): a turn of a few calls and their arguments; a larger one
# is appended alone.
CARRIED_EVENT_BYTES: Final = 64 * KiB
# A memory query is what the model asks for in a sentence or two.
QUERY_BYTES: Final = 8 * KiB
# ...and at most this many keywords (one LIKE each): stop words are not counted.
QUERY_WORDS: Final = 64

# A refused request's body that has not all arrived (refused by its Content-Length, or
# before its route read it): up to this much of it is read and dropped, so the connection
# serves the runner's next request; past it, the answer says Connection: close and the rest
# is never read. The HTTP server would read it all otherwise, to keep the connection: a
# runner sending 16 MiB bodies where 16 KiB belong had the store API read (and decrypt)
# each one to refuse it, and the other tenants waited behind that (bench/store_flood.py).
DRAIN_BYTES: Final = 256 * KiB
# ...if it comes within this long: a runner that announces a body and stalls is answered,
# and its connection closed, after at most this wait.
DRAIN_SECONDS: Final = 1.0

# Routes with no body (GET, DELETE) take none.
BODY_BYTES: Final[Mapping[str, int]] = {
    "whoami": 0,
    "begin": 4 * KiB,
    "invocation": 4 * KiB,
    # The outcome's message: a sentence, or an error with its traceback's last lines.
    "outcome": 64 * KiB,
    "input": 0,
    "agent": 0,
    # A new session's initial state.
    "create_session": 256 * KiB,
    "list_sessions": 0,
    "get_session": 0,
    "delete_session": 0,
    "append_event": EVENT_BYTES,
    "ledger": 0,
    "journal": 0,
    # Tool name, call id, digest, effect, key: a few hundred bytes; and the closes it
    # carries.
    "open_call": 16 * KiB + CLOSES_PER_OPEN * (CARRIED_RESULT_BYTES + KiB)
    + CARRIED_EVENT_BYTES,
    "close_call": RESULT_BYTES + 64 * KiB,
    "add_memory": EVENT_BYTES,
    # The query JSON-encoded (an escape, \uXXXX, is 6 bytes for a character of 2 or 3).
    "search_memory": 4 * QUERY_BYTES,
    # A sample tool's arguments (an email's body).
    "record_side_effect": 256 * KiB,
    # A model call's usage: a model name and three numbers.
    "usage": 4 * KiB,
    # The agent's final answer, whole, and its parsed object.
    "result": 2 * ANSWER_BYTES + 64 * KiB,
    # A call that waits for an approval, with its arguments (what an approver reads).
    "request_approval": APPROVAL_ARGS_BYTES + 16 * KiB,
}
# The largest of them: aiohttp's own bound, behind ours.
MAX_BODY: Final = max(BODY_BYTES.values())

# -- per attempt ----------------------------------------------------------------------------

# ADK stops an invocation after 500 model calls (RunConfig.max_llm_calls); each call is at
# most two events (the model's turn, the tools' responses), so a run that reaches ADK's own
# cap appends about 1,001. Four times that, for agents that raise ADK's cap.
EVENTS_PER_ATTEMPT: Final = 4_000
# The input event (21.4 MiB at most) plus every tool result (64 MiB at most, below) as the
# function responses repeat them, plus the model's turns.
EVENT_BYTES_PER_ATTEMPT: Final = 128 * MiB
# Ledger rows: a call's seq runs from 1 (the runner numbers them in order), so this bounds
# the rows of an attempt with no counting at all. Two per model call, at ADK's 500.
LEDGER_ROWS_PER_ATTEMPT: Final = 2_000
# Journalled results of one attempt, in all.
RESULT_BYTES_PER_ATTEMPT: Final = 64 * MiB
# Sample outbox rows: one per side effect of a sample tool, so at most one per ledger row.
OUTBOX_ROWS_PER_ATTEMPT: Final = LEDGER_ROWS_PER_ATTEMPT
# Memory: the runner writes its turn's events once, at the end (text only).
MEMORY_ENTRIES_PER_ATTEMPT: Final = EVENTS_PER_ATTEMPT
MEMORY_BYTES_PER_ATTEMPT: Final = 16 * MiB
# Model calls reported: ADK's cap of 500 per invocation, eight times.
MODEL_CALLS_PER_ATTEMPT: Final = 4_000
# Calls of one attempt waiting for a decision at once: a runner stops at the first call that
# needs one (a batch of parallel calls may ask for a few), and each is a row of up to
# APPROVAL_ARGS_BYTES an approver reads.
PENDING_APPROVALS_PER_ATTEMPT: Final = 16
# Distinct model names one run reports usage of (a row per attempt and name): an agent and
# its sub-agents name a model each, and a run of many sub-agents names a few dozen at most.
MODEL_NAMES_PER_RUN: Final = 32
# How long a call may wait for an approval (spec.tools[].approvalTimeoutSeconds): a month.
APPROVAL_SECONDS: Final = 30 * 86400


def shown(size: int) -> str:
    """A byte count as the refusals say it: 16 KiB, 32 MiB, 300 bytes."""
    for unit, name in ((MiB, "MiB"), (KiB, "KiB")):
        if size >= unit:
            value = size / unit
            return f"{value:.0f} {name}" if value == int(value) else f"{value:.1f} {name}"
    return f"{size} bytes"
