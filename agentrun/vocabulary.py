"""The one place for agentrun's words: API names, phases, reasons, conditions, labels.

Both the operator and the runner import from here; no other module spells these strings.
The names are a contract (see the API reference in docs/api.md) and must not change.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Final

GROUP: Final = "agentrun.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"

RUN_KIND: Final = "AgentRun"
RUN_PLURAL: Final = "agentruns"
REPLAY_KIND: Final = "AgentRunReplay"
REPLAY_PLURAL: Final = "agentrunreplays"
APPROVAL_KIND: Final = "AgentRunApproval"
APPROVAL_PLURAL: Final = "agentrunapprovals"
SCHEDULE_KIND: Final = "AgentRunSchedule"
SCHEDULE_PLURAL: Final = "agentrunschedules"
TRIGGER_KIND: Final = "AgentRunTrigger"
TRIGGER_PLURAL: Final = "agentruntriggers"

# The transcript of a run: an aggregated API served by the store API (an APIService, as
# metrics-server serves metrics.k8s.io), read through the Kubernetes API server.
TRANSCRIPT_GROUP: Final = "store.agentrun.dev"
TRANSCRIPT_VERSION: Final = "v1alpha1"
TRANSCRIPT_API_VERSION: Final = f"{TRANSCRIPT_GROUP}/{TRANSCRIPT_VERSION}"
TRANSCRIPT_KIND: Final = "Transcript"
TRANSCRIPT_PLURAL: Final = "transcripts"
TRANSCRIPT_SINGULAR: Final = "transcript"
# The APIService's name, as Kubernetes names them: <version>.<group>.
TRANSCRIPT_API_SERVICE: Final = f"{TRANSCRIPT_VERSION}.{TRANSCRIPT_GROUP}"


class EntryKind:
    """`entries[].kind` of a Transcript: what one line of the conversation is."""

    INPUT: Final = "input"  # the run's input, as the agent was given it
    TEXT: Final = "text"  # the model's text
    TOOL_CALL: Final = "toolCall"  # the model asks for a tool call
    TOOL_RESULT: Final = "toolResult"  # what the call returned (or the journal, or a denial)
    APPROVAL: Final = "approval"  # a call waits for a human's decision, or was decided
    ERROR: Final = "error"  # the model's error, or how an attempt failed

    ALL: Final = (INPUT, TEXT, TOOL_CALL, TOOL_RESULT, APPROVAL, ERROR)


class EntryState:
    """`entries[].state` of a Transcript's tool calls, results and decisions (absent: not
    known yet, e.g. a call still running or waiting)."""

    FINISHED: Final = "finished"  # the call ran and its end is on the ledger
    IN_DOUBT: Final = "inDoubt"  # started, its attempt ended, its end never recorded
    ANSWERED: Final = "answered"  # answered from the journal: not run again
    DENIED: Final = "denied"  # its approval was denied (or timed out): it never ran

    ALL: Final = (FINISHED, IN_DOUBT, ANSWERED, DENIED)


# Who an entry is from when it is agentrun itself (a call held for an approval, an attempt
# that failed), not the user, the agent or an approver.
TRANSCRIPT_AUTHOR: Final = "agentrun"

# A declarative agent: an ADK agent definition kept as a resource (docs/agents.md).
AGENT_KIND: Final = "Agent"
AGENT_PLURAL: Final = "agents"


class Phase:
    """AgentRun phases."""

    PENDING: Final = "Pending"
    RUNNING: Final = "Running"
    # A tool call waits for a human's decision (AgentRunApproval); no pod runs meanwhile.
    WAITING: Final = "Waiting"
    SUCCEEDED: Final = "Succeeded"
    FAILED: Final = "Failed"
    CANCELLED: Final = "Cancelled"

    TERMINAL: Final = frozenset({SUCCEEDED, FAILED, CANCELLED})
    LIVE: Final = frozenset({PENDING, RUNNING, WAITING})


class Reason:
    """AgentRun `status.reason` values (CamelCase, as Kubernetes reasons are)."""

    # Failures.
    EVICTED: Final = "Evicted"
    PREEMPTED: Final = "Preempted"
    NODE_LOST: Final = "NodeLost"
    POD_DELETED: Final = "PodDeleted"
    POD_LOST: Final = "PodLost"
    OOM_KILLED: Final = "OOMKilled"
    IMAGE_PULL_FAILED: Final = "ImagePullFailed"
    INPUT_UNAVAILABLE: Final = "InputUnavailable"
    DEADLINE_EXCEEDED: Final = "DeadlineExceeded"
    RATE_LIMITED_AFTER_TOOL_CALL: Final = "RateLimitedAfterToolCall"
    AGENT_ERROR: Final = "AgentError"
    # The agent spent what it was allowed (tokens, money, model calls) and stopped.
    BUDGET_EXCEEDED: Final = "BudgetExceeded"
    # spec.limits sets maxCostMicroUSD and a model of the run has no known price.
    PRICE_UNKNOWN: Final = "PriceUnknown"
    # The agent stopped to wait for a human's approval of its next step.
    AWAITING_APPROVAL: Final = "AwaitingApproval"
    STALE: Final = "Stale"
    # Refused at launch, before any pod: no tool can have run (toolsExecuted []).
    MODEL_NOT_ALLOWED: Final = "ModelNotAllowed"
    # The API server refused the runner pod as invalid (422): it never will accept it.
    POD_INVALID: Final = "PodInvalid"
    SESSION_BUSY: Final = "SessionBusy"
    SESSION_NOT_OWNED: Final = "SessionNotOwned"
    # spec.agent names no Agent of the run's namespace and no directory of the runner
    # image (the runner reports it), or the Agent snapshot a replay pins is gone (the
    # operator, at launch).
    AGENT_NOT_FOUND: Final = "AgentNotFound"
    # The Agent cannot be built: at launch (a sub-agent missing, a cycle, no model), or by
    # the runner (a function that does not import, a tool filter the server does not serve).
    AGENT_INVALID: Final = "AgentInvalid"
    # An MCP server of the Agent did not answer its tool listing before the first model call.
    TOOL_SERVER_UNAVAILABLE: Final = "ToolServerUnavailable"
    # The call the runner opened after an approval is not the call approved: its arguments'
    # digest differs from the approval's (the store API refuses the open; nothing ran).
    APPROVAL_MISMATCH: Final = "ApprovalMismatch"
    # A less trusted source loosens a tool's effect or approval that a more trusted one
    # declared (agentrun.policy): at launch by the operator, or by the runner (which alone
    # sees the image's code) before the first model call.
    POLICY_VIOLATION: Final = "PolicyViolation"
    # Non-failures.
    CREATED: Final = "Created"
    POD_CREATED: Final = "PodCreated"
    STARTED: Final = "Started"
    RETRYING: Final = "Retrying"
    RESUMING: Final = "Resuming"
    # Pending, and saying why (when the operator cannot act, or the pod cannot start).
    POD_CREATE_FAILED: Final = "PodCreateFailed"
    # The attempt's pod waits for Kueue's admission (its scheduling gate), in a queue.
    QUEUED: Final = "Queued"
    POD_WAITING: Final = "PodWaiting"
    POD_UNSCHEDULABLE: Final = "Unschedulable"
    INPUT_FORBIDDEN: Final = "InputForbidden"
    SUCCEEDED: Final = "Succeeded"
    CANCELLED: Final = "Cancelled"
    # Cancelled in place: the annotation agentrun.dev/cancel stopped the run and kept it.
    CANCEL_REQUESTED: Final = "CancelRequested"

    # The failure reasons a runner may report for its own attempt (the store API refuses
    # any other): every reason that would say "nothing ran" is the operator's alone.
    # The Agent reasons are the runner's to find (its image, its MCP servers); they end an
    # attempt before the first model call, and toolsExecuted is counted all the same.
    RUNNER_REPORTED: Final = frozenset({AGENT_ERROR, RATE_LIMITED_AFTER_TOOL_CALL,
                                        BUDGET_EXCEEDED, PRICE_UNKNOWN, AWAITING_APPROVAL,
                                        AGENT_NOT_FOUND, AGENT_INVALID,
                                        TOOL_SERVER_UNAVAILABLE, APPROVAL_MISMATCH,
                                        POLICY_VIOLATION})
    # What an attempt's recorded outcome may say: the runner's reasons, and the store API's
    # own observation that the run's input snapshot is gone.
    RECORDED: Final = RUNNER_REPORTED | {INPUT_UNAVAILABLE}


class ReplayPhase:
    """AgentRunReplay phases."""

    PENDING: Final = "Pending"
    APPROVED: Final = "Approved"
    REFUSED: Final = "Refused"


class ReplayReason:
    """AgentRunReplay `status.reason` values: the rows of the decision table."""

    NO_TOOLS_EXECUTED: Final = "NoToolsExecuted"
    FORCED: Final = "Forced"
    ORIGINAL_SUCCEEDED: Final = "OriginalSucceeded"
    ORIGINAL_RUNNING: Final = "OriginalRunning"
    TOOLS_EXECUTED: Final = "ToolsExecuted"
    TOOL_STATE_UNKNOWN: Final = "ToolStateUnknown"
    INPUT_GONE: Final = "InputGone"
    RUN_NOT_FOUND: Final = "RunNotFound"
    ALREADY_REPLAYED: Final = "AlreadyReplayed"
    # Approved, but the replay run could not be created (condition Approved Unknown).
    RUN_CREATION_FAILED: Final = "RunCreationFailed"
    # Resume (spec.resume on a replay, spec.retry.resume on a run).
    RESUMABLE: Final = "Resumable"
    TOOL_CALL_IN_DOUBT: Final = "ToolCallInDoubt"
    JOURNAL_UNAVAILABLE: Final = "JournalUnavailable"
    # The requester may not use what the replay run would (its Secrets, ConfigMaps, image,
    # ServiceAccount): never overridden by force.
    NOT_AUTHORIZED: Final = "NotAuthorized"


class ConcurrencyPolicy:
    """AgentRunSchedule `spec.concurrencyPolicy`: what a slot does while a run is live."""

    FORBID: Final = "Forbid"  # the slot is skipped (the default)
    ALLOW: Final = "Allow"  # the slot's run starts beside the live one
    REPLACE: Final = "Replace"  # the live run is cancelled in place, then the slot's starts

    ALL: Final = (FORBID, ALLOW, REPLACE)


class ScheduleReason:
    """Reasons of an AgentRunSchedule's conditions and Events."""

    # Conditions.
    SCHEDULED: Final = "Scheduled"  # Ready: slots come due and runs are started
    SUSPENDED: Final = "Suspended"  # Ready: spec.suspend, no run is started
    INVALID_SCHEDULE: Final = "InvalidSchedule"  # Stalled: the schedule or zone cannot be parsed
    # Events.
    RUN_CREATED: Final = "RunCreated"
    SLOT_SKIPPED: Final = "SlotSkipped"
    SLOT_MISSED: Final = "SlotMissed"
    REPLACING: Final = "Replacing"
    RUN_DELETED: Final = "RunDeleted"
    RUN_CREATION_FAILED: Final = "RunCreationFailed"


class TriggerReason:
    """Reasons of an AgentRunTrigger's conditions (Ready, Stalled)."""

    # Ready: deliveries to status.url start runs.
    LISTENING: Final = "Listening"
    # Ready: spec.suspend; deliveries are answered 503, so that their senders deliver again.
    SUSPENDED: Final = "Suspended"
    # Stalled: the Secret (or its key) that spec.auth names is not there; deliveries are
    # answered 503 until it is.
    SECRET_NOT_FOUND: Final = "SecretNotFound"
    # Stalled: spec.auth or spec.identity cannot be read (admission refuses such a trigger;
    # this says so where the admission policies are not installed).
    INVALID: Final = "InvalidTrigger"


class TriggerIdentity:
    """`spec.identity` of an AgentRunTrigger: what makes two deliveries one event."""

    # The string form: the CloudEvent's source and id (binary or structured mode).
    CLOUDEVENTS: Final = "cloudevents"
    # The object forms: a request header's value, or a JSON pointer into the body.
    HEADER: Final = "header"
    JSON_POINTER: Final = "jsonPointer"


class TriggerResult:
    """How the receiver answered a delivery: the `result` label of
    agentrun_trigger_events_total, one per status it answers with."""

    CREATED: Final = "created"  # 201: the event's run was created
    DUPLICATE: Final = "duplicate"  # 200: the event's run already exists
    UNAUTHORIZED: Final = "unauthorized"  # 401: no or a wrong signature or token
    TOO_LARGE: Final = "too_large"  # 413: over spec.maxBodyBytes
    MALFORMED: Final = "malformed"  # 400: not an event the trigger can read
    RATE_LIMITED: Final = "rate_limited"  # 429: over spec.maxRunsPerMinute
    # 503: suspended, its Secret missing, or the API server cannot be reached.
    UNAVAILABLE: Final = "unavailable"
    # 409: a run (or event ConfigMap) of the event's name exists and is not this event's.
    CONFLICT: Final = "conflict"

    ALL: Final = (CREATED, DUPLICATE, UNAUTHORIZED, TOO_LARGE, MALFORMED, RATE_LIMITED,
                  UNAVAILABLE, CONFLICT)


class Condition:
    """Condition types and the reasons of the ToolsExecuted condition."""

    SUCCEEDED: Final = "Succeeded"
    TOOLS_EXECUTED: Final = "ToolsExecuted"
    APPROVED: Final = "Approved"
    RESUMABLE: Final = "Resumable"
    # True while a tool call of the run waits for an AgentRunApproval.
    APPROVAL_PENDING: Final = "ApprovalPending"
    # The conditions kstatus (Flux, kubectl wait, cli-utils) and Argo CD read.
    READY: Final = "Ready"
    RECONCILING: Final = "Reconciling"
    STALLED: Final = "Stalled"
    # Kueue: False (reason Queued, Kueue's own message) while the attempt's pod waits for
    # quota; True once admitted.
    ADMITTED: Final = "Admitted"

    TOOL_CALLS_RECORDED: Final = "ToolCallsRecorded"
    NO_TOOL_CALLS: Final = "NoToolCalls"
    TOOL_STATE_UNKNOWN: Final = "ToolStateUnknown"


class AgentReason:
    """The reasons of an Agent's conditions (Ready, Stalled): why it can or cannot run."""

    VALID: Final = "Valid"
    # Its definition (with the Agents it names) cannot be built: AgentRun reason AgentInvalid.
    INVALID: Final = "AgentInvalid"
    # A Secret (or a key of it) that a header's valueFrom names does not exist: a run's pod
    # waits for it, as for any env var from a missing Secret.
    SECRET_NOT_FOUND: Final = "SecretNotFound"


class ApprovalPhase:
    """AgentRunApproval phases."""

    ACCEPTED: Final = "Accepted"
    REJECTED: Final = "Rejected"


class ApprovalReason:
    """AgentRunApproval `status.reason` values: the rows of its decision table."""

    DECIDED: Final = "Decided"
    NOT_PENDING: Final = "NotPending"
    ARGS_MISMATCH: Final = "ArgsMismatch"
    ALREADY_DECIDED: Final = "AlreadyDecided"
    RUN_NOT_FOUND: Final = "RunNotFound"
    # The approver is the run's creator (annotation agentrun.dev/created-by): four eyes.
    SELF_APPROVAL: Final = "SelfApproval"


class ApprovalDecision:
    """`spec.decision` of an AgentRunApproval, and the approver a timeout decides as."""

    APPROVE: Final = "Approve"
    DENY: Final = "Deny"
    ALL: Final = (APPROVE, DENY)
    TIMEOUT_APPROVER: Final = "timeout"


class Approval:
    """`spec.tools[].approval`: whether a tool's calls wait for a human's decision."""

    REQUIRED: Final = "Required"
    NONE: Final = "None"
    DEFAULT_TIMEOUT_SECONDS: Final = 86400


class Trigger:
    """What started a run (`spec.trigger`)."""

    MANUAL: Final = "manual"
    SCHEDULE: Final = "schedule"
    CHAT: Final = "chat"
    WORKFLOW: Final = "workflow"
    WEBHOOK: Final = "webhook"
    # An AgentRunTrigger's run: the trigger receiver made it for one incoming event.
    EVENT: Final = "event"

    ALL: Final = (MANUAL, SCHEDULE, CHAT, WORKFLOW, WEBHOOK, EVENT)


# Labels and annotations.
LABEL_RUN: Final = f"{GROUP}/run"
LABEL_ATTEMPT: Final = f"{GROUP}/attempt"
LABEL_REPLAY_OF: Final = f"{GROUP}/replay-of"
# On a schedule's run: the AgentRunSchedule that started it.
LABEL_SCHEDULE: Final = f"{GROUP}/schedule"
# On a trigger's run (and its event ConfigMap): the AgentRunTrigger whose receiver made it.
LABEL_TRIGGER: Final = f"{GROUP}/trigger"
# On a trigger's run (and its event ConfigMap): the event's identity as the trigger reads
# it (spec.identity), which names the run; an annotation, since an event id is not a valid
# label value.
ANNOTATION_EVENT_ID: Final = f"{GROUP}/event-id"
# A trigger's run's input file, the event (the ConfigMap <run>-event holds it).
EVENT_FILE: Final = "event.json"
# Cancel in place: "true" stops a live run and keeps it (Cancelled, CancelRequested); the
# note, if any, goes into the run's message.
ANNOTATION_CANCEL: Final = f"{GROUP}/cancel"
ANNOTATION_CANCEL_NOTE: Final = f"{GROUP}/cancel-note"
ANNOTATION_FORCE_REPLAY: Final = f"{GROUP}/force-replay"
# On a replay run (set by the operator with spec.replayOf): the original's input snapshot.
ANNOTATION_INPUT_DIGEST: Final = f"{GROUP}/input-digest"
# Who asked for an AgentRunReplay, as the API server knew them: written at admission by the
# policy agentrun-replay-requester (the groups joined by ","), never by anyone else.
ANNOTATION_REQUESTED_BY: Final = f"{GROUP}/requested-by"
ANNOTATION_REQUESTED_BY_GROUPS: Final = f"{GROUP}/requested-by-groups"
# Who created an AgentRun, as the API server knew them: written at admission by the policy
# agentrun-run-creator; on the runs the operator creates, by the operator (a schedule's run:
# ANNOTATION_TEMPLATE_BY of its schedule; a replay run: its replay's requester), and on a
# trigger's runs by the trigger receiver (ANNOTATION_TEMPLATE_BY of its trigger). Immutable.
# That user may not approve the run's calls (ApprovalReason.SELF_APPROVAL).
ANNOTATION_CREATED_BY: Final = f"{GROUP}/created-by"
# On an AgentRunSchedule or AgentRunTrigger: who last wrote its spec.runTemplate, written at
# admission by the same policy; its runs are created by that user's leave, so they carry
# that user.
ANNOTATION_TEMPLATE_BY: Final = f"{GROUP}/template-by"
# The RBAC verb on agentrunreplays that allows setting ANNOTATION_FORCE_REPLAY.
VERB_FORCE: Final = "force"
FORCER_CLUSTER_ROLE: Final = "agentrun-replay-forcer"
# Who may create AgentRunApprovals (agentrun-edit may not).
APPROVER_CLUSTER_ROLE: Final = "agentrun-approver"

# The trigger receiver: where it serves deliveries (/v1/triggers/<namespace>/<name>), and
# who it is to the admission policies, as the operator is: its ServiceAccount in a cluster,
# the group below for one run outside (`make run`).
RECEIVER_PATH: Final = "/v1/triggers"
RECEIVER_GROUP: Final = "agentrun:receivers"
RECEIVER_SERVICE_ACCOUNT: Final = "agentrun-receiver"

class Kueue:
    """Kueue's words that agentrun reads or writes (its pod integration's contract)."""

    GROUP: Final = "kueue.x-k8s.io"
    # The Workload of a gated pod: its QuotaReserved condition says why it waits.
    WORKLOAD_PLURAL: Final = "workloads"
    WORKLOAD_CRD: Final = "workloads.kueue.x-k8s.io"
    # The versions of Workloads read, newest first (the first the cluster serves is used).
    WORKLOAD_VERSIONS: Final = ("v1beta2", "v1beta1")
    # On an AgentRun, copied to each of its runner pods: Kueue admits the pod against
    # the LocalQueue's ClusterQueue, at the WorkloadPriorityClass's priority.
    LABEL_QUEUE_NAME: Final = "kueue.x-k8s.io/queue-name"
    LABEL_PRIORITY_CLASS: Final = "kueue.x-k8s.io/priority-class"
    # The scheduling gate Kueue's pod webhook puts on a pod until it is admitted.
    ADMISSION_GATE: Final = "kueue.x-k8s.io/admission"
    # The finalizer Kueue's pod webhook puts on a pod; Kueue removes it once it has seen
    # the pod end (while Kueue is down, a deleted pod stays Terminating).
    POD_FINALIZER: Final = "kueue.x-k8s.io/managed"
    # The pod condition Kueue sets before it deletes a pod it stops, and the prefix of the
    # reasons of its evictions (WorkloadEvictedDueToPreempted, ...DueToPodsReadyTimeout,
    # ...DueToClusterQueueStopped, ...DueToDeactivated).
    TERMINATION_TARGET: Final = "TerminationTarget"
    EVICTED_REASON_PREFIX: Final = "WorkloadEvicted"
    # Workload conditions.
    QUOTA_RESERVED: Final = "QuotaReserved"
    ADMITTED: Final = "Admitted"
    LABELS: Final = (LABEL_QUEUE_NAME, LABEL_PRIORITY_CLASS)


# Development node simulation (development tooling only; never acted on in production).
ANNOTATION_SIMULATE: Final = "dev.agentrun.dev/simulate"
SIMULATE_NODE_PRESSURE_EVICTION: Final = "node-pressure-eviction"
SIMULATE_OOM: Final = "oom"
SIMULATE_LOST: Final = "lost"

DEFAULT_USER_ID: Final = "default"
DEFAULT_STALE_SECONDS: Final = 6 * 3600
DEFAULT_TOLERATION_SECONDS: Final = 30

# The scripted model (deterministic, offline runs) and where it reads its script.
SCRIPTED_MODEL: Final = "scripted"
ENV_SCRIPT: Final = "AGENTRUN_SCRIPT"
# Store location, for the operator and the store API (never for runners: they hold no
# database credential and reach the store through the store API).
ENV_DATABASE_URL: Final = "DATABASE_URL"
# The audience of the projected ServiceAccount token a runner presents to the store API:
# its own, so that the token is worth nothing to the Kubernetes API server (and a token
# for the API server is worth nothing to the store API).
STORE_AUDIENCE: Final = "agentrun.dev/store"
# Where the runner pod's projected store token is mounted, and its file name.
STORE_TOKEN_DIR: Final = "/var/run/secrets/agentrun.dev/store"
STORE_TOKEN_FILE: Final = "token"
# The projected token's lifetime; the kubelet refreshes it at 80% of that.
STORE_TOKEN_SECONDS: Final = 3600
# What TokenReview puts in `extra` for a token bound to a pod.
TOKEN_EXTRA_POD_NAME: Final = "authentication.kubernetes.io/pod-name"
TOKEN_EXTRA_POD_UID: Final = "authentication.kubernetes.io/pod-uid"


class RunnerEnv:
    """Environment variables the operator sets on a runner pod and the runner reads."""

    NAMESPACE: Final = "AGENTRUN_NAMESPACE"
    RUN_NAME: Final = "AGENTRUN_RUN_NAME"
    RUN_UID: Final = "AGENTRUN_RUN_UID"
    ATTEMPT: Final = "AGENTRUN_ATTEMPT"
    AGENT: Final = "AGENTRUN_AGENT"
    USER_ID: Final = "AGENTRUN_USER_ID"
    SESSION_ID: Final = "AGENTRUN_SESSION_ID"
    MODEL: Final = "AGENTRUN_MODEL"
    INPUT_DIGEST: Final = "AGENTRUN_INPUT_DIGEST"
    TRIGGER: Final = "AGENTRUN_TRIGGER"
    AGENTS_DIR: Final = "AGENTRUN_AGENTS_DIR"
    # The store API (URL) and the projected token file the runner presents to it.
    STORE_URL: Final = "AGENTRUN_STORE_URL"
    STORE_TOKEN_FILE: Final = "AGENTRUN_STORE_TOKEN_FILE"
    # The CA (PEM) the runner verifies the store API's certificate with.
    STORE_CA: Final = "AGENTRUN_STORE_CA"
    # "true" only when the operator runs with --allow-scripted-model; set last, after the
    # user's env, so that a run cannot turn it on for itself.
    ALLOW_SCRIPTED_MODEL: Final = "AGENTRUN_ALLOW_SCRIPTED_MODEL"
    # spec.tools (JSON): the effect class of each named tool.
    TOOLS: Final = "AGENTRUN_TOOLS"
    # spec.limits (JSON), and the operator's modelPrices (JSON) the runner prices calls by.
    LIMITS: Final = "AGENTRUN_LIMITS"
    MODEL_PRICES: Final = "AGENTRUN_MODEL_PRICES"
    # The digest of the Agent snapshot the run pinned at launch (empty: an image agent);
    # the runner asks the store API for that snapshot, by the run its token speaks for.
    AGENT_DIGEST: Final = "AGENTRUN_AGENT_DIGEST"
    # The chart's toolPolicy (JSON, as spec.tools): the most trusted word on what a tool
    # does and whether it waits for an approval (agentrun.policy).
    TOOL_POLICY: Final = "AGENTRUN_TOOL_POLICY"


# Where the operator puts, through valueFrom (the kubelet resolves it), the value of each
# MCP header an Agent takes from a Secret: this prefix and a digest of (agent, server,
# header) (agentrun.agents.header_env). Never in the snapshot, never in a status.
MCP_HEADER_ENV_PREFIX: Final = "AGENTRUN_MCP_HEADER_"
# The request header that carries a call's idempotency key to an MCP server, per call.
HEADER_IDEMPOTENCY_KEY: Final = "Idempotency-Key"


class LoaderEnv:
    """What `spec.env` may not set: variables that change how a process loads or runs code.

    Each is read before the runner's first line (by Python, the dynamic loader, the C
    library) or by a program the runner or an agent may start (a shell, a browser command,
    another interpreter), and makes it load or run code the run's creator chooses: code
    that would hold the run's store token and act outside the ledger. The CRD refuses them
    (crds/agentrun.dev_agentruns.yaml, spec.env[].name) with the reason below, and the
    runner's launcher (runner-image/launcher/agentrun-runner.c) removes them before Python
    starts isolated. Those two spell the lists again; tests fail when they drift.
    """

    # The reason completes "spec.env may not set X: it changes how the runner's processes
    # load or run code (...)". No quotes: it is pasted into a CEL string literal.
    PREFIXES: Final = MappingProxyType({
        "PYTHON": "Python reads it before the first line of the runner: PYTHONPATH, "
                  "PYTHONHOME, PYTHONSTARTUP, PYTHONUSERBASE and PYTHONWARNINGS can import "
                  "or run any module",
        "LD_": "the dynamic loader reads it before the first line of every program: "
               "LD_PRELOAD, LD_AUDIT and LD_LIBRARY_PATH load shared libraries of its choosing",
        "DYLD_": "the macOS dynamic loader reads it as Linux reads LD_, to load libraries",
        "BASH_FUNC_": "bash imports a shell function from it that replaces a command its "
                      "scripts run",
        "OPENSSL_": "OpenSSL reads it: OPENSSL_CONF, OPENSSL_ENGINES and OPENSSL_MODULES load "
                    "engines and providers, which are shared libraries",
    })
    NAMES: Final = MappingProxyType({
        "PATH": "it decides which program a command name starts",
        "BROWSER": "the webbrowser module of Python runs the command it names, and a warnings "
                   "filter can import a module that opens a browser",
        "GOOGLE_EXTERNAL_ACCOUNT_ALLOW_EXECUTABLES": "it lets google-auth run the command a "
                                                     "credentials file names",
        # The C library: what glibc itself drops for setuid programs (unsecvars.h), less
        # TMPDIR (see KEPT), and the loader's LD_ family above.
        "GLIBC_TUNABLES": "the loader of the C library parses it before the first line of "
                          "every program, and it has been a way to run code (CVE-2023-4911)",
        "GCONV_PATH": "the C library loads character set converters, shared libraries, from it",
        "GETCONF_DIR": "getconf runs the programs it finds there",
        "LOCPATH": "the C library loads and trusts the locale data it finds there",
        "NLSPATH": "the C library loads message catalogs, used as format strings, from it",
        "MALLOC_TRACE": "the allocator of the C library writes a trace to the file it names",
        "TZDIR": "the C library parses the time zone files it finds there",
        "HOSTALIASES": "it rewrites the host names the C library looks up, so the runner "
                       "could send its store token to another host",
        "LOCALDOMAIN": "it changes the domains the C library searches host names in",
        "RES_OPTIONS": "it changes how the C library resolves host names",
        "RESOLV_HOST_CONF": "it names another host configuration for the C library lookups",
        "NIS_PATH": "it changes where the C library sends its NIS+ lookups",
        # Shells, which a tool may start.
        "BASH_ENV": "bash expands it, command substitutions included, and runs the file it "
                    "names before every script",
        "ENV": "a POSIX shell expands it and runs the file it names when it starts",
        "SHELLOPTS": "bash turns on the options it lists, and xtrace runs PS4",
        "BASHOPTS": "bash turns on the shell options it lists",
        "PS4": "bash expands it, command substitutions included, before every traced line",
        # Interpreters an agent image may add (an MCP server started with npx, ...).
        "NODE_OPTIONS": "Node.js takes options from it, and --require loads any module",
        "NODE_PATH": "Node.js loads modules from it",
        "PERL5OPT": "Perl takes options from it, and -M loads any module",
        "PERL5LIB": "Perl loads modules from it",
        "PERLLIB": "Perl loads modules from it",
        "PERL5DB": "Perl runs it as its debugger",
        "RUBYOPT": "Ruby takes options from it, and -r loads any library",
        "RUBYLIB": "Ruby loads libraries from it",
        "JAVA_TOOL_OPTIONS": "the JVM takes options from it, and -javaagent loads any code",
        "JDK_JAVA_OPTIONS": "the JVM takes options from it, and -javaagent loads any code",
        "_JAVA_OPTIONS": "the JVM takes options from it, and -javaagent loads any code",
        "CLASSPATH": "the JVM loads classes from it",
    })
    # Decided the other way, and why (docs/security.md lists them; the tests set them).
    KEPT: Final = MappingProxyType({
        "TMPDIR": "glibc drops it for setuid programs because of their temporary files; for "
                  "the runner it only moves them, and its /tmp is its own",
        "HOME": "where programs keep their files; the runner image sets it to /tmp",
        "HTTPS_PROXY": "where model and tool requests go through (never the store API "
                       "requests); it loads no code",
        "NO_PROXY": "which hosts are reached without the proxy",
        "SSL_CERT_FILE": "which certificate authorities TLS trusts; it loads no code",
        "GOOGLE_APPLICATION_CREDENTIALS": "the credentials file of Google models; google-auth "
                                          "runs a command from it only when "
                                          "GOOGLE_EXTERNAL_ACCOUNT_ALLOW_EXECUTABLES is set",
        "OPENAI_API_KEY": "a model key, configuration of the agent",
        "TZ": "the time zone, read from the system time zone files",
        "LANG": "the locale, read from the system locale files",
        ENV_SCRIPT: "the script of the scripted model, which the operator allows or not",
    })


class RunnerExit:
    """Runner exit codes, so that the operator can tell a refusal from an agent failure."""

    SUCCESS: Final = 0
    AGENT_ERROR: Final = 1
    USAGE: Final = 2
    NO_DURABLE_STORE: Final = 3
    INPUT_UNAVAILABLE: Final = 4
    RATE_LIMITED_AFTER_TOOL_CALL: Final = 5
    STORE_UNAVAILABLE: Final = 6
    BUDGET_EXCEEDED: Final = 7
    PRICE_UNKNOWN: Final = 8
    AWAITING_APPROVAL: Final = 9
    AGENT_NOT_FOUND: Final = 10
    AGENT_INVALID: Final = 11
    TOOL_SERVER_UNAVAILABLE: Final = 12
    POLICY_VIOLATION: Final = 13


class RunStatus:
    """The `status` column of the run store's runs and attempts (lowercase, store-internal).

    A live status may still change; a settled one never does (see `agentrun.store.settle`).
    """

    PENDING: Final = "pending"
    RUNNING: Final = "running"
    SUCCEEDED: Final = "succeeded"
    FAILED: Final = "failed"
    CANCELLED: Final = "cancelled"

    LIVE: Final = frozenset({PENDING, RUNNING})
    TERMINAL: Final = frozenset({SUCCEEDED, FAILED, CANCELLED})


class LedgerOutcome:
    """The `outcome` of a tool-call ledger row; NULL means the tool has not answered."""

    OK: Final = "ok"
    ERROR: Final = "error"
    # Not run: answered from the journal (the call had finished in an earlier attempt).
    JOURNAL: Final = "journal"
    # Not run: its approval was denied (or timed out); the model got the denial as result.
    DENIED: Final = "denied"
    # Rows of these outcomes are calls that did not run in their attempt.
    NOT_RUN: Final = frozenset({JOURNAL, DENIED})


# Test hook of the sample agents only: the named tool kills its runner with os._exit right
# after recording its side effect and before answering (a tool that acted, then crashed).
ENV_TEST_CRASH_IN: Final = "AGENTRUN_TEST_CRASH_IN"
# Test hook of the runner's ledger: right after the named tool's end is on the ledger, and
# before ADK puts its response into the session, the runner dies (os._exit): a call that
# finished, whose answer never reached the session.
ENV_TEST_CRASH_AFTER_CLOSE: Final = "AGENTRUN_TEST_CRASH_AFTER_CLOSE"
# The scripted model appends each request it receives (JSON, one per line) to this file.
ENV_SCRIPT_TRANSCRIPT: Final = "AGENTRUN_SCRIPT_TRANSCRIPT"
# Long-term memory entries expire after this many days (runner env, default 90).
ENV_MEMORY_TTL_DAYS: Final = "AGENTRUN_MEMORY_TTL_DAYS"
DEFAULT_MEMORY_TTL_DAYS: Final = 90
