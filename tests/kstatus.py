"""kstatus: how Flux (kustomize-controller and helm-controller health checks), `kubectl
apply --wait`-style tools built on cli-utils, and cli-utils itself judge a custom resource.

A port of the rules, for objects of kinds without a kind-specific rule (every custom
resource, ours included), of sigs.k8s.io/cli-utils/pkg/kstatus/status at v0.37.2
(commit 0a569f59bebe08eb86f0fb530741343b10e01249; the rules are unchanged on main as of
October 2025):

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
4. (Kinds with their own rule, Deployment, Pod, Job, ...: not ported; `compute` refuses
   them.)
5. The first condition of type Ready: True -> Current "Resource is Ready"; False or
   Unknown -> InProgress with its reason and message; any other status: the next Ready.
6. Otherwise Current, "Resource is current". So an object with no status at all is Current
   to kstatus: it cannot tell "not yet looked at" from "nothing to report". That is why
   the operator writes Reconciling=True on the first status it writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

IN_PROGRESS = "InProgress"
FAILED = "Failed"
CURRENT = "Current"
TERMINATING = "Terminating"

RECONCILING = "Reconciling"
STALLED = "Stalled"

# Kinds that kstatus judges by a rule of their own (core.go, legacyTypes), as
# "group/Kind" ("Kind" for the core group).
KIND_RULES = frozenset({
    "Service", "Pod", "Secret", "PersistentVolumeClaim", "ConfigMap",
    "apps/StatefulSet", "apps/DaemonSet", "extensions/DaemonSet", "apps/Deployment",
    "extensions/Deployment", "apps/ReplicaSet", "extensions/ReplicaSet",
    "policy/PodDisruptionBudget", "batch/CronJob", "batch/Job",
    "apiextensions.k8s.io/CustomResourceDefinition",
})


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


def _in_progress(reason: str, message: str) -> Result:
    return Result(IN_PROGRESS, message, [Condition(RECONCILING, "True", reason, message)])


def _nested(obj: dict[str, Any], *path: str) -> tuple[Any, bool]:
    here: Any = obj
    for key in path:
        if not isinstance(here, dict) or key not in here:
            return None, False
        here = here[key]
    return here, True


def _nested_int(obj: dict[str, Any], *path: str) -> int | None:
    value, found = _nested(obj, *path)
    if not found:
        return None
    # unstructured.NestedInt64: an int64 or an error, never a float or a string.
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{'.'.join(path)} is {type(value).__name__}, not an integer")
    return value


def _conditions(obj: dict[str, Any]) -> list[Condition]:
    """status.conditions as the Go converter reads them (FromUnstructured into
    BasicCondition): absent fields empty, a wrongly typed one an error."""
    raw, found = _nested(obj, "status", "conditions")
    if not found or raw is None:
        return []
    if not isinstance(raw, list):
        raise ValueError("status.conditions is not a list")
    out = []
    for item in raw:
        if not isinstance(item, dict):
            raise ValueError("a condition is not an object")
        fields = {k: item.get(k) or "" for k in ("type", "status", "reason", "message")}
        for key, value in fields.items():
            if not isinstance(value, str):
                raise ValueError(f"condition {key} is {type(value).__name__}, not a string")
        out.append(Condition(**fields))
    return out


def _kind_key(obj: dict[str, Any]) -> str:
    group = str(obj.get("apiVersion", "")).rpartition("/")[0]
    kind = str(obj.get("kind", ""))
    return f"{group}/{kind}" if group else kind


def _generic(obj: dict[str, Any]) -> Result | None:
    """checkGenericProperties: deletion, generation, Reconciling and Stalled."""
    deleted, found = _nested(obj, "metadata", "deletionTimestamp")
    if found and not isinstance(deleted, str):
        raise ValueError("metadata.deletionTimestamp is not a string")
    if found and deleted:
        return Result(TERMINATING, "Resource scheduled for deletion")

    generation = _nested_int(obj, "metadata", "generation")
    if generation is not None:
        observed = _nested_int(obj, "status", "observedGeneration")
        if observed is not None and observed != generation:
            message = (f"{obj.get('kind', '')} generation is {generation}, but latest "
                       f"observed generation is {observed}")
            return _in_progress("LatestGenerationNotObserved", message)

    for condition in _conditions(obj):
        if condition.type == RECONCILING and condition.status == "True":
            return _in_progress(condition.reason, condition.message)
        if condition.type == STALLED and condition.status == "True":
            return Result(FAILED, condition.message, [
                Condition(STALLED, "True", condition.reason, condition.message)])
    return None


def _ready(obj: dict[str, Any]) -> Result | None:
    """checkReadyCondition."""
    for condition in _conditions(obj):
        if condition.type != "Ready":
            continue
        if condition.status == "True":
            return Result(CURRENT, "Resource is Ready")
        if condition.status in ("False", "Unknown"):
            return _in_progress(condition.reason, condition.message)
    return None


def compute(obj: dict[str, Any]) -> Result:
    """kstatus's verdict on `obj` (a decoded object, as `kubectl get -o json` prints it):
    Compute in status.go, for kinds without a rule of their own."""
    generic = _generic(obj)
    if generic is not None:
        return generic
    if _kind_key(obj) in KIND_RULES:
        raise NotImplementedError(f"kstatus judges {_kind_key(obj)} by a rule not ported here")
    return _ready(obj) or Result(CURRENT, "Resource is current")
