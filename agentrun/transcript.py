"""A run's transcript: its conversation as one list of entries, built from what the store
holds (ADK's session events of each attempt, the ledger, the approvals, the answer).

Pure: `entries_of(facts)` decides what each line says and in which state a call is, with no
I/O; the store reads the facts (agentrun.store.transcript) and the store API serves the
result as a Kubernetes object (store.agentrun.dev/v1alpha1 Transcript). The standard
library only at run time.

Which events are an attempt's: those of its session's invocation (a chat session holds
earlier turns, which are other runs'). A resumed attempt continues the invocation of the
attempt it resumes: the events from its runner's start on are its own, as for
`toolsExecuted`. A replay run that resumes a copy of its original's session shows only
what it added; the conversation before is the original's transcript.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from agentrun.ledger import LedgerEntry
from agentrun.vocabulary import (
    TRANSCRIPT_API_VERSION,
    TRANSCRIPT_AUTHOR,
    TRANSCRIPT_KIND,
    ApprovalDecision,
    EntryKind,
    EntryState,
    LedgerOutcome,
    Reason,
    RunStatus,
)

if TYPE_CHECKING:
    from agentrun.store.approvals import Approval
    from agentrun.store.outcome import Result, Usage

# The answer's first words, for the table kubectl prints.
PREVIEW_CHARS = 60


@dataclass(frozen=True)
class AttemptFacts:
    """One attempt as the store recorded it: which session turn it used, and how it ended."""

    attempt: int
    app_name: str | None
    user_id: str | None
    session_id: str | None
    invocation_id: str | None
    resumes_attempt: int | None
    resumes_run_uid: str | None
    runner_started_at: datetime | None
    status: str  # RunStatus
    reason: str | None
    message: str | None
    finished_at: datetime | None

    @property
    def turn(self) -> tuple[str, str, str, str] | None:
        """(app, user, session, invocation): where its events are, once it recorded them."""
        if not (self.app_name and self.user_id and self.session_id and self.invocation_id):
            return None
        return (self.app_name, self.user_id, self.session_id, self.invocation_id)


@dataclass(frozen=True)
class TranscriptFacts:
    """Everything the store knows of a run's conversation."""

    attempts: Sequence[AttemptFacts]
    # The stored ADK events (event_data) of each session turn, in the order they were
    # appended.
    events: Mapping[tuple[str, str, str, str], Sequence[Mapping[str, Any]]]
    ledger: Sequence[LedgerEntry]
    approvals: Sequence[Approval]
    result: Result | None
    usage: Usage


@dataclass(frozen=True)
class Entry:
    """One line of the conversation. `call_id` ties a call to its result and its decision;
    it is not shown (seq is the call's number users know)."""

    attempt: int
    time: datetime
    author: str
    kind: str
    text: str | None = None
    tool: str | None = None
    args: Any = None
    result: Any = None
    seq: int | None = None
    state: str | None = None
    call_id: str | None = field(default=None, compare=False)

    @property
    def key(self) -> tuple[Any, ...]:
        """What names this entry while its state changes (a follower sends it again then)."""
        return (self.attempt, self.kind, self.time, self.call_id, self.author)

    def shown(self) -> dict[str, Any]:
        """The entry as the Transcript's JSON has it (absent fields left out)."""
        out: dict[str, Any] = {"attempt": self.attempt, "time": stamp(self.time),
                               "author": self.author, "kind": self.kind}
        for name in ("text", "tool", "args", "result", "seq", "state"):
            value = getattr(self, name)
            if value is not None:
                out[name] = value
        return out


def stamp(when: datetime) -> str:
    """RFC 3339 in UTC with milliseconds (entries of one second are told apart)."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


def _epoch(value: Any) -> float | None:
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()
    return None


def _when(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, UTC)


def owned_events(facts: TranscriptFacts) -> list[tuple[int, Mapping[str, Any]]]:
    """(attempt, event) for each stored event that belongs to this run, in order.

    An event belongs to the latest attempt of its turn whose runner had started by then;
    one from before the first of them belongs to that first attempt, unless that attempt
    resumes another run's session copy (then it is the original's)."""
    by_turn: dict[tuple[str, str, str, str], list[AttemptFacts]] = {}
    for a in sorted(facts.attempts, key=lambda a: a.attempt):
        if a.turn is not None:
            by_turn.setdefault(a.turn, []).append(a)
    owned: list[tuple[int, Mapping[str, Any]]] = []
    for turn, sharing in by_turn.items():
        for event in facts.events.get(turn, ()):
            at = _epoch(event.get("timestamp")) or 0.0
            owner = None
            for a in sharing:
                began = _epoch(a.runner_started_at)
                if began is None or began <= at:
                    owner = a
            if owner is None and sharing[0].resumes_run_uid is None:
                owner = sharing[0]
            if owner is not None:
                owned.append((owner.attempt, event))
    return owned


def _parts_of(attempt: int, event: Mapping[str, Any]) -> list[Entry]:
    """The entries one stored ADK event says (its text, calls, results, error)."""
    if event.get("partial"):  # a streamed chunk: the whole response follows
        return []
    at = _when(_epoch(event.get("timestamp")) or 0.0)
    author = str(event.get("author") or "")
    entries: list[Entry] = []
    content = event.get("content") or {}
    texts: list[str] = []
    for part in content.get("parts") or []:
        if not isinstance(part, Mapping):
            continue
        if part.get("text") and not part.get("thought"):
            texts.append(str(part["text"]))
        call, response = part.get("function_call"), part.get("function_response")
        if isinstance(call, Mapping) and call.get("name"):
            entries.append(Entry(attempt, at, author, EntryKind.TOOL_CALL,
                                 tool=str(call["name"]), args=call.get("args") or {},
                                 call_id=call.get("id")))
        if isinstance(response, Mapping) and response.get("name"):
            entries.append(Entry(attempt, at, author, EntryKind.TOOL_RESULT,
                                 tool=str(response["name"]), result=response.get("response"),
                                 call_id=response.get("id")))
    if texts:
        kind = EntryKind.INPUT if author == "user" else EntryKind.TEXT
        entries.insert(0, Entry(attempt, at, author, kind, text="".join(texts)))
    if event.get("error_code") or event.get("error_message"):
        entries.append(Entry(attempt, at, author, EntryKind.ERROR,
                             text=str(event.get("error_message") or event.get("error_code")),
                             result={"code": event.get("error_code")}))
    return entries


@dataclass(frozen=True)
class _Call:
    """What the ledger and the approvals say of one call (by its call id)."""

    rows: tuple[LedgerEntry, ...]
    waited: Approval | None

    @property
    def seq(self) -> int | None:
        """Its number where it was first written down: the approval an approver saw, or
        its first ledger row."""
        if self.waited is not None:
            return self.waited.seq
        return self.rows[0].seq if self.rows else None


def call_state(call: _Call, settled: frozenset[int]) -> str | None:
    """The state of a tool call, from all its ledger rows and its approval.

    | the call | state |
    | --- | --- |
    | its approval was denied (or timed out), or a row says denied | denied |
    | a row of an attempt that ran it has its end | finished |
    | its only rows answer it from the journal | answered |
    | a row has no end and its attempt is settled | inDoubt |
    | otherwise (running, waiting, or not on the ledger yet) | none |
    """
    if (call.waited is not None and call.waited.decision == ApprovalDecision.DENY) or any(
            r.outcome == LedgerOutcome.DENIED for r in call.rows):
        return EntryState.DENIED
    ran = [r for r in call.rows if r.outcome != LedgerOutcome.JOURNAL]
    if any(r.finished_at is not None for r in ran):
        return EntryState.FINISHED
    if call.rows and not ran:
        return EntryState.ANSWERED
    if any(r.finished_at is None and r.attempt in settled for r in ran):
        return EntryState.IN_DOUBT
    return None


def result_state(call: _Call, attempt: int) -> str | None:
    """How the result an attempt gave the model came about: run, from the journal, or a
    denial."""
    here = [r for r in call.rows if r.attempt == attempt]
    if any(r.outcome == LedgerOutcome.DENIED for r in here) or (
            call.waited is not None and call.waited.decision == ApprovalDecision.DENY):
        return EntryState.DENIED
    if any(r.outcome == LedgerOutcome.JOURNAL for r in here):
        return EntryState.ANSWERED
    if any(r.finished_at is not None for r in here):
        return EntryState.FINISHED
    return None


def _approval_entries(waited: Approval) -> list[Entry]:
    """A held call: when it was asked for (and until when it waits), and its decision."""
    try:
        args = json.loads(waited.args)
    except ValueError:
        args = waited.args
    entries = [Entry(waited.attempt, waited.requested_at, TRANSCRIPT_AUTHOR,
                     EntryKind.APPROVAL, tool=waited.tool, args=args, seq=waited.seq,
                     result={"expiresAt": stamp(waited.expires_at)}, call_id=waited.call_id)]
    if waited.decision is not None and waited.decided_at is not None:
        said: dict[str, Any] = {"decision": waited.decision}
        if waited.note:
            said["note"] = waited.note
        entries.append(Entry(
            waited.attempt, waited.decided_at, waited.approver or "", EntryKind.APPROVAL,
            tool=waited.tool, seq=waited.seq, result=said,
            state=EntryState.DENIED if waited.decision == ApprovalDecision.DENY else None,
            call_id=waited.call_id))
    return entries


# Attempts that end on purpose, saying so elsewhere in the transcript: a held call has its
# approval entry.
_NOT_AN_ERROR = frozenset({Reason.AWAITING_APPROVAL})


def _attempt_error(a: AttemptFacts) -> Entry | None:
    if a.status not in (RunStatus.FAILED, RunStatus.CANCELLED) or a.reason in _NOT_AN_ERROR:
        return None
    if a.finished_at is None:
        return None
    return Entry(a.attempt, a.finished_at, TRANSCRIPT_AUTHOR, EntryKind.ERROR,
                 text=a.message or a.reason or a.status, result={"reason": a.reason})


def entries_of(facts: TranscriptFacts) -> list[Entry]:
    """The conversation of a run, attempt by attempt, each attempt's lines in time order:
    the input, the model's text, each tool call (with its state) and result, each held
    call and its decision, and how a failed attempt ended."""
    settled = frozenset(a.attempt for a in facts.attempts if a.status in RunStatus.TERMINAL)
    rows: dict[str, list[LedgerEntry]] = {}
    for r in facts.ledger:
        if r.call_id:
            rows.setdefault(r.call_id, []).append(r)
    waited = {w.call_id: w for w in facts.approvals}
    calls = {cid: _Call(tuple(sorted(rows.get(cid, ()), key=lambda r: (r.attempt, r.seq))),
                        waited.get(cid))
             for cid in {*rows, *waited}}
    found: list[Entry] = []
    for attempt, event in owned_events(facts):
        for entry in _parts_of(attempt, event):
            call = calls.get(entry.call_id or "")
            if call is not None and entry.kind == EntryKind.TOOL_CALL:
                entry = _with(entry, seq=call.seq, state=call_state(call, settled))
            elif call is not None and entry.kind == EntryKind.TOOL_RESULT:
                entry = _with(entry, seq=call.seq, state=result_state(call, attempt))
            found.append(entry)
    for w in facts.approvals:
        found.extend(_approval_entries(w))
    for a in facts.attempts:
        error = _attempt_error(a)
        if error is not None:
            found.append(error)
    order = {id(e): i for i, e in enumerate(found)}
    return sorted(found, key=lambda e: (e.attempt, e.time, order[id(e)]))


def _with(entry: Entry, **changes: Any) -> Entry:
    from dataclasses import replace

    return replace(entry, **changes)


def usage_shown(usage: Usage) -> dict[str, Any]:
    """`usage` as status.usage shows it (costMicroUSD absent when a model had no price)."""
    shown: dict[str, Any] = {"modelCalls": usage.model_calls, "toolCalls": usage.tool_calls,
                             "inputTokens": usage.input_tokens,
                             "outputTokens": usage.output_tokens}
    if usage.cost_micro_usd is not None:
        shown["costMicroUSD"] = usage.cost_micro_usd
    return shown


def result_shown(result: Result) -> dict[str, Any]:
    """The whole answer (status.result has its first 4,096 bytes)."""
    shown: dict[str, Any] = {"text": result.text, "digest": result.digest,
                             "attempt": result.attempt}
    if result.json is not None:
        shown["json"] = result.json
    return shown


def transcript(run: Mapping[str, Any], facts: TranscriptFacts | None,
               entries: Iterable[Entry] | None = None) -> dict[str, Any]:
    """The Transcript object of AgentRun `run` (facts None: the store has no record of it
    yet; its conversation is empty)."""
    meta = run.get("metadata") or {}
    shown: dict[str, Any] = {
        "apiVersion": TRANSCRIPT_API_VERSION, "kind": TRANSCRIPT_KIND,
        "metadata": {k: meta[k] for k in ("name", "namespace", "creationTimestamp", "labels")
                     if meta.get(k)},
        "run": {"name": meta.get("name"), "uid": meta.get("uid"),
                "phase": (run.get("status") or {}).get("phase") or "Pending"},
    }
    if facts is None:
        shown["entries"] = []
        return shown
    if facts.result is not None:
        shown["result"] = result_shown(facts.result)
    shown["usage"] = usage_shown(facts.usage)
    listed = entries_of(facts) if entries is None else entries
    shown["entries"] = [e.shown() for e in listed]
    return shown


def summary(run: Mapping[str, Any], found: Any) -> dict[str, Any]:
    """A Transcript as a list shows it (`found`, a store.TranscriptSummary, or None: no
    record yet): the run, its usage and its answer's first words, no entries."""
    shown = transcript(run, None)
    del shown["entries"]
    if found is None:
        return shown
    if found.answer is not None:
        shown["result"] = {"preview": preview(found.answer), "attempt": found.answer_attempt}
    shown["usage"] = usage_shown(found.usage)
    return shown


def preview(text: str) -> str:
    """An answer's first words on one line."""
    line = " ".join(text.split())
    if len(line) <= PREVIEW_CHARS:
        return line
    return (line[:PREVIEW_CHARS].rsplit(" ", 1)[0] or line[:PREVIEW_CHARS]) + "…"


@dataclass
class Follower:
    """What a follower has sent: each entry is sent when it first appears and again when
    its state changes (a call that finishes, or is found in doubt when its attempt ends)."""

    sent: dict[tuple[Any, ...], dict[str, Any]] = field(default_factory=dict)

    def news(self, entries: Iterable[Entry]) -> list[dict[str, Any]]:
        """The entries to send now, in the transcript's order."""
        out = []
        for entry in entries:
            shown = entry.shown()
            if self.sent.get(entry.key) != shown:
                self.sent[entry.key] = shown
                out.append(shown)
        return out
