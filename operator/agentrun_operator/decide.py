"""May this replay go ahead? One pure decision, the table of docs/api.md ("Decision rules").

`decide(run_name, original, already_replayed_by, forced)` takes the facts the handler
gathered (the original AgentRun's phase and toolsExecuted, whether its input snapshot is
still in the store, which non-forced replay already holds the approval of this run) and
returns the decision. No I/O happens here; tests/operator/test_decide.py holds the table, one
row per row of api.md's table and one per force combination.

The rows are tried in the API's order, first match wins. The first three refusals hold
even when forced (a replay never runs beside a live original, nor on partial input); the
other refusals give way to the force annotation.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrun import effects
from agentrun.vocabulary import (
    ANNOTATION_CANCEL,
    ANNOTATION_FORCE_REPLAY,
    Phase,
    ReplayPhase,
    ReplayReason,
)

FORCE_HINT = f"Annotate {ANNOTATION_FORCE_REPLAY}=true to run it again anyway."


@dataclass(frozen=True)
class Original:
    """The facts about the run to replay, as the handler found them."""

    phase: str  # Phase.*; "" when the run has no status yet (it is about to start)
    tools_executed: Sequence[str] | None  # None: unknown; []: checked, none
    input_digest: str | None  # its snapshot's digest (None: never snapshotted)
    input_available: bool  # that snapshot is still in the run store
    reason: str = ""  # its status.reason, for the messages


@dataclass(frozen=True)
class Decision:
    """phase (ReplayPhase), reason (ReplayReason) and one actionable sentence."""

    phase: str
    reason: str
    message: str

    @property
    def approved(self) -> bool:
        return self.phase == ReplayPhase.APPROVED

    @property
    def forced(self) -> bool:
        return self.reason == ReplayReason.FORCED


def is_forced(annotations: Mapping[str, str] | None) -> bool:
    """The force annotation says "true" (the admission policy decides who may write it)."""
    value = (annotations or {}).get(ANNOTATION_FORCE_REPLAY, "")
    return value.strip().lower() == "true"


def replay_decided(replay: Mapping[str, Any]) -> bool:
    """A replay with nothing left to decide: Approved with its run created, or Refused and
    not forced since (a forced refusal is decided again; a run that could not be created
    is not retried)."""
    status = replay.get("status") or {}
    if status.get("phase") == ReplayPhase.APPROVED and status.get("replayRunName"):
        return True
    forced = is_forced((replay.get("metadata") or {}).get("annotations"))
    return status.get("phase") == ReplayPhase.REFUSED and (
        not forced or status.get("reason") == ReplayReason.RUN_CREATION_FAILED)


def cancel_requested(annotations: Mapping[str, str] | None) -> bool:
    """The cancel-in-place annotation says "true" (whoever may patch the run may add it)."""
    value = (annotations or {}).get(ANNOTATION_CANCEL, "")
    return value.strip().lower() == "true"


def _tools(tools: Sequence[str]) -> str:
    return ", ".join(tools)


def _ended(original: Original) -> str:
    return "being cancelled" if original.phase == Phase.CANCELLED else "failing"


def match_never_forcible(run_name: str, original: Original | None,
                         unauthorized: str | None = None) -> Decision | None:
    """The refusals force cannot override: no run, a requester who may not use what the
    replay run would, a live run, a lost input snapshot."""
    if original is None:
        return Decision(ReplayPhase.REFUSED, ReplayReason.RUN_NOT_FOUND,
                        f"AgentRun {run_name} does not exist in this namespace: check "
                        "spec.runName, then create a new AgentRunReplay.")
    if unauthorized is not None:
        return Decision(ReplayPhase.REFUSED, ReplayReason.NOT_AUTHORIZED,
                        f"{unauthorized} Forcing does not change this: a replay runs only "
                        "what its requester may use.")
    if original.phase not in Phase.TERMINAL:
        return Decision(ReplayPhase.REFUSED, ReplayReason.ORIGINAL_RUNNING,
                        f"AgentRun {run_name} is still {original.phase or Phase.PENDING}: "
                        "wait for it to settle, then create a new AgentRunReplay. Forcing "
                        "does not change this: two live copies of a run are never allowed.")
    if original.input_digest is None or not original.input_available:
        what = (f"The input snapshot {original.input_digest} of AgentRun {run_name} is gone "
                "from the run store" if original.input_digest else
                f"AgentRun {run_name} has no input snapshot (it failed before one was taken)")
        return Decision(ReplayPhase.REFUSED, ReplayReason.INPUT_GONE,
                        f"{what}: a replay would run on partial input, so it is refused, "
                        "even when forced. Create a new AgentRun with the input instead.")
    return None


def match_side_effects(run_name: str, original: Original) -> Decision | None:
    """The refusals about what the original may already have done in the world."""
    if original.phase == Phase.SUCCEEDED:
        done = (f" (it called {_tools(original.tools_executed)})"
                if original.tools_executed else "")
        return Decision(ReplayPhase.REFUSED, ReplayReason.ORIGINAL_SUCCEEDED,
                        f"AgentRun {run_name} succeeded{done}: its side effects already "
                        f"happened. {FORCE_HINT}")
    if original.tools_executed is None:
        return Decision(ReplayPhase.REFUSED, ReplayReason.TOOL_STATE_UNKNOWN,
                        f"Whether AgentRun {run_name} called any tool before {_ended(original)}"
                        " is unknown (the run store could not be read): a replay might call "
                        f"them again. {FORCE_HINT}")
    if original.tools_executed:
        # api.md's model sentence, word for word (the run is named by spec.runName).
        return Decision(ReplayPhase.REFUSED, ReplayReason.TOOLS_EXECUTED,
                        f"This run already called {_tools(original.tools_executed)}"
                        f" before {_ended(original)}: a replay would call them again. "
                        f"{FORCE_HINT}")
    return None


def match_already_replayed(run_name: str, already_replayed_by: str | None) -> Decision | None:
    """Only one non-forced replay of a run is ever approved."""
    if already_replayed_by is None:
        return None
    return Decision(ReplayPhase.REFUSED, ReplayReason.ALREADY_REPLAYED,
                    f"AgentRun {run_name} was already replayed (AgentRunReplay "
                    f"{already_replayed_by} was approved): only one replay of a run is "
                    f"approved without force. {FORCE_HINT}")


def decide(
    run_name: str,
    original: Original | None,
    *,
    already_replayed_by: str | None,
    forced: bool,
    unauthorized: str | None = None,
) -> Decision:
    """The decision on a replay of `run_name` (api.md, "Decision rules", first match wins).

    `original` None: the run does not exist. `already_replayed_by`: the AgentRunReplay that
    holds this run's one non-forced approval, if another one does. `forced`: the replay
    carries the force annotation. `unauthorized`: the sentence saying what the requester
    may not use of what the replay run would (authorize.py), if anything.
    """
    refused = match_never_forcible(run_name, original, unauthorized)
    if refused is not None:
        return refused
    assert original is not None
    refused = match_side_effects(run_name, original) or match_already_replayed(
        run_name, already_replayed_by)
    if refused is None:
        return Decision(ReplayPhase.APPROVED, ReplayReason.NO_TOOLS_EXECUTED,
                        f"AgentRun {run_name} ({original.reason or original.phase}) called "
                        "no tool, so running it again is safe.")
    if not forced:
        return refused
    return Decision(ReplayPhase.APPROVED, ReplayReason.FORCED,
                    f"Forced with {ANNOTATION_FORCE_REPLAY}=true over {refused.reason}: "
                    + refused.message.removesuffix(FORCE_HINT).strip())


# -- resume -------------------------------------------------------------------------------

ANSWERED = "answered"  # its response is in the session: not run again
FINISHED = "finished"  # it ended, its response never reached the session: from the ledger
IN_DOUBT = "in-doubt"  # called, never recorded as finished


@dataclass(frozen=True)
class JournalCall:
    """One tool call of the journal (the ledger beside the session), as a resume sees it."""

    seq: int
    tool: str
    effect: str  # effects.READ_ONLY | IDEMPOTENT | EFFECTFUL
    state: str  # ANSWERED | FINISHED | IN_DOUBT
    called_at: datetime.datetime
    key: str = ""  # its idempotency key


@dataclass(frozen=True)
class Journal:
    """What the failed attempt left to resume from; `available` False when its session
    events are gone or unreadable."""

    available: bool
    calls: Sequence[JournalCall] = field(default_factory=tuple)


RESUME_FORCE_HINT = f"annotate {ANNOTATION_FORCE_REPLAY}=true to resume and call it again."


def _at(when: datetime.datetime) -> str:
    return when.astimezone(datetime.UTC).strftime("%H:%M:%SZ")


def match_journal(run_name: str, original: Original, journal: Journal) -> Decision | None:
    """Resume needs the journal, and something left to resume (never forcible)."""
    if not journal.available or original.tools_executed is None:
        return Decision(ReplayPhase.REFUSED, ReplayReason.JOURNAL_UNAVAILABLE,
                        f"The journal of AgentRun {run_name} (its session events and tool "
                        "ledger) is gone or could not be read, so it cannot be resumed; a "
                        "plain replay starts over instead.")
    if original.phase == Phase.SUCCEEDED:
        return Decision(ReplayPhase.REFUSED, ReplayReason.ORIGINAL_SUCCEEDED,
                        f"AgentRun {run_name} succeeded: there is nothing left to resume.")
    return None


def match_in_doubt(run_name: str, journal: Journal) -> Decision | None:
    """An Effectful call that was made and never recorded as finished: nobody knows
    whether it happened (api.md's model sentence, one per such call)."""
    doubtful = [c for c in journal.calls
                if c.state == IN_DOUBT and c.effect == effects.EFFECTFUL]
    if not doubtful:
        return None
    said = " ".join(
        f"AgentRun {run_name} called {c.tool} (call {c.seq}, at {_at(c.called_at)}) and never "
        f"recorded its end: it may or may not have happened, and {c.tool} is Effectful."
        for c in doubtful)
    return Decision(ReplayPhase.REFUSED, ReplayReason.TOOL_CALL_IN_DOUBT,
                    f"{said} Check whether it happened; {RESUME_FORCE_HINT}")


def _resumable_message(run_name: str, journal: Journal) -> str:
    done = [c for c in journal.calls if c.state in (ANSWERED, FINISHED)]
    again = [c for c in journal.calls if c.state == IN_DOUBT]
    parts = [f"AgentRun {run_name} resumes from its journal"]
    if done:
        parts.append("; not repeated: " + ", ".join(f"{c.tool} (call {c.seq})" for c in done))
    if again:
        parts.append("; run again, in doubt: " + ", ".join(
            f"{c.tool} (call {c.seq}, {c.effect}" + (f", key {c.key[:18]}" if c.key else "")
            + ")" for c in again))
    return "".join(parts) + "."


def decide_resume(
    run_name: str,
    original: Original | None,
    journal: Journal,
    *,
    already_replayed_by: str | None,
    forced: bool,
    unauthorized: str | None = None,
) -> Decision:
    """The decision on resuming `run_name` from its journal (api.md, "Manual resume", first
    match wins); the automatic resume of spec.retry.resume takes the same decision with
    `already_replayed_by` None and `forced` False (its run's creator was checked when the
    run was created: `unauthorized` None)."""
    refused = match_never_forcible(run_name, original, unauthorized)
    if refused is not None:
        return refused
    assert original is not None
    refused = match_journal(run_name, original, journal)
    if refused is not None:
        return refused
    refused = match_in_doubt(run_name, journal) or match_already_replayed(
        run_name, already_replayed_by)
    if refused is None:
        return Decision(ReplayPhase.APPROVED, ReplayReason.RESUMABLE,
                        _resumable_message(run_name, journal))
    if not forced:
        return refused
    return Decision(ReplayPhase.APPROVED, ReplayReason.FORCED,
                    f"Forced with {ANNOTATION_FORCE_REPLAY}=true over {refused.reason}: "
                    + _resumable_message(run_name, journal))
