"""Who an attempt is, on both sides of the wire between a runner and the store API.

One attempt of one run: the store API learns it from the pod's token and the store (what
the operator wrote down before the pod), the runner reads it from its environment and
then from the store API's answer, whose word counts. The same `AttemptIdentity` serves
the store (`store.attempt_identity`), the store API (the attempt a request speaks for)
and the runner (its configuration, and what the store API said); `AttemptStart` is the
store API's answer when an attempt begins: who it is, and where it starts from.

The answer's JSON is written and read here only (`to_wire`, `from_wire`). The store's own
facts of an attempt (its pod, the ADK app its session lives under, the attempt it
resumes) stay with the store API and are not sent: the runner learns what it resumes as
the invocation it continues.

The standard library only: the runner, the store API and the store all import it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# The JSON names of the identity's fields on the wire, in the answer's order.
_WIRE_NAMES = (("namespace", "namespace"), ("run_name", "runName"), ("run_uid", "runUid"),
               ("attempt", "attempt"), ("agent", "agent"), ("user_id", "userId"),
               ("session_id", "sessionId"), ("input_digest", "inputDigest"))


@dataclass(frozen=True)
class AttemptIdentity:
    """Attempt `attempt` of the AgentRun `namespace`/`run_name` (uid `run_uid`): its
    agent, the user and ADK session it speaks as, and the input snapshot it runs on."""

    namespace: str
    run_name: str
    run_uid: str
    attempt: int
    agent: str
    user_id: str
    session_id: str
    input_digest: str | None
    # Known where the store is read (the store API), never sent to the runner: the pod the
    # operator recorded for the attempt (None: none recorded), the namespaced ADK app its
    # session lives under (store.session_app), and the attempt it resumes (of the run
    # `resumes_run_uid` when it forks another run's session).
    pod: str | None = None
    app_name: str = ""
    resumes_attempt: int | None = None
    resumes_run_uid: str | None = None

    def to_wire(self) -> dict[str, Any]:
        """The identity as the store API tells it to the runner (JSON)."""
        return {name: getattr(self, attr) for attr, name in _WIRE_NAMES}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> AttemptIdentity:
        """The identity the store API told (`to_wire`'s JSON); KeyError when a part of it
        is missing, the input digest excepted."""
        told: dict[str, Any] = {attr: data.get(name) if attr == "input_digest" else data[name]
                                for attr, name in _WIRE_NAMES}
        return cls(**{**told, "attempt": int(told["attempt"])})


@dataclass(frozen=True)
class AttemptStart:
    """The store API's answer to an attempt that begins (and to one that asks again):
    who it is, and where it starts from."""

    identity: AttemptIdentity
    # Idempotency keys are the lineage's: a replay run's root is its original's uid.
    root_run_uid: str
    # The invocation this attempt continues, when it resumes an earlier one.
    resume_invocation: str | None = None
    # What the run used before this attempt, where spec.limits' count starts (a resume
    # continues it): the store's camelCase usage.
    usage: dict[str, Any] = field(default_factory=dict)
    # The decisions on the run's calls that waited for one, by call id: {decision,
    # approver, note}.
    decisions: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_wire(self) -> dict[str, Any]:
        return {**self.identity.to_wire(), "rootRunUid": self.root_run_uid,
                "resumeInvocation": self.resume_invocation, "usage": self.usage,
                "decisions": self.decisions}

    @classmethod
    def from_wire(cls, data: Mapping[str, Any]) -> AttemptStart:
        identity = AttemptIdentity.from_wire(data)
        return cls(identity=identity, root_run_uid=data.get("rootRunUid") or identity.run_uid,
                   resume_invocation=data.get("resumeInvocation"),
                   usage=dict(data.get("usage") or {}),
                   decisions=dict(data.get("decisions") or {}))
