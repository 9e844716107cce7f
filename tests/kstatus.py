"""kstatus: how Flux (kustomize-controller and helm-controller health checks), `kubectl
apply --wait`-style tools built on cli-utils, and cli-utils itself judge a custom resource.

The verdicts are cli-utils' own: `compute` asks devtools/peers/kstatus, a small Go command
over sigs.k8s.io/cli-utils/pkg/kstatus/status (the version its wrapper module pins,
v0.37.2), built by devtools/peers/build.sh (`make peers`). Nothing here reads the rules;
what follows is what cli-utils does, so that a reader of the tests knows why an object is
judged as it is:

- status.go, `Compute` and `checkReadyCondition`;
- generic.go, `checkGenericProperties` and `checkGeneration`;
- util.go, `newInProgressStatus`, `newReconcilingCondition`, `GetObjectWithConditions`.

In order, first match wins:

1. metadata.deletionTimestamp set -> Terminating, "Resource scheduled for deletion".
2. metadata.generation and status.observedGeneration both present and different ->
   InProgress, Reconciling reason LatestGenerationNotObserved. A missing observedGeneration
   is no evidence either way (step skipped).
3. The conditions, in list order: the first that is Reconciling=True -> InProgress (its
   reason and message); the first that is Stalled=True -> Failed (its message).
4. Kinds with a rule of their own (core.go: Deployment, StatefulSet, Pod, Job, Service,
   CRD, ...) are judged by that rule; none of ours is one of them.
5. The first condition of type Ready: True -> Current "Resource is Ready"; False or
   Unknown -> InProgress with its reason and message; any other status: the next Ready.
6. Otherwise Current, "Resource is current". So an object with no status at all is Current
   to kstatus: it cannot tell "not yet looked at" from "nothing to report". That is why
   the operator writes Reconciling=True on the first status it writes.

A status field of the wrong type (observedGeneration a string or a float, conditions not a
list, a condition's status not a string) is an error to cli-utils: `compute` raises
ValueError with its message.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from agentrun_devtools import peers

IN_PROGRESS = "InProgress"
FAILED = "Failed"
CURRENT = "Current"
TERMINATING = "Terminating"

RECONCILING = "Reconciling"
STALLED = "Stalled"


@dataclass(frozen=True)
class Condition:
    type: str
    status: str
    reason: str = ""
    message: str = ""


@dataclass(frozen=True)
class Result:
    status: str
    message: str
    conditions: list[Condition] = field(default_factory=list)


def _result(answer: dict[str, Any]) -> Result:
    if answer.get("error"):
        raise ValueError(answer["error"])
    return Result(answer["status"], answer.get("message", ""),
                  [Condition(**c) for c in answer.get("conditions") or []])


def compute_all(objects: Iterable[dict[str, Any]]) -> list[Result]:
    """cli-utils' verdict (status.Compute) on each of `objects`, decoded objects as
    `kubectl get -o json` prints them, in one run of the command."""
    return [_result(a) for a in peers.run("kstatus", objects=list(objects))]


def compute(obj: dict[str, Any]) -> Result:
    """cli-utils' verdict (status.Compute) on `obj`, a decoded object as `kubectl get -o
    json` prints it."""
    (result,) = compute_all([obj])
    return result
