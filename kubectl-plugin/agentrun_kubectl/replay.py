"""`kubectl agentrun replay|resume|why`: ask for a replay (or a resume) of a run, wait for
the operator's decision, and print it in its own words."""

from __future__ import annotations

import sys
import time
from datetime import datetime
from typing import Any

from agentrun.vocabulary import (
    ANNOTATION_FORCE_REPLAY,
    API_VERSION,
    REPLAY_KIND,
    REPLAY_PLURAL,
    RUN_PLURAL,
    ReplayPhase,
)
from agentrun_kubectl.cluster import OK, REFUSED, Cluster, Failure


def replay(cluster: Cluster, run: str, *, force: bool, note: str | None, name: str | None,
           timeout: float, resume: bool = False) -> int:
    """Creates an AgentRunReplay of `run` (forced: with the annotation), waits for the
    operator's decision and prints it."""
    if cluster.get(RUN_PLURAL, run) is None:
        print(f"note: AgentRun {run} does not exist in namespace {cluster.namespace}; the "
              "operator will refuse the replay (RunNotFound)", file=sys.stderr)
    existing = cluster.get(REPLAY_PLURAL, name) if name else None
    before: dict[str, Any] = {}  # its decision before the annotation, if any
    wait_forced = force
    if existing is not None:
        before = dict(existing.get("status") or {})
        # Annotated already: what it says now was decided with the annotation in sight.
        wait_forced = force and (existing["metadata"].get("annotations") or {}).get(
            ANNOTATION_FORCE_REPLAY) != "true"
        if existing["spec"].get("runName") != run:
            raise Failure(f"AgentRunReplay {name} replays {existing['spec'].get('runName')}, "
                          f"not {run}")
        if force:
            cluster.annotate_replay(name or "", {ANNOTATION_FORCE_REPLAY: "true"})
            print(f"agentrunreplay/{name} annotated {ANNOTATION_FORCE_REPLAY}=true")
        replay_name = existing["metadata"]["name"]
    else:
        created = cluster.create_replay(replay_manifest(name, run, force=force, note=note,
                                                        resume=resume))
        replay_name = created["metadata"]["name"]
        print(f"agentrunreplay/{replay_name} created" + (" (forced)" if force else ""))
    decided = wait_for_decision(cluster, replay_name, timeout, forced=wait_forced,
                                before=before)
    print_decision(decided)
    return OK if decided["status"]["phase"] == ReplayPhase.APPROVED else REFUSED


def replay_manifest(name: str | None, run: str, *, force: bool = False,
                    note: str | None = None, resume: bool = False) -> dict[str, Any]:
    """An AgentRunReplay of `run` (no name: a generated one), forced with the annotation;
    with `resume`, one that continues the run from its journal."""
    kind = "resume" if resume else "replay"
    metadata: dict[str, Any] = {"name": name} if name else {"generateName": f"{run}-{kind}-"}
    if force:
        metadata["annotations"] = {ANNOTATION_FORCE_REPLAY: "true"}
    spec: dict[str, Any] = {"runName": run}
    if note:
        spec["note"] = note
    if resume:
        spec["resume"] = True
    return {"apiVersion": API_VERSION, "kind": REPLAY_KIND, "metadata": metadata, "spec": spec}


def wait_for_decision(cluster: Cluster, name: str, timeout: float, *,
                      forced: bool = False,
                      before: dict[str, Any] | None = None) -> dict[str, Any]:
    """Until the replay is decided; when forcing, until its refusal was looked at again:
    an Approved status, or a refusal other than `before` (its status before the
    annotation; the operator adds that it examined the annotation) or, with nothing
    decided before, one decided after the annotation."""
    began = time.monotonic()
    since = time.time()
    while True:
        found = cluster.get(REPLAY_PLURAL, name)
        status = (found or {}).get("status") or {}
        phase = status.get("phase")
        if found is not None and phase == ReplayPhase.APPROVED:
            return found
        if found is not None and phase == ReplayPhase.REFUSED and (
                not forced or _looked_at_again(status, before or {}, since)):
            return found
        if time.monotonic() - began > timeout:
            raise Failure(f"AgentRunReplay {name} was not decided within {timeout:.0f}s; is the "
                          "agentrun operator running? (kubectl agentrun why " + name + ")")
        time.sleep(0.5)


def _looked_at_again(status: dict[str, Any], before: dict[str, Any], since: float) -> bool:
    if before.get("phase"):
        # Decided before: decidedAt has whole seconds, and the refusal and the force may
        # fall in the same one; the decision itself says it was made again.
        return any(status.get(k) != before.get(k)
                   for k in ("phase", "reason", "message", "decidedAt"))
    return _decided_after(status, since)


def _decided_after(status: dict[str, Any], since: float) -> bool:
    try:
        at = datetime.fromisoformat(str(status.get("decidedAt")).replace("Z", "+00:00"))
    except ValueError:
        return False
    return at.timestamp() >= int(since)  # decidedAt has whole seconds


def print_decision(replay: dict[str, Any]) -> None:
    meta, spec = replay["metadata"], replay.get("spec") or {}
    status = replay.get("status") or {}
    run = spec.get("runName")
    phase = status.get("phase") or ReplayPhase.PENDING
    headline = f"{phase} ({status['reason']})" if status.get("reason") else phase
    print(f"AgentRunReplay {meta['name']} of AgentRun {run}: {headline}")
    if not status.get("phase"):
        print("  the operator has not decided yet")
        return
    print(f"  {status.get('message', '')}")
    forced = (meta.get("annotations") or {}).get(ANNOTATION_FORCE_REPLAY)
    if forced is not None:
        print(f"  force:          {ANNOTATION_FORCE_REPLAY}={forced}")
    if "toolsExecuted" in status:
        tools = status["toolsExecuted"]
        told = "unknown" if tools is None else (", ".join(tools) or "none")
        print(f"  tools executed: {told} (by {run}, at decision time)")
    if status.get("replayRunName"):
        print(f"  replay run:     {status['replayRunName']} "
              f"(kubectl get agentrun {status['replayRunName']} -n {meta['namespace']})")
    if status.get("decidedAt"):
        print(f"  decided at:     {status['decidedAt']}")
    if spec.get("note"):
        print(f"  note:           {spec['note']}")



def why(cluster: Cluster, name: str) -> int:
    found = cluster.get(REPLAY_PLURAL, name)
    if found is None:
        raise Failure(f"AgentRunReplay {name} does not exist in namespace {cluster.namespace}")
    print_decision(found)
    phase = (found.get("status") or {}).get("phase")
    return REFUSED if phase == ReplayPhase.REFUSED else OK

