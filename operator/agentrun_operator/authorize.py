"""May whoever asked for a replay use what the replay run will use?

The operator creates a replay's run with its own rights (admission does not check its
references again: it copies a spec admitted before, for the original's creator). So the
requester of an AgentRunReplay (who the API server says created it: the annotations the
policy agentrun-replay-requester writes) is checked against the same things the policy
agentrun-run-references checks for a creator: `get` on each Secret and ConfigMap the run
names (input files and env), and `create` on pods when it sets spec.image or
spec.serviceAccountName. A run of an Agent also uses the Secrets its headers name: those
of the snapshot the original pinned, which the replay run builds again (the policy
agentrun-agent-references checked them for the Agent's author, not for the requester).
`uses(spec, agent_secrets)` is the pure list; `missing(...)` asks the authorizer (a
SubjectAccessReview for each) and returns the sentence of the first refusal.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from agentrun import agents
from agentrun.vocabulary import ANNOTATION_REQUESTED_BY, ANNOTATION_REQUESTED_BY_GROUPS
from agentrun_operator.kube import Kube


@dataclass(frozen=True)
class Use:
    """One thing a run uses, as an authorizer question: may `verb` `resource`/`name`?"""

    verb: str
    resource: str  # core group only: secrets, configmaps, pods
    name: str  # "" for the namespace-wide create of pods
    why: str  # where the run names it, for the message


def uses(spec: Mapping[str, Any],
         agent_secrets: Sequence[agents.SecretRef] = ()) -> list[Use]:
    """What a run of `spec` (and of the Agent snapshot whose Secret headers are
    `agent_secrets`) uses with the operator's rights, each once, in spec order."""
    found: list[Use] = []
    for f in (spec.get("input") or {}).get("files") or []:
        for key, resource in (("secretKeyRef", "secrets"), ("configMapKeyRef", "configmaps")):
            if f.get(key):
                found.append(Use("get", resource, str(f[key]["name"]),
                                 f"input file {f.get('name')!r}"))
    for e in spec.get("env") or []:
        source = e.get("valueFrom") or {}
        for key, resource in (("secretKeyRef", "secrets"), ("configMapKeyRef", "configmaps")):
            if source.get(key):
                found.append(Use("get", resource, str(source[key]["name"]),
                                 f"env var {e.get('name')}"))
    for ref in agent_secrets:
        found.append(Use("get", "secrets", ref.secret, ref.where))
    for field in ("image", "serviceAccountName"):
        if spec.get(field):
            found.append(Use("create", "pods", "", f"spec.{field}"))
    once: dict[tuple[str, str, str], Use] = {}
    for use in found:
        once.setdefault((use.verb, use.resource, use.name), use)
    return list(once.values())


@dataclass(frozen=True)
class Requester:
    """Who asked, as the API server knew them (user name and groups)."""

    user: str
    groups: tuple[str, ...]


def requester_of(annotations: Mapping[str, str] | None) -> Requester | None:
    """The requester the admission policy wrote on the replay; None when it wrote none."""
    annotations = annotations or {}
    user = annotations.get(ANNOTATION_REQUESTED_BY)
    if not user:
        return None
    groups = tuple(g for g in annotations.get(ANNOTATION_REQUESTED_BY_GROUPS, "").split(",")
                   if g)
    return Requester(user, groups)


def refusal(requester: Requester, use: Use, namespace: str, run_name: str) -> str:
    """The sentence of one missing permission."""
    if use.resource == "pods":
        return (f"{requester.user} may not create pods in namespace {namespace}, and the "
                f"replay run of {run_name} sets {use.why}: only principals who may create "
                "pods may choose what a run's pod runs, and as whom. Ask someone who may to "
                "request the replay.")
    return (f"{requester.user} may not get {use.resource}/{use.name} in namespace "
            f"{namespace}, which the replay run of {run_name} would read ({use.why}): a "
            "replay runs only on what its requester may read. Ask for get on it, or ask "
            "someone who may to request the replay.")


async def missing(kube: Kube, replay: Mapping[str, Any], original: Mapping[str, Any],
                  agent_secrets: Sequence[agents.SecretRef] = ()) -> str | None:
    """Why the requester of `replay` may not have it run `original` again (with the
    Secret headers of the Agent snapshot it pinned), or None."""
    meta = replay["metadata"]
    namespace = meta["namespace"]
    run_name = original["metadata"]["name"]
    requester = requester_of(meta.get("annotations"))
    if requester is None:
        return (f"AgentRunReplay {meta['name']} does not say who requested it (the "
                f"annotation {ANNOTATION_REQUESTED_BY}, written at admission by the policy "
                "agentrun-replay-requester): install the admission policies (make install), "
                "then create the replay again.")
    for use in uses(original.get("spec") or {}, agent_secrets):
        if not await kube.may(requester.user, requester.groups, use.verb, use.resource,
                              namespace, use.name):
            return refusal(requester, use, namespace, run_name)
    return None

