"""What does an AgentRun do now? One pure decision, and the status that shows it.

`decide_run(facts, now, config)` takes what one sync read (`RunFacts`: the AgentRun, its
attempt's pod and node from the caches, and, when it matters, what the store holds of the
run, any of which may be Unknown) and returns the one next step (`RunStep`).
`run_status(facts, step, now)` is the only place the AgentRun's status and its Events are
built; their sentences come from one table keyed by reason (`_SAYS`). No I/O happens
here: reconcile.py gathers the facts and carries the step out, and
tests/operator/test_decide_run.py holds the table, one row per line of api.md's tables.

Rules, first match wins (n: the attempt in status.attempts):

| the run | step |
| --- | --- |
| being deleted, no finalizer of ours | nothing |
| being deleted, live, attempt n not settled in the store | settle it Cancelled (the fence) |
| being deleted, its tools known (or never launched) | release: stop its pod, drop the finalizer |
| being deleted, settled, its tools unknown | count them (the finalizer stays until then) |
| no finalizer | add it |
| live, agentrun.dev/cancel, Waiting | deny the call waited for, close the run: Cancelled |
| live, agentrun.dev/cancel | settle attempt n CancelRequested (the fence) |
| settled, toolsExecuted null, the store can count them | count them, then show them |
| settled, its pods past their time to live | delete them (not those already going) |
| settled, past its own time to live, a replay of it undecided | wait for the decision |
| settled, past its own time to live | delete its replays, its approvals, then it |
| settled | nothing (until the nearer time to live; a trigger's run: at least its dedupe window) |
| Waiting, the call gone from the store | the end: Failed AgentError |
| Waiting, undecided, not expired | nothing until it expires |
| Waiting, undecided, expired | deny it (approver `timeout`) |
| Waiting, decided | attempt n+1 resumes: Pending, Resuming |
| not launched, spec.model scripted on an operator that refuses it | refuse: ModelNotAllowed |
| not launched, the store recorded it | start attempt 1 |
| not launched | launch: pin the Agent, snapshot the input, write the run down, start attempt 1 |
| the store settled attempn n (a lost status write; a settle of this sync) | show it (below) |
| the pod of attempt n's name is not the run's | Pending, PodCreateFailed (or wait while it goes) |
| no pod, created a moment ago (the informer has not shown it) | nothing until it shows |
| no pod, never created, past the stale limit | settle Stale |
| no pod, never created | start attempt n: write it down, create its pod |
| no pod, created, the API server still has it | look again in a moment |
| no pod, created and gone | settle: its last state, PodDeleted, the runner's account, PodLost |
| the pod says the attempt ended | settle: the runner's account or the cluster's (`account`) |
| Kueue holds the pod, the status does not say so | Pending, Queued (Admitted False) |
| Kueue admitted the pod, the status does not say so | Admitted True |
| the pod runs, status Pending | Running, Started |
| the pod runs, its usage changed | show the usage (at most every USAGE_EVERY s) |
| the pod waits (unschedulable, its container cannot start) | Pending, saying why |
| past the stale limit (counted from Kueue's admission; never while gated) | settle Stale |
| otherwise | nothing until the stale deadline (every second while the node is not Ready) |

An attempt that ended is shown, first match wins (`after_end`):

| attempt n ended | step |
| --- | --- |
| AwaitingApproval, the call written down | Waiting (its pod goes; no compute is held) |
| AwaitingApproval, no call written down | as AgentError |
| Failed, spec.retry.resume, `resume_applies`, the journal allows it | Resuming: attempt n+1 |
| Failed, toolsExecuted `[]`, attempts left, `should_retry` | Retrying: attempt n+1 |
| otherwise | the end, published whole (`Finish`) |

`resume_applies`: any failure but those no attempt mends (InputUnavailable, a spent
deadline, ...), attempts left, and tools not provably `[]` (a retry starts over then); a
resume the journal refuses leaves the run Failed with Resumable False and the refusal.
The end is one write: phase, reason, toolsExecuted, toolCalls, result and usage together.
Attempts that followed an approval's decision, and preempted ones (Kueue's eviction, the
scheduler's preemption: status.preemptedAttempts), do not count against retry.maxAttempts;
the message of the attempt that follows a preemption says who preempted it.

A sync takes one step. Settling is the one step that writes to the store before it is
shown (the fence: first writer wins, and the ledger refuses new calls after it): the same
sync then reads the store again and decides on what it holds, which is the step a later
sync would take had this one stopped there.
"""

from __future__ import annotations

import datetime
import enum
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from agentrun import history
from agentrun.store import Approval, RunState
from agentrun.store import Outcome as RecordedOutcome
from agentrun.vocabulary import (
    ANNOTATION_CANCEL,
    ANNOTATION_CANCEL_NOTE,
    GROUP,
    SCRIPTED_MODEL,
    ApprovalDecision,
    Condition,
    Phase,
    Reason,
    RunStatus,
)
from agentrun_operator import queue as queues
from agentrun_operator import status as st
from agentrun_operator import ttl
from agentrun_operator.classify import Outcome, classify, marked_for_stop
from agentrun_operator.config import OperatorConfig
from agentrun_operator.decide import (
    Decision,
    Journal,
    Original,
    cancel_requested,
    decide_resume,
    replay_decided,
)
from agentrun_operator.pods import automatic_session_owner, pod_name, session_id_for

FINALIZER = f"{GROUP}/finalizer"
# A pod we created is in the pod informer within this long, or it was deleted.
EXPECTATION_SECONDS = 30.0
# Unknown tools are read again this often, until the store answers.
UNKNOWN_TOOLS_RETRY = 5.0
# A run whose time to live is up waits this long for an undecided replay of it.
EXPIRE_WAIT = 1.0
# A node that is not Ready is looked at this often (its pods fail NodeLost after a grace).
NODE_RECHECK = 1.0
# A pod that holds the attempt's name and is not the run's is looked at this often; one
# of an earlier run of the same name, still going away, this often.
NAME_TAKEN_RECHECK = 5.0
NAME_FREED_RECHECK = 2.0
# A pod the store says was created, not in the cache and still in the API server.
CACHE_LAG_RECHECK = 0.5
# A live run's usage is written to its status at most this often.
USAGE_EVERY = 5.0
# A note on a cancel request is cut to this length in the run's message.
CANCEL_NOTE_CHARS = 512

_STORE_STATUS = {Phase.SUCCEEDED: RunStatus.SUCCEEDED, Phase.FAILED: RunStatus.FAILED,
                 Phase.CANCELLED: RunStatus.CANCELLED}


class Unknown(enum.Enum):
    """A store read that failed: not "nothing", not known."""

    UNKNOWN = "unknown"


UNKNOWN = Unknown.UNKNOWN


# -- the facts ---------------------------------------------------------------------------


@dataclass(frozen=True)
class RunFacts:
    """What one sync of a run read."""

    run: Mapping[str, Any]  # the AgentRun (slimmed: no input once it is snapshotted)
    pod: Mapping[str, Any] | None = None  # attempt n's pod (the cache)
    workload: Mapping[str, Any] | None = None  # the pod's Workload, Kueue's (the cache)
    node: Mapping[str, Any] | None = None  # the pod's node (the cache)
    gone: Mapping[str, Any] | None = None  # the pod's last state, deleted while watched
    created_ago: float | None = None  # seconds since this operator created the pod
    pod_elsewhere: bool = False  # not cached, and the API server has the run's pod
    # What the store holds (None: not read this sync; UNKNOWN: could not be read).
    store: RunState | Unknown | None = None
    journal: Journal | None = None  # attempt n's journal, when a resume may follow
    usage_written_ago: float | None = None  # since the status last took the usage
    # An end the store could not be told (its write failed): shown with tools unknown.
    unsettled: Outcome | None = None
    # A settled run's own pods, replays and approvals (the caches).
    pods: tuple[Mapping[str, Any], ...] = ()
    replays: tuple[Mapping[str, Any], ...] = ()
    approvals: tuple[Mapping[str, Any], ...] = ()
    # The AgentRunTrigger whose run it is, by (namespace, name) (the cache; its dedupe
    # window keeps the run: ttl.dedupe_left).
    triggers: Mapping[tuple[str, str], Mapping[str, Any]] = field(default_factory=dict)

    @property
    def meta(self) -> Mapping[str, Any]:
        return self.run["metadata"]

    @property
    def spec(self) -> Mapping[str, Any]:
        return self.run.get("spec") or {}

    @property
    def status(self) -> Mapping[str, Any]:
        return self.run.get("status") or {}

    @property
    def name(self) -> str:
        return str(self.meta["name"])

    @property
    def phase(self) -> str:
        return str(self.status.get("phase") or "")

    @property
    def attempt(self) -> int:
        """The attempt the status is about (1 before any is recorded)."""
        return current_attempt(self.status)

    @property
    def pod_name(self) -> str:
        return pod_name(self.name, self.attempt)

    @property
    def launched(self) -> bool:
        return bool(self.phase) and bool(self.status.get("inputDigest"))

    @property
    def known(self) -> RunState | None:
        """What the store holds, when it was read and could be."""
        return self.store if isinstance(self.store, RunState) else None


def current_attempt(status: Mapping[str, Any]) -> int:
    """The attempt the run's status is about (1 before any is recorded)."""
    return int(status.get("attempts") or 1)


def owns(run: Mapping[str, Any], pod: Mapping[str, Any]) -> bool:
    uid = run["metadata"]["uid"]
    return any(o.get("uid") == uid for o in (pod.get("metadata") or {}).get(
        "ownerReferences") or [])


@dataclass(frozen=True)
class Reads:
    """What a sync reads of the store besides the run's and the attempt's rows."""

    previous: bool = False  # the attempt before (a resumed attempt's session)
    approvals: bool = False
    published: bool = False  # ledger, answer, usage: what the end publishes
    usage: bool = False


def reads(facts: RunFacts, now: datetime.datetime, config: OperatorConfig) -> Reads | None:
    """What the store must say before deciding (None: nothing, the caches suffice). Only
    a run whose attempt may have ended, or has no pod, costs a store read."""
    status = facts.status
    if facts.meta.get("deletionTimestamp"):
        if FINALIZER not in (facts.meta.get("finalizers") or []) or (
                facts.phase in Phase.TERMINAL and status.get("toolsExecuted") is not None):
            return None
        return Reads()
    if FINALIZER not in (facts.meta.get("finalizers") or []):
        return None
    waiting = facts.phase == Phase.WAITING
    if facts.phase not in Phase.TERMINAL and cancel_requested(facts.meta.get("annotations")):
        return Reads(approvals=waiting, published=waiting)
    if facts.phase in Phase.TERMINAL:
        return Reads(published=True) if status.get("toolsExecuted", []) is None else None
    if waiting:
        return Reads(approvals=True)
    if not facts.launched:
        return Reads()
    if facts.pod is not None and not owns(facts.run, facts.pod):
        return None
    if facts.pod is None:
        if facts.created_ago is not None and facts.created_ago < EXPECTATION_SECONDS:
            return None
        return Reads(previous=facts.attempt in (status.get("resumedAttempts") or []))
    outcome = classify(facts.pod, facts.node, now, config.node_lost_grace)
    if outcome is not None and outcome.terminal:
        return Reads()
    if outcome is not None and outcome.phase == Phase.RUNNING and \
            facts.phase == Phase.RUNNING and not marked_for_stop(facts.pod):
        # (A pod the cluster marked for a stop is deleted a moment later; the sync of its
        # end, which reads everything, would wait behind this read.)
        return Reads(usage=True)
    if _stale_left(facts, now, config) <= 0:
        return Reads()
    return None


SETTLED_READS = Reads(previous=False, approvals=True, published=True)


# -- the steps ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Nothing:
    """Nothing to do; look again in `again` seconds (None: when something changes), or
    with the queue's backoff (the store could not be read)."""

    again: float | None = None
    backoff: bool = False


@dataclass(frozen=True)
class AddFinalizer:
    pass


@dataclass(frozen=True)
class Release:
    """A deleted run lets go: its pod stopped (when it may still run), the finalizer
    dropped."""

    stop_pod: bool


@dataclass(frozen=True)
class Settle:
    """Attempt n ended with `outcome`: fence it in the store (first writer wins).
    `record`: write the run down first (it ends before its launch); `count`: count its
    tools in the fence (else none ran: `[]`)."""

    outcome: Outcome
    record: bool = False
    count: bool = True


@dataclass(frozen=True)
class Count:
    """Count the tools of a settled attempt the store could not count (settling it there
    if the store never heard of its end)."""

    outcome: Outcome


@dataclass(frozen=True)
class Deny:
    """Decide the call a run waits for: denied, by `approver` (the timeout, a cancel)."""

    call: Approval
    approver: str
    note: str


@dataclass(frozen=True)
class CancelWait:
    """A waiting run is cancelled: its call denied (it never runs), its run row closed."""

    call: Approval | None
    message: str


@dataclass(frozen=True)
class Launch:
    """Launch: pin the Agent, snapshot the input, write the run down (unless the store
    has it: `recorded`), then start attempt 1."""

    recorded: bool


@dataclass(frozen=True)
class Start:
    """Start attempt `attempt`: its session, its row in the store, its pod."""

    attempt: int
    session: str
    resumes: int | None = None  # the attempt whose session it continues


@dataclass(frozen=True)
class Live:
    """Show a live status: `phase` (Pending, Running), reason, message, other fields.
    `resumable`: the resume decision (Resumable True); `decided`: the call whose decision
    it resumes after (ApprovalPending False)."""

    phase: str
    reason: str
    message: str
    fields: Mapping[str, Any] = field(default_factory=dict)
    after: str = ""  # the reason of the attempt that failed before (Retrying, Resuming)
    resumable: Decision | None = None
    decided: Approval | None = None
    again: float | None = 0
    backoff: bool = False  # look again with the queue's backoff (the API server refused)


@dataclass(frozen=True)
class Wait:
    """Show Waiting: attempt n asks for an approval of `call`; its pod goes."""

    call: Approval
    tools: Sequence[str] | None


@dataclass(frozen=True)
class Finish:
    """Show the end, whole: phase, reason, message, toolsExecuted, toolCalls, result and
    usage in one write. `refused`: a resume asked for and refused (Resumable False);
    `cancelled_wait`: a waiting run cancelled (ApprovalPending False); `stop_pod`: its pod
    may still run (the deadline, a stale run, an image that will not pull, a cancel)."""

    phase: str
    reason: str
    message: str
    tools: Sequence[str] | None
    refused: Decision | None = None
    cancelled_wait: bool = False
    stop_pod: bool = False
    preempted: tuple[int, ...] = ()  # status.preemptedAttempts


@dataclass(frozen=True)
class Tools:
    """Show the tools of a settled run, known at last (with its ledger, answer, usage)."""

    tools: Sequence[str]


@dataclass(frozen=True)
class InQueue:
    """Show where attempt n's pod stands in Kueue's queue (queue.py): Pending, Queued and
    Admitted False with Kueue's words while it waits; Admitted True once admitted."""

    admitted: bool


@dataclass(frozen=True)
class Usage:
    """Show a running run's usage."""

    usage: Mapping[str, Any]


@dataclass(frozen=True)
class DeletePods:
    """A settled run's pods are past their time to live."""

    pods: tuple[Mapping[str, Any], ...]
    again: float | None


@dataclass(frozen=True)
class Expire:
    """A settled run past its time to live: its replays, approvals, then itself."""

    replays: tuple[Mapping[str, Any], ...]
    approvals: tuple[Mapping[str, Any], ...]


Show = Live | Wait | Finish | Tools | InQueue | Usage
RunStep = (Nothing | AddFinalizer | Release | Settle | Count | Deny | CancelWait | Launch
           | Start | Show | DeletePods | Expire)
# The steps that write to the store first; the sync then decides again on what it holds.
FENCES = (Settle, Count, Deny, CancelWait)


# -- what is said, by reason -------------------------------------------------------------

# Every sentence the run's status and Events say, keyed by reason (and a variant where one
# reason says different things), filled from the facts.
_SAYS: Mapping[str, str] = {
    Reason.MODEL_NOT_ALLOWED: (
        "spec.model: scripted is turned off on this operator: it lets whoever creates a run "
        "choose every tool call and its arguments. Use a real model, or start the operator "
        "with --allow-scripted-model (development clusters and tests only). No pod was "
        "started."),
    f"{Reason.INPUT_UNAVAILABLE}/missing": "{problem} No pod was started; fix the input and "
                                           "create the run again.",
    f"{Reason.INPUT_UNAVAILABLE}/replay": (
        "The input snapshot of the original run {original} is gone from the run store, or "
        "no approved AgentRunReplay created this run; no pod was started."),
    f"{Reason.INPUT_UNAVAILABLE}/journal": "The journal of {original} is gone; nothing to "
                                           "resume. No pod was started.",
    Reason.INPUT_FORBIDDEN: "The input cannot be read yet: {problem}. No pod was started.",
    f"{Reason.SESSION_NOT_OWNED}/reserved": (
        "Session {session} is an automatic session id (<run uid>-<attempt>) of another run: "
        "those are reserved for their run. Name a session of your own in spec.sessionId. No "
        "pod was started."),
    f"{Reason.SESSION_NOT_OWNED}/owned": (
        "Session {session} in namespace {namespace} belongs to {owner}; only chat turns of "
        "the same agent and userId continue it. Use another sessionId. No pod was started."),
    Reason.SESSION_BUSY: (
        "Session {session} is in use by the live run {holder}: two runs on one session "
        "would interleave their turns. Create this run again once {holder} has settled. No "
        "pod was started."),
    Reason.AGENT_NOT_FOUND: ("The Agent snapshot {digest} this run pinned is gone from the "
                             "run store; no pod was started."),
    Reason.POD_INVALID: ("The API server refused runner pod {pod} as invalid: {said}. "
                         "Nothing ran; fix the run's spec and create it again."),
    f"{Reason.POD_CREATE_FAILED}/refused": (
        "Runner pod {pod} could not be created ({code} {why}): {said}. Retrying with "
        "backoff; no attempt is used up."),
    f"{Reason.POD_CREATE_FAILED}/taken": (
        "A pod named {pod} already exists in namespace {namespace} and is not this run's "
        "runner (no ownerReference to this AgentRun); the run waits for the name to be "
        "free. Delete that pod, or create the run under another name. Nothing ran."),
    Reason.CREATED: "Input snapshotted as {digest}{pinned}; run recorded.",
    Reason.POD_CREATED: "Created runner pod {pod} (attempt {attempt}).",
    Reason.STARTED: "Runner pod {pod} is running.",
    Reason.RETRYING: ("Attempt {attempt} failed ({after}) before calling any tool; starting "
                      "attempt {next}."),
    f"{Reason.RESUMING}/journal": "Attempt {attempt} failed ({after}); attempt {next} "
                                  "resumes it. {decision}",
    f"{Reason.RESUMING}/approved": ("{tool} (call {seq}) was approved by {approver}; attempt "
                                    "{next} resumes the run and makes the call."),
    f"{Reason.RESUMING}/denied": ("{tool} (call {seq}) was denied by {approver}; attempt "
                                  "{next} resumes the run, and the model is told it was "
                                  "denied."),
    Reason.AWAITING_APPROVAL: (
        "{call} (call {seq}) waits for an approval, until {until}: approve or deny it with "
        "kubectl agentrun approve {run} [--deny] (an AgentRunApproval, which only an "
        "agentrun-approver may create). No pod runs meanwhile."),
    f"{Reason.AGENT_ERROR}/unasked": ("{said} The runner said a call waits for an approval, "
                                      "and none was written down: the run cannot wait for "
                                      "it."),
    f"{Reason.AGENT_ERROR}/call-gone": "The call this run waited for is not in the run store.",
    Reason.CANCEL_REQUESTED: "Cancelled on request ({annotation}){note}.",
    f"{Reason.CANCEL_REQUESTED}/unlaunched": " It had not started: nothing ran.",
    f"{Reason.CANCEL_REQUESTED}/launched": " Its runner pod was stopped.",
    f"{Reason.CANCEL_REQUESTED}/waiting": (" It was waiting for an approval, which it no "
                                           "longer needs: the call never ran."),
    Reason.CANCELLED: "The AgentRun was deleted while it was live; its pod was stopped.",
    f"{Reason.CANCELLED}/unlaunched": "Deleted before it started.",
    Reason.POD_DELETED: "The runner pod was deleted while the run was running.",
    Reason.POD_LOST: "The runner pod no longer exists and no outcome was recorded.",
    "end": "{message} Tools executed: {tools}.",
    "not-resumed": "Not resumed: {message}",
    "ToolsExecutedKnown": "The run store is readable again: tools executed: {tools}.",
}
# Live reasons whose Event is a Warning (the run waits on something that is not right).
_WARNS = frozenset({Reason.RETRYING, Reason.POD_UNSCHEDULABLE, Reason.POD_WAITING,
                    Reason.POD_CREATE_FAILED, Reason.INPUT_FORBIDDEN})


def say(key: str, **facts: Any) -> str:
    """The sentence of `key` (a reason, or reason/variant), with the facts filled in."""
    return _SAYS[key].format(**facts)


# -- the decision --------------------------------------------------------------------------


# Ends the operator decides from what it saw itself (no container ran: the image; no pod
# was created: the input, the model, the session, an invalid pod; the run was deleted).
# The runner's own account never replaces them. toolsExecuted is still counted from the
# ledger and the session, as for every end: a reason is a label, never evidence.
_OPERATORS_OWN = frozenset({Reason.IMAGE_PULL_FAILED, Reason.INPUT_UNAVAILABLE,
                            Reason.MODEL_NOT_ALLOWED, Reason.SESSION_BUSY,
                            Reason.SESSION_NOT_OWNED, Reason.POD_INVALID, Reason.CANCELLED})
# Ends after which the pod may still be running, and must be stopped (after the settle,
# which fences the ledger first).
_STOP_POD = frozenset({Reason.IMAGE_PULL_FAILED, Reason.DEADLINE_EXCEEDED, Reason.STALE,
                       Reason.CANCEL_REQUESTED})
# Failures another attempt cannot mend: the same spec meets the same refusal again.
NOT_RETRIED = frozenset({
    Reason.DEADLINE_EXCEEDED, Reason.INPUT_UNAVAILABLE, Reason.STALE,
    Reason.IMAGE_PULL_FAILED, Reason.MODEL_NOT_ALLOWED, Reason.POD_INVALID,
    Reason.SESSION_BUSY, Reason.SESSION_NOT_OWNED,
    # The run pinned its agent at launch: another attempt builds the same one.
    Reason.AGENT_NOT_FOUND, Reason.AGENT_INVALID,
    # The resumed attempt would open the same call under the same arguments again.
    Reason.APPROVAL_MISMATCH,
    # The run's spec.tools loosens what the Agent or the image declares: it always will.
    Reason.POLICY_VIOLATION,
})
# Failures after which spec.retry.resume does not resume (api.md, "Automatic resume").
_NOT_RESUMED = frozenset({Reason.SUCCEEDED, Reason.CANCELLED, *NOT_RETRIED})


def should_retry(spec: Mapping[str, Any], attempt: int, phase: str, reason: str,
                 tools: Sequence[str] | None) -> bool:
    """A new attempt only when the failed one provably called no tool (`[]`, never None),
    attempts remain (`attempt`: those spent), and trying again can help (not for a spent
    deadline, a missing input, a stale run or an image that will not pull)."""
    if phase != Phase.FAILED or tools is None or len(tools) != 0:
        return False
    if reason in NOT_RETRIED:
        return False
    max_attempts = int(((spec.get("retry") or {}).get("maxAttempts")) or 1)
    return attempt < max_attempts


def recorded_end(recorded: RecordedOutcome | None, fallback: str | None = None
                 ) -> Outcome | None:
    """How the runner itself recorded the attempt's end, if it did. Only a reason the
    runner may give (or the store API's own InputUnavailable) is taken as it is; any
    other is an agent error: the store API refuses them, and an older row is no
    exception."""
    if recorded is not None and recorded.status == RunStatus.SUCCEEDED:
        return Outcome(Phase.SUCCEEDED, Reason.SUCCEEDED,
                       recorded.message or fallback or "The agent finished.")
    if recorded is not None and recorded.status == RunStatus.FAILED:
        reason = recorded.reason if recorded.reason in Reason.RECORDED else Reason.AGENT_ERROR
        return Outcome(Phase.FAILED, reason, recorded.message or fallback or
                       "The runner failed.")
    return None


def account(cluster: Outcome, recorded: RecordedOutcome | Unknown | None) -> Outcome:
    """Whether (and how) the attempt succeeded, weighed in this one place. The runner's
    own account of a plain exit (its reason and message) is more precise than an exit
    code; the cluster's account of a disruption wins over the runner's, unless the runner
    had recorded that the agent finished: what happened to its pod after the answer (an
    eviction while the process exits) changes nothing the run did. The operator's own
    ends stand (`recorded` UNKNOWN: the store cannot be read, the cluster's stands)."""
    if cluster.reason in _OPERATORS_OWN or isinstance(recorded, Unknown):
        return cluster
    told = recorded_end(recorded, cluster.message)
    if told is not None and told.phase == Phase.SUCCEEDED:
        return told
    if cluster.reason not in (Reason.AGENT_ERROR, Reason.SUCCEEDED):
        return cluster
    return told if told is not None and told.phase == cluster.phase else cluster


@dataclass(frozen=True)
class Ended:
    """How attempt n ended: the store's account (its first writer's), or this sync's when
    the store could not be told (tools None)."""

    phase: str
    reason: str
    message: str
    tools: Sequence[str] | None


def stored_end(facts: RunFacts) -> Ended | None:
    """Attempt n's end as the store holds it: its row, or the run's row when the run
    ended before the attempt was written down; an end the store could not be told; None
    while the store says it is live."""
    if facts.unsettled is not None:
        o = facts.unsettled
        return Ended(o.phase, o.reason, o.message, None)
    known = facts.known
    if known is None:
        return None
    row = known.attempt
    if row is not None:
        if row.status in RunStatus.LIVE:
            return None
        return Ended(history.PHASE_OF[row.status], row.reason or "", row.message or "",
                     row.tools_executed)
    run = known.run
    if run is not None and run.status not in RunStatus.LIVE and run.attempts == facts.attempt:
        return Ended(history.PHASE_OF[run.status], run.reason or "", run.message or "",
                     run.tools_executed)
    return None


def decided_before(facts: RunFacts) -> int:
    """How many attempts before n ended waiting for a decision that came (each is followed
    by one more attempt, which does not count; none when the store cannot say: a retry
    may then be refused, never doubled)."""
    known = facts.known
    return 0 if known is None else sum(1 for a in known.approvals
                                       if not a.pending and a.attempt < facts.attempt)


def resume_applies(facts: RunFacts, end: Ended | None = None) -> bool:
    """With spec.retry.resume, whether a resume of attempt n may follow its end (the
    journal then decides): a failure other than those no attempt mends, attempts left,
    and not provably nothing run (a plain retry then starts over)."""
    end = end if end is not None else stored_end(facts)
    retry = facts.spec.get("retry") or {}
    if end is None or not retry.get("resume") or end.phase != Phase.FAILED \
            or end.reason in _NOT_RESUMED or end.tools == []:
        return False
    return spent_attempts(facts, end.reason) < int(retry.get("maxAttempts") or 1)


def spent_attempts(facts: RunFacts, reason: str) -> int:
    """The attempts that count against retry.maxAttempts once attempt n ended with
    `reason`: neither those that followed an approval's decision nor preempted ones."""
    preempted = queues.preempted_attempts(facts.status, facts.attempt, reason)
    return facts.attempt - decided_before(facts) - len(preempted)


def _pending_call(facts: RunFacts) -> Approval | None:
    """The call attempt n waits for (its first, by seq)."""
    known = facts.known
    if known is None:
        return None
    return next((a for a in sorted(known.approvals, key=lambda a: a.seq)
                 if a.pending and a.attempt == facts.attempt), None)


def after_end(facts: RunFacts, end: Ended) -> RunStep:
    """What follows attempt n's end (the module's second table, first match wins)."""
    attempt = facts.attempt
    message = end.message
    reason = end.reason
    if end.phase == Phase.FAILED and reason == Reason.AWAITING_APPROVAL:
        if facts.known is None:
            return Nothing(backoff=True)  # the call it waits for cannot be read yet
        waiting = _pending_call(facts)
        if waiting is not None:
            return Wait(waiting, end.tools)
        reason, message = Reason.AGENT_ERROR, say(f"{Reason.AGENT_ERROR}/unasked",
                                                  said=message)
    end = Ended(end.phase, reason, message, end.tools)
    following = attempt + 1
    preempted = queues.preempted_attempts(facts.status, attempt, reason)
    kept = {"preemptedAttempts": preempted} if preempted else {}
    note = queues.preemption_note(reason, message)
    resume: Decision | None = None
    if resume_applies(facts, end):
        digest = facts.status.get("inputDigest")
        original = Original(phase=end.phase, tools_executed=end.tools, input_digest=digest,
                            input_available=bool(digest), reason=reason)
        resume = decide_resume(facts.name, original, facts.journal or Journal(False),
                               already_replayed_by=None, forced=False)
        if resume.approved:
            return Live(Phase.PENDING, Reason.RESUMING, say(
                f"{Reason.RESUMING}/journal", attempt=attempt, after=reason, next=following,
                decision=resume.message) + note, {"attempts": following, "resumedAttempts": [
                    *(facts.status.get("resumedAttempts") or []), following], **kept},
                after=reason, resumable=resume)
    if should_retry(facts.spec, spent_attempts(facts, reason), end.phase, reason, end.tools):
        return Live(Phase.PENDING, Reason.RETRYING, say(
            Reason.RETRYING, attempt=attempt, after=reason, next=following) + note,
            {"attempts": following, **kept}, after=reason)
    return Finish(end.phase, reason, message, end.tools, refused=resume,
                  stop_pod=reason in _STOP_POD, preempted=tuple(preempted))


def _stale_left(facts: RunFacts, now: datetime.datetime, config: OperatorConfig) -> float:
    """Seconds until attempt n is Stale. Queue time is not running time: the limit is not
    counted while Kueue holds the pod, and counts from its admission once admitted."""
    if facts.pod is not None and queues.gated(facts.pod):
        return config.stale_after.total_seconds()
    started = queues.stale_clock(facts.status, facts.meta.get("creationTimestamp"))
    return ((started or now) + config.stale_after - now).total_seconds()


def _stale(config: OperatorConfig) -> Outcome:
    return Outcome(Phase.FAILED, Reason.STALE, st.stale_message(config.stale_after))


def decide_run(facts: RunFacts, now: datetime.datetime, config: OperatorConfig) -> RunStep:
    """The one next step of the run (the module's table, first match wins)."""
    meta = facts.meta
    if meta.get("deletionTimestamp"):
        return _deleted(facts)
    if FINALIZER not in (meta.get("finalizers") or []):
        return AddFinalizer()
    if facts.phase not in Phase.TERMINAL and cancel_requested(meta.get("annotations")):
        return _cancel(facts)
    if facts.phase in Phase.TERMINAL:
        return _settled(facts, now, config)
    if facts.phase == Phase.WAITING:
        return _waiting(facts, now)
    if not facts.launched:
        return _launch(facts, config)
    return _follow(facts, now, config)


def _deleted(facts: RunFacts) -> RunStep:
    """Deleting a run cancels it; the finalizer stays until the store holds its tools."""
    if FINALIZER not in (facts.meta.get("finalizers") or []):
        return Nothing()
    tools = facts.status.get("toolsExecuted")
    if facts.phase in Phase.TERMINAL and tools is not None:
        return Release(stop_pod=False)
    if facts.unsettled is not None or facts.store is UNKNOWN:
        return Nothing(UNKNOWN_TOOLS_RETRY)  # the store cannot be read: keep the finalizer
    end = stored_end(facts)
    if facts.phase in Phase.TERMINAL:
        if end is not None and end.tools is not None:
            return Release(stop_pod=False)
        return Count(Outcome(facts.phase, str(facts.status.get("reason") or ""),
                             str(facts.status.get("message") or "")))
    if not facts.phase:  # never launched: nothing ran; the store learns it, if it knows it
        known = facts.known
        if known is None or known.run is None or end is not None:
            return Release(stop_pod=False)
        return Settle(Outcome(Phase.CANCELLED, Reason.CANCELLED,
                              say(f"{Reason.CANCELLED}/unlaunched")), count=False)
    if end is None:
        return Settle(Outcome(Phase.CANCELLED, Reason.CANCELLED, say(Reason.CANCELLED)))
    if end.tools is None:
        return Count(Outcome(Phase.CANCELLED, Reason.CANCELLED, say(Reason.CANCELLED)))
    return Release(stop_pod=True)


def _cancel_message(facts: RunFacts, variant: str) -> str:
    note = (facts.meta.get("annotations") or {}).get(ANNOTATION_CANCEL_NOTE, "").strip()
    return say(Reason.CANCEL_REQUESTED, annotation=ANNOTATION_CANCEL,
               note=f": {note[:CANCEL_NOTE_CHARS]}" if note else "") + say(
        f"{Reason.CANCEL_REQUESTED}/{variant}")


def _cancel(facts: RunFacts) -> RunStep:
    """Cancel in place: the run ends as any run ends, and stays. A runner that had already
    recorded its answer keeps it (the cancel came too late to stop it)."""
    if facts.phase == Phase.WAITING:
        message = _cancel_message(facts, "waiting")
        known = facts.known
        if known is None:
            return Nothing(backoff=True)
        # The attempt's row ended (AwaitingApproval) when it began to wait; the run's row
        # is closed Cancelled by the cancel.
        closed = known.run is not None and known.run.status == RunStatus.CANCELLED
        if not closed:
            return CancelWait(_pending_call(facts), message)
        tools = facts.status.get("toolsExecuted")
        if tools is None and known.attempt is not None:
            tools = known.attempt.tools_executed
        return Finish(Phase.CANCELLED, Reason.CANCEL_REQUESTED, message, tools,
                      cancelled_wait=True)
    end = stored_end(facts)
    if end is not None:
        return after_end(facts, end)
    if not facts.launched:
        if facts.store is UNKNOWN:
            return Nothing(backoff=True)
        return Settle(Outcome(Phase.CANCELLED, Reason.CANCEL_REQUESTED,
                              _cancel_message(facts, "unlaunched")), record=True)
    return Settle(_account(facts, Outcome(Phase.CANCELLED, Reason.CANCEL_REQUESTED,
                                          _cancel_message(facts, "launched"))))


def _account(facts: RunFacts, cluster: Outcome) -> Outcome:
    known = facts.known
    if known is None:
        return account(cluster, UNKNOWN)
    return account(cluster, known.attempt.outcome if known.attempt is not None else None)


def _settled(facts: RunFacts, now: datetime.datetime, config: OperatorConfig) -> RunStep:
    """A settled run: its tools known (read again until the store answers), its pods
    deleted once their time to live is up, then itself once its own is (ttl.py)."""
    status = facts.status
    if "toolsExecuted" in status and status["toolsExecuted"] is None:
        if facts.unsettled is not None or facts.store is UNKNOWN:
            return Nothing(UNKNOWN_TOOLS_RETRY)
        end = stored_end(facts)
        if end is not None and end.tools is not None:
            return Tools(list(end.tools))
        return Count(Outcome(facts.phase, str(status.get("reason") or ""),
                             str(status.get("message") or "")))
    since = ttl.settled_at(facts.run)
    pods_left = ttl.seconds_left(since, config.pod_ttl_after_finished, now) \
        if facts.pods else None
    # A trigger's run is kept at least its trigger's dedupe window (a redelivery finds it).
    run_left = ttl.at_least(ttl.seconds_left(
        since, ttl.run_ttl(facts.spec, config.run_ttl_after_finished), now),
        ttl.dedupe_left(facts.run, facts.triggers, now))
    if pods_left is not None and pods_left <= 0:
        return DeletePods(facts.pods, 0 if run_left is not None else None)
    if run_left is not None and run_left <= 0:
        if any(not replay_decided(r) for r in facts.replays):
            return Nothing(EXPIRE_WAIT)  # its request is never lost
        return Expire(facts.replays, facts.approvals)
    due = [left for left in (pods_left, run_left) if left is not None]
    return Nothing(min(due) if due else None)


def _waiting(facts: RunFacts, now: datetime.datetime) -> RunStep:
    """A run waits for a decision: once decided (or expired, which denies it as
    `timeout`), attempt n+1 resumes the journal and runs (or denies) the call; it does
    not count against retry.maxAttempts: the run did not fail."""
    known = facts.known
    if known is None:
        return Nothing(backoff=True)
    asked = facts.status.get("pendingApproval") or {}
    waited = next((a for a in known.approvals
                   if a.attempt == facts.attempt and a.seq == asked.get("seq")), None)
    if waited is None:  # nothing the store knows to wait for: the run failed after all
        return after_end(facts, Ended(Phase.FAILED, Reason.AGENT_ERROR,
                                      say(f"{Reason.AGENT_ERROR}/call-gone"),
                                      facts.status.get("toolsExecuted")))
    if waited.pending:
        left = (waited.expires_at - now).total_seconds()
        if left > 0:
            return Nothing(left)
        timeout = (waited.expires_at - waited.requested_at).total_seconds()
        return Deny(waited, ApprovalDecision.TIMEOUT_APPROVER,
                    f"no decision within {int(timeout)} s")
    following = facts.attempt + 1
    said = "approved" if waited.decision == ApprovalDecision.APPROVE else "denied"
    return Live(Phase.PENDING, Reason.RESUMING, say(
        f"{Reason.RESUMING}/{said}", tool=waited.tool, seq=waited.seq,
        approver=waited.approver, next=following),
        {"attempts": following, "pendingApproval": None, "resumedAttempts": [
            *(facts.status.get("resumedAttempts") or []), following]}, decided=waited)


def _launch(facts: RunFacts, config: OperatorConfig) -> RunStep:
    """Snapshot the input and write the run down (before any pod), then start attempt 1."""
    end = stored_end(facts)
    if end is not None:  # refused before (or just now), and not shown yet
        return after_end(facts, end)
    if facts.spec.get("model") == SCRIPTED_MODEL and not config.allow_scripted_model:
        return refused(Reason.MODEL_NOT_ALLOWED, say(Reason.MODEL_NOT_ALLOWED), record=True)
    if facts.store is UNKNOWN:
        return Nothing(backoff=True)
    known = facts.known
    return Launch(recorded=known is not None and known.run is not None and
                  bool(known.run.input_digest))


def start_of(facts: RunFacts, attempt: int) -> Start | Settle:
    """Attempt `attempt`'s start: its session (a resumed attempt continues the session of
    the one before), or the refusal of an automatic session id that is another run's."""
    session, resumes = session_id_for(facts.run, attempt), None
    known = facts.known
    if attempt in (facts.status.get("resumedAttempts") or []) and known is not None \
            and known.previous is not None and known.previous.session_id:
        session, resumes = known.previous.session_id, attempt - 1
    reserved_for = automatic_session_owner(str(facts.spec.get("sessionId") or ""))
    if reserved_for is not None and reserved_for != facts.meta["uid"]:
        return refused(Reason.SESSION_NOT_OWNED, say(f"{Reason.SESSION_NOT_OWNED}/reserved",
                                                     session=session))
    return Start(attempt, session, resumes)


def _follow(facts: RunFacts, now: datetime.datetime, config: OperatorConfig) -> RunStep:
    """Attempt n of a launched run: its pod, or its absence."""
    pod = facts.pod
    if pod is not None and not owns(facts.run, pod):
        return name_taken(facts, pod)
    end = stored_end(facts)
    if end is not None:  # settled (by this sync, or before a status write was lost)
        return after_end(facts, end)
    if pod is None:
        return _no_pod(facts, now, config)
    outcome = classify(pod, facts.node, now, config.node_lost_grace)
    if outcome is not None and outcome.terminal:
        if facts.store is None:  # not read: the caller reads it and decides again
            return Nothing(0)
        return Settle(_account(facts, outcome))
    status = facts.status
    if queues.queue_status(pod, facts.workload, status, now) is not None:
        found = queues.admission(pod, facts.workload)
        return InQueue(found is not None and found.admitted)
    held: float | None = None
    if outcome is not None and outcome.phase == Phase.RUNNING:
        if facts.phase == Phase.PENDING:
            return Live(Phase.RUNNING, Reason.STARTED, say(Reason.STARTED, pod=facts.pod_name),
                        {"startedAt": status.get("startedAt") or st.stamp(now)})
        known = facts.known
        if known is not None and known.usage is not None:
            used = st.usage_status(known.usage)
            if used != status.get("usage"):
                waited = facts.usage_written_ago
                if waited is None or waited >= USAGE_EVERY:
                    return Usage(used)
                held = USAGE_EVERY - waited
    else:
        waiting = st.pod_waiting(pod)
        if waiting is not None and (status.get("reason"), status.get("message")) != waiting:
            return Live(Phase.PENDING, *waiting)
    left = _stale_left(facts, now, config)
    if left <= 0:
        return Settle(_account(facts, _stale(config)))
    if facts.node is not None and not st.node_ready(facts.node):
        left = min(left, NODE_RECHECK)
    return Nothing(left if held is None else min(left, held))


def name_taken(facts: RunFacts, pod: Mapping[str, Any],
               launching: Mapping[str, Any] | None = None) -> RunStep:
    """A pod named like the attempt's runner exists and is not the run's. One of an earlier
    AgentRun of the same name (deleted and applied again) still going away is waited for.
    Any other is not ours to delete: the run waits, Pending, and says so."""
    if (pod.get("metadata") or {}).get("deletionTimestamp"):
        return Nothing(NAME_FREED_RECHECK)
    message = say(f"{Reason.POD_CREATE_FAILED}/taken", pod=pod["metadata"]["name"],
                  namespace=facts.meta["namespace"])
    return Live(Phase.PENDING, Reason.POD_CREATE_FAILED, message, dict(launching or {}),
                again=NAME_TAKEN_RECHECK)


def _no_pod(facts: RunFacts, now: datetime.datetime, config: OperatorConfig) -> RunStep:
    """Attempt n has no pod: not created yet (create it), or created and gone."""
    if facts.created_ago is not None and facts.created_ago < EXPECTATION_SECONDS:
        # Created a moment ago; the watch has not shown it yet (its event will queue the
        # run; the expectation's end is the safety net).
        return Nothing(EXPECTATION_SECONDS - facts.created_ago)
    known = facts.known
    if known is None:
        return Nothing(backoff=True)
    row = known.attempt
    if row is None or row.pod_uid is None:
        if _stale_left(facts, now, config) <= 0:  # never got a pod within the stale limit
            return Settle(_account(facts, _stale(config)))
        if known.run is None or not known.run.input_digest:  # its record is gone
            return Launch(recorded=False)
        return start_of(facts, facts.attempt)
    if facts.pod_elsewhere:
        # The cache lags behind the API server (a replica whose watch is late must not
        # call the pod lost).
        return Nothing(CACHE_LAG_RECHECK)
    # It is gone: how it ended as last seen, else as the runner said, if it did.
    if facts.gone is not None:
        outcome = classify(facts.gone, None, now, config.node_lost_grace)
        if outcome is None or not outcome.terminal:
            outcome = Outcome(Phase.FAILED, Reason.POD_DELETED, say(Reason.POD_DELETED))
    else:
        outcome = recorded_end(row.outcome) or Outcome(Phase.FAILED, Reason.POD_LOST,
                                                       say(Reason.POD_LOST))
    return Settle(_account(facts, outcome))


# -- answers of an action, as steps --------------------------------------------------------


def refused(reason: str, message: str, *, record: bool = False) -> Settle:
    """The launch or start met a refusal that ends the run before its pod: nothing ran
    (`record`: the run is written down first, as every run is)."""
    return Settle(Outcome(Phase.FAILED, reason, message), record=record)


def created(facts: RunFacts, start: Start, launching: Mapping[str, Any]) -> Live:
    """Attempt `start.attempt`'s pod exists: Pending, PodCreated."""
    name = pod_name(facts.name, start.attempt)
    return Live(Phase.PENDING, Reason.POD_CREATED,
                say(Reason.POD_CREATED, pod=name, attempt=start.attempt),
                {"podName": name, "sessionId": start.session, "attempts": start.attempt,
                 **launching}, again=EXPECTATION_SECONDS)


def create_refused(facts: RunFacts, start: Start, code: int, why: str, said: str,
                   launching: Mapping[str, Any]) -> RunStep:
    """The API server refused the runner pod. Invalid (422/400): it never will, the run
    fails at once. Anything else (a quota, a webhook, forbidden, the server itself): the
    run stays Pending, says why, and the create is tried again with backoff. No attempt
    is spent: nothing ran."""
    name = pod_name(facts.name, start.attempt)
    if code in (400, 422):
        return refused(Reason.POD_INVALID, say(Reason.POD_INVALID, pod=name, said=said))
    return Live(Phase.PENDING, Reason.POD_CREATE_FAILED, say(
        f"{Reason.POD_CREATE_FAILED}/refused", pod=name, code=code, why=why, said=said),
        {"attempts": start.attempt, **launching}, again=None, backoff=True)


# -- the status that shows it --------------------------------------------------------------


@dataclass(frozen=True)
class Event:
    reason: str
    message: str
    warning: bool = False


def run_status(facts: RunFacts, step: Show, now: datetime.datetime
               ) -> tuple[dict[str, Any], tuple[Event, ...]]:
    """The run's whole status once `step` is shown, and the Events that say so (posted
    only when the status changed). What a run publishes when it settles (toolsExecuted,
    toolCalls, result, usage) comes with its phase, in the same write."""
    previous = facts.status
    conditions = list(previous.get("conditions") or [])
    changes: dict[str, Any]
    events: tuple[Event, ...]
    if isinstance(step, Live):
        changes = st.live_status(step.phase, step.reason, step.message, now, previous,
                                 **step.fields)
        if step.resumable is not None:
            changes["conditions"] = [*_without(changes, Condition.RESUMABLE),
                                     st.resumable_condition(True, step.resumable.reason,
                                                            step.resumable.message, now,
                                                            previous)]
        if step.decided is not None:
            decided = "Approved" if step.decided.decision == ApprovalDecision.APPROVE \
                else "Denied"
            changes["conditions"] = [*_without(changes, Condition.APPROVAL_PENDING),
                                     st.approval_condition(False, decided, step.message, now,
                                                           previous)]
        events = (Event(step.reason, step.message, step.reason in _WARNS),)
    elif isinstance(step, Wait):
        call = step.call
        message = say(Reason.AWAITING_APPROVAL, call=st.call_text(call), seq=call.seq,
                      until=st.stamp(call.expires_at), run=facts.name)
        changes = st.live_status(Phase.WAITING, Reason.AWAITING_APPROVAL, message, now,
                                 previous, attempts=facts.attempt,
                                 pendingApproval=st.pending_status(call),
                                 toolsExecuted=None if step.tools is None else list(step.tools),
                                 **_published(facts, step.tools))
        changes["conditions"] = [
            *_without(changes, Condition.APPROVAL_PENDING, Condition.TOOLS_EXECUTED),
            st.tools_condition(step.tools, now, conditions),
            st.approval_condition(True, Reason.AWAITING_APPROVAL, message, now, previous)]
        events = (Event(Reason.AWAITING_APPROVAL, message),)
    elif isinstance(step, Finish):
        extra: dict[str, Any] = {"pendingApproval": None} if step.cancelled_wait else {}
        if step.preempted:
            extra["preemptedAttempts"] = list(step.preempted)
        changes = st.settled_status(step.phase, step.reason, step.message, step.tools, now,
                                    previous, attempts=facts.attempt, **extra,
                                    **_published(facts, step.tools))
        told = "unknown (the run store could not be read)" if step.tools is None else (
            ", ".join(step.tools) or "none")
        ended = Event(step.reason, say("end", message=step.message, tools=told),
                      step.phase != Phase.SUCCEEDED)
        events = (ended,)
        if step.refused is not None:  # asked to resume, and refused: say why, on the run
            changes["conditions"] = [*_without(changes, Condition.RESUMABLE),
                                     st.resumable_condition(False, step.refused.reason,
                                                            step.refused.message, now,
                                                            previous)]
            events = (Event(step.refused.reason, say("not-resumed",
                                                     message=step.refused.message), True),
                      ended)
        if step.cancelled_wait:
            changes["conditions"] = [*_without(changes, Condition.APPROVAL_PENDING),
                                     st.approval_condition(False, Reason.CANCEL_REQUESTED,
                                                           step.message, now, previous)]
            events = (Event(Reason.CANCEL_REQUESTED, step.message, True),)
    elif isinstance(step, Tools):
        changes = {"toolsExecuted": list(step.tools),
                   "conditions": [*[c for c in conditions
                                    if c.get("type") != Condition.TOOLS_EXECUTED],
                                  st.tools_condition(step.tools, now)],
                   **_published(facts, step.tools)}
        events = (Event("ToolsExecutedKnown", say("ToolsExecutedKnown",
                                                  tools=", ".join(step.tools) or "none")),)
    elif isinstance(step, InQueue):
        assert facts.pod is not None
        changes = queues.queue_status(facts.pod, facts.workload, previous, now) or {}
        if step.admitted:
            said = next((str(c.get("message") or "") for c in changes.get("conditions") or []
                         if c.get("type") == Condition.ADMITTED), "")
            events = (Event(Condition.ADMITTED, said),)
        else:
            events = (Event(Reason.QUEUED, str(changes.get("message") or "")),) \
                if previous.get("reason") != Reason.QUEUED else ()
    else:
        changes, events = {"usage": dict(step.usage)}, ()
    whole = st.with_gitops_conditions({**previous, **changes}, facts.meta.get("generation"),
                                      now)
    return whole, events


def _without(changes: Mapping[str, Any], *types: str) -> list[dict[str, Any]]:
    return [c for c in changes.get("conditions") or [] if c.get("type") not in types]


def _published(facts: RunFacts, tools: Sequence[str] | None) -> dict[str, Any]:
    """What a settled (or waiting) run publishes beside its tools, from the store: its
    ledger (status.toolCalls), its answer (status.result) and its usage. None of them when
    the store could not be read (the tools are unknown then, and all come together later,
    with them)."""
    known = facts.known
    if tools is None or known is None or known.ledger is None:
        return {}
    shown: dict[str, Any] = {**st.tool_calls(known.ledger)}
    if known.usage is not None:
        shown["usage"] = st.usage_status(known.usage)
    if known.result is not None:
        shown["result"] = st.result_status(known.result.text, known.result.digest,
                                           known.result.json)
    return shown


__all__ = [
    "FENCES",
    "FINALIZER",
    "UNKNOWN",
    "InQueue",
    "RunFacts",
    "RunStep",
    "decide_run",
    "reads",
    "run_status",
    "should_retry",
]
