"""Agents: a step of the same reconciler and work queue (kind "agent"), and what a run's
launch takes from them.

An Agent's reconcile reads it and the other Agents of its namespace, resolves it
(agentrun.agents.resolve, pure), looks for the Secrets its headers name, and writes what
`agent_status` (pure) says: `status.digest` (what a run launched now would pin),
`observedGeneration` and the kstatus conditions. Ready when the definition resolves and
its Secrets exist; Stalled, with the reason, when not. A change of any Agent queues every
Agent of its namespace (a parent's digest covers its sub-agents); an Agent waiting for a
Secret is looked at again every AGENT_RECHECK seconds (Secrets are not watched).

At a run's launch, `pin` resolves the Agent the run names from a list the API server
answered after the run was created (not from the watch's cache, which may lag: an Agent
created or changed just before the run counts), snapshots it in the store and returns the
digest the run records, or the refusal (also a run whose spec.tools loosens the chart's
policy or the Agents' effects: PolicyViolation). A list serves every launch of a run
created before it was answered: its resourceVersion is not older than the run's (the API
server's resourceVersions are etcd's revisions, one order for every write of the
cluster), so it holds every Agent written before that run; a burst of runs in a namespace
costs a list now and then, not one per run. A replay
(and so a manual resume) pins its original's snapshot, found through the store's record of
the original, never through anything a user could edit.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from kubernetes.client.exceptions import ApiException

from agentrun import agents, policy, store
from agentrun.vocabulary import AGENT_PLURAL, AgentReason, Condition, Reason
from agentrun_operator import events
from agentrun_operator.controller import Context
from agentrun_operator.kube import resource_version
from agentrun_operator.status import condition

if TYPE_CHECKING:
    from agentrun_operator.kube import Kube

log = logging.getLogger("agentrun.operator")

# An Agent that waits for a Secret is looked at again this often.
AGENT_RECHECK = 30.0


def agent_status(resolution: agents.Resolution, missing_secrets: Sequence[str], *,
                 generation: int | None, now: datetime.datetime,
                 previous: Mapping[str, Any], refused: str | None = None) -> dict[str, Any]:
    """An Agent's status from what its reconcile found: Ready True (reason Valid) when it
    resolves and every Secret it names exists; else Ready False and Stalled True, reason
    AgentInvalid (runs of it fail so) or SecretNotFound (their pods wait for it).
    `refused` is the runner's word that the snapshot cannot be built in its image (the
    latest run of it failed AgentInvalid: a function the image does not ship as a tool),
    which the operator, without the image's code, cannot find by itself.
    `digest` is the snapshot a run would pin now, whenever the definition resolves."""
    if not resolution.valid:
        ready, reason = "False", AgentReason.INVALID
        message = f"{resolution.problem} Runs of it fail {Reason.AGENT_INVALID} until it is fixed."
    elif refused is not None:
        ready, reason = "False", AgentReason.INVALID
        message = (f"The runner image refused the snapshot {resolution.digest}: {refused} "
                   f"Runs of it fail {Reason.AGENT_INVALID} until the Agent or the image is "
                   "fixed.")
    elif missing_secrets:
        ready, reason = "False", AgentReason.SECRET_NOT_FOUND
        message = (f"{'; '.join(missing_secrets)}. Runs of it wait, Pending, until the Secret "
                   "is there.")
    else:
        ready, reason = "True", AgentReason.VALID
        message = f"Valid: a run of it now pins the snapshot {resolution.digest}."
    before = list(previous.get("conditions") or [])
    status: dict[str, Any] = {
        "observedGeneration": generation,
        "conditions": [
            condition(Condition.READY, ready, reason, message, now, before),
            condition(Condition.RECONCILING, "False", reason, message, now, before),
            condition(Condition.STALLED, "False" if ready == "True" else "True", reason,
                       message, now, before),
        ],
    }
    if resolution.digest is not None:
        status["digest"] = resolution.digest
    return status


# -- facts ----------------------------------------------------------------------------------


def slim_agent(obj: Mapping[str, Any]) -> dict[str, Any]:
    meta = obj.get("metadata") or {}
    keep = ("name", "namespace", "uid", "resourceVersion", "generation", "deletionTimestamp")
    return {"apiVersion": obj.get("apiVersion"), "kind": obj.get("kind"),
            "metadata": {k: meta[k] for k in keep if k in meta},
            "spec": dict(obj.get("spec") or {}), "status": dict(obj.get("status") or {})}


def _specs(listed: Sequence[Mapping[str, Any]]) -> dict[str, dict[str, Any]]:
    return {str(a["metadata"]["name"]): dict(a.get("spec") or {}) for a in listed
            if not (a.get("metadata") or {}).get("deletionTimestamp")}


async def agents_for(ctx: Context, run: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """The specs of the Agents of run `run`'s namespace, by name, from a list of the API
    server whose resourceVersion is not older than the run's (see the module docstring):
    the newest list kept for the namespace if it is, else a list now (kept if newer)."""
    namespace = run["metadata"]["namespace"]
    version = resource_version(run)  # 0, not a number: no order to rely on, a list each time
    kept = ctx.agent_lists.get(namespace)
    if version and kept is not None and kept[0] >= version:
        return dict(kept[1])  # a copy: what the caller does with it stays out of the list
    listed, listed_at = await ctx.kube.list_agents(namespace)
    specs = _specs(listed)
    kept = ctx.agent_lists.get(namespace)  # another launch may have listed meanwhile
    if listed_at and (kept is None or listed_at > kept[0]):
        ctx.agent_lists[namespace] = (listed_at, dict(specs))
    return specs


async def missing_secrets(kube: Kube, namespace: str,
                          refs: Sequence[agents.SecretRef]) -> list[str]:
    """The Secrets (or keys) the headers name that are not there, one phrase each."""
    found: list[str] = []
    keys: dict[str, set[str] | str | None] = {}
    for ref in refs:
        if ref.secret not in keys:
            try:
                keys[ref.secret] = await kube.secret_keys(namespace, ref.secret)
            except ApiException as e:
                keys[ref.secret] = f"{e.status} {e.reason}"
        have = keys[ref.secret]
        if isinstance(have, str):
            found.append(f"the operator cannot read Secret {ref.secret} ({have}), which "
                         f"{ref.where} names")
        elif have is None:
            found.append(f"Secret {ref.secret} does not exist, and {ref.where} names it")
        elif ref.key not in have:
            found.append(f"Secret {ref.secret} has no key {ref.key}, which {ref.where} names")
    return found


def _has_functions(snapshot: Mapping[str, Any] | None) -> bool:
    """Whether the snapshot names a function tool: what only the image can refuse."""
    return any(tool.get("function") for spec in ((snapshot or {}).get("agents") or {}).values()
               for tool in spec.get("tools") or [])


# -- the reconcile step -----------------------------------------------------------------------


async def reconcile_agent(ctx: Context, namespace: str, name: str) -> float | None:
    """The work queue's entry point for an Agent: its status brought in line with what it
    resolves to now. Returns when to look again (a Secret that is missing), if ever."""
    agent = ctx.agents.get((namespace, name))
    cached = ctx.pods is not None
    if agent is None and not cached:  # no caches (a step called directly)
        found = await ctx.kube.read_custom(AGENT_PLURAL, namespace, name)
        agent = slim_agent(found) if found else None
    if agent is None:
        return None
    specs = ({n: dict(a.get("spec") or {}) for (ns, n), a in ctx.agents.items()
              if ns == namespace} if cached else
             _specs((await ctx.kube.list_agents(namespace))[0]))
    specs[name] = dict(agent.get("spec") or {})
    resolution = agents.resolve(name, specs, namespace)
    missing = await missing_secrets(ctx.kube, namespace, agents.secret_refs(
        resolution.snapshot)) if resolution.snapshot is not None else []
    refused = await store.image_refusal(ctx.engine, resolution.digest) if (
        resolution.digest is not None and _has_functions(resolution.snapshot)) else None
    now = datetime.datetime.now(datetime.UTC)
    previous = agent.get("status") or {}
    status = agent_status(resolution, missing, generation=agent["metadata"].get("generation"),
                          now=now, previous=previous, refused=refused)
    again = AGENT_RECHECK if missing else None
    if {k: previous.get(k) for k in status} == status and set(previous) <= set(status):
        return again
    written = await ctx.kube.replace_status(AGENT_PLURAL, agent, status)
    ctx.keep(ctx.agents, written, slim_agent(written))
    ready = status["conditions"][0]
    was: Mapping[str, Any] = next((c for c in previous.get("conditions") or []
                                   if c.get("type") == Condition.READY), {})
    if (was.get("reason"), was.get("message")) != (ready["reason"], ready["message"]):
        events.post(written, ready["reason"], ready["message"], warning=ready["status"] != "True")
    log.info("event=agent-reconciled agent=%s/%s ready=%s reason=%s digest=%s", namespace,
             name, ready["status"], ready["reason"], status.get("digest") or "-")
    return again


# -- a run's launch ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Pin:
    """What a launching run takes: the snapshot's digest (None: an image agent), or the
    reason and message it fails with before any pod."""

    digest: str | None
    refusal: tuple[str, str] | None = None


async def pin(ctx: Context, run: Mapping[str, Any]) -> Pin:
    """The Agent snapshot run `run` pins at launch (see the module docstring)."""
    meta, spec = run["metadata"], run.get("spec") or {}
    namespace, name = meta["namespace"], str(spec["agent"])
    chart = policy.chart_rules(ctx.config.tool_policy)
    loosened = policy.first_violation([policy.of_rules(policy.CHART, chart),
                                       policy.of_rules(policy.RUN, spec.get("tools") or [])])
    if loosened is not None:
        return Pin(None, (Reason.POLICY_VIOLATION, _before_any_pod(loosened)))
    if spec.get("replayOf"):
        approval = await store.approval_of_replay_run(ctx.engine, namespace, meta["name"])
        original = await store.get_run(ctx.engine, approval.run_uid) if approval else None
        digest = original.agent_digest if original is not None else None
        if digest is None:
            return Pin(None)  # its original ran an image agent (or is gone: see the input)
        if await store.get_agent(ctx.engine, digest) is None:
            return Pin(None, (Reason.AGENT_NOT_FOUND, (
                f"The Agent snapshot {digest} that {spec['replayOf']} ran is gone from the "
                "run store: a replay runs only the definition its original ran. No pod was "
                "started.")))
        return Pin(digest)
    # One list: the Agent and its sub-agents at one version, not older than the run.
    specs = await agents_for(ctx, run)
    if name not in specs:
        return Pin(None)  # a directory of the runner image, as before Agents existed
    resolution = agents.resolve(name, specs, namespace)
    problem = agents.launch_problem(resolution, spec.get("model"))
    if problem is not None or resolution.snapshot is None:
        return Pin(None, (Reason.AGENT_INVALID, (
            f"{problem} No pod was started, no tool was called; fix the Agent (kubectl "
            f"describe agent {name} -n {namespace}) and create the run again.")))
    loosened = launch_violation(resolution.snapshot, spec.get("tools") or [], chart)
    if loosened is not None:
        return Pin(None, (Reason.POLICY_VIOLATION, _before_any_pod(loosened)))
    return Pin(await store.put_agent(ctx.engine, resolution.snapshot))


def _before_any_pod(loosened: policy.Violation) -> str:
    return loosened.message.replace("No tool was called", "No pod was started, no tool was "
                                    "called")


def launch_violation(snapshot: Mapping[str, Any], run_tools: Sequence[Mapping[str, Any]],
                     chart: Sequence[Mapping[str, Any]] = ()) -> policy.Violation | None:
    """What the operator can know at launch of "a run only tightens" (agentrun.policy):
    the Agents' effects and the run's spec.tools against the chart's policy and each
    other. The image's code is the runner's to check, before its first model call."""
    return policy.first_violation([policy.of_rules(policy.CHART, chart),
                                   policy.of_rules(policy.AGENT, policy.agent_rules(snapshot)),
                                   policy.of_rules(policy.RUN, run_tools)])
