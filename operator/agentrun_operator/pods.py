"""The runner pod of one attempt: its name, and its manifest (pure), one per attempt."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from agentrun.vocabulary import (
    API_VERSION,
    LABEL_ATTEMPT,
    LABEL_REPLAY_OF,
    LABEL_RUN,
    RUN_KIND,
    STORE_TOKEN_DIR,
    STORE_TOKEN_FILE,
    STORE_TOKEN_SECONDS,
    Kueue,
    RunnerEnv,
)
from agentrun_operator.config import OperatorConfig

CONTAINER = "runner"
STORE_TOKEN_VOLUME = "store-token"


def pod_name(run_name: str, attempt: int) -> str:
    """`<run>-<attempt>`: deterministic, so that a retried handler finds its own pod."""
    return f"{run_name}-{attempt}"


# `<run uid>-<attempt>`: the automatic session ids (session_id_for).
_AUTOMATIC_SESSION = re.compile(
    r"^([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})-[0-9]+$")


def automatic_session_owner(session_id: str) -> str | None:
    """The run uid an automatic session id belongs to, or None for any other id. Those
    ids are reserved for their run: a run that names another run's (even one not started
    yet, to claim it first) is refused SessionNotOwned."""
    found = _AUTOMATIC_SESSION.match(session_id)
    return found.group(1) if found else None


def session_id_for(run: Mapping[str, Any], attempt: int) -> str:
    """A chat turn continues the session it names; every other attempt gets a fresh one."""
    spec = run.get("spec") or {}
    if spec.get("sessionId"):
        return str(spec["sessionId"])
    return f"{run['metadata']['uid']}-{attempt}"


def escape_expansion(value: str) -> str:
    """`value` as the kubelet will pass it on, literally: `$$` is how a pod's env writes
    one `$`, so no `$(VAR)` in it can be expanded into another variable's value."""
    return value.replace("$", "$$")


def _secret_ref(entry: Mapping[str, Any]) -> bool:
    return bool((entry.get("valueFrom") or {}).get("secretKeyRef"))


def runner_env(user_env: Sequence[Mapping[str, Any]], identity: Mapping[str, str],
               extra: Mapping[str, str], secret_env: Sequence[Mapping[str, Any]],
               ) -> list[dict[str, Any]]:
    """The runner container's env, in the order that keeps every Secret out of reach of
    `$(VAR)` (the kubelet expands a value only from the variables before it):

    1. the operator's own variables (the chart's extra env, then the run's identity,
       which wins), every value the operator derives from tenant text (model, user id,
       session id, tools, ...) written with `$` escaped, so it reaches the runner as the
       tenant wrote it;
    2. the run's `spec.env` (values only), which may still compose `$(VAR)` from what
       precedes it;
    3. every `valueFrom` Secret variable: the run's own, then the Agent's MCP headers
       (`secret_env`), last, so nothing can refer to one.

    A `spec.env` name that is one of ours, or an Agent's header variable, is left out: with
    ours first a later duplicate would win, and admission refuses the names it knows."""
    ours = {**extra, **{k: escape_expansion(v) for k, v in identity.items()}}
    headers = [dict(e) for e in secret_env]
    taken = set(ours) | {str(e["name"]) for e in headers}
    users = [dict(e) for e in user_env if str(e.get("name")) not in taken]
    return [*[{"name": k, "value": v} for k, v in ours.items()],
            *[e for e in users if not _secret_ref(e)],
            *[e for e in users if _secret_ref(e)],
            *headers]


def queue_labels(run_labels: Mapping[str, str]) -> dict[str, str]:
    """The run's Kueue labels (its LocalQueue, its WorkloadPriorityClass) that each of its
    runner pods carries."""
    return {k: str(run_labels[k]) for k in Kueue.LABELS if run_labels.get(k)}


def runner_pod(
    run: Mapping[str, Any],
    attempt: int,
    session_id: str,
    input_digest: str,
    config: OperatorConfig,
    *,
    agent_digest: str | None = None,
    agent_env: Sequence[Mapping[str, Any]] = (),
) -> dict[str, Any]:
    """The pod manifest of attempt `attempt` of the AgentRun `run`; `agent_digest`, the
    Agent snapshot it pinned (None: an image agent), whose Secret headers are `agent_env`
    (agentrun.agents.secret_env)."""
    meta, spec = run["metadata"], run.get("spec") or {}
    name = pod_name(meta["name"], attempt)
    labels = {LABEL_RUN: meta["name"], LABEL_ATTEMPT: str(attempt)}
    if spec.get("replayOf"):
        labels[LABEL_REPLAY_OF] = spec["replayOf"]
    # Kueue's pod integration admits each attempt against the run's LocalQueue.
    labels.update(queue_labels(meta.get("labels") or {}))

    identity = {
        RunnerEnv.NAMESPACE: meta["namespace"],
        RunnerEnv.RUN_NAME: meta["name"],
        RunnerEnv.RUN_UID: meta["uid"],
        RunnerEnv.ATTEMPT: str(attempt),
        RunnerEnv.AGENT: spec["agent"],
        RunnerEnv.USER_ID: spec.get("userId") or "default",
        RunnerEnv.SESSION_ID: session_id,
        RunnerEnv.MODEL: spec.get("model") or "",
        RunnerEnv.INPUT_DIGEST: input_digest,
        RunnerEnv.TRIGGER: spec.get("trigger") or "manual",
        # No database credential: the store API, and the token that says who we are.
        RunnerEnv.STORE_URL: config.store_api_url,
        RunnerEnv.STORE_TOKEN_FILE: f"{STORE_TOKEN_DIR}/{STORE_TOKEN_FILE}",
        RunnerEnv.STORE_CA: config.store_api_ca,
        RunnerEnv.ALLOW_SCRIPTED_MODEL: "true" if config.allow_scripted_model else "false",
        RunnerEnv.TOOLS: json.dumps(spec.get("tools") or [], separators=(",", ":")),
        RunnerEnv.LIMITS: json.dumps(spec.get("limits") or {}, separators=(",", ":")),
        RunnerEnv.MODEL_PRICES: config.model_prices,
        RunnerEnv.AGENT_DIGEST: agent_digest or "",
        RunnerEnv.TOOL_POLICY: config.tool_policy,
    }
    env = runner_env(spec.get("env") or [], identity, config.extra_runner_env, agent_env)

    container: dict[str, Any] = {
        "name": CONTAINER,
        "image": spec.get("image") or config.runner_image,
        "command": list(config.runner_command),
        "env": env,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
        },
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"},
                         {"name": STORE_TOKEN_VOLUME, "mountPath": STORE_TOKEN_DIR,
                          "readOnly": True}],
    }
    resources = spec.get("resources") or config.runner_resources
    if resources:
        container["resources"] = json.loads(json.dumps(resources))

    pod_spec: dict[str, Any] = {
        "restartPolicy": "Never",
        "serviceAccountName": spec.get("serviceAccountName") or config.runner_service_account,
        "automountServiceAccountToken": False,
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 10001,  # the runner image's user
            "runAsGroup": 10001,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "containers": [container],
        "volumes": [
            {"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}},
            # The token the store API knows this pod by: audience the store's own (worth
            # nothing to the API server), bound to this pod (void once it is deleted),
            # refreshed by the kubelet. automountServiceAccountToken stays false.
            {"name": STORE_TOKEN_VOLUME, "projected": {"sources": [{"serviceAccountToken": {
                "audience": config.store_api_audience,
                "expirationSeconds": STORE_TOKEN_SECONDS, "path": STORE_TOKEN_FILE}}]}},
        ],
        # A lost node is left after these few seconds, not the 300 s default.
        "tolerations": [
            {"key": key, "operator": "Exists", "effect": "NoExecute",
             "tolerationSeconds": config.toleration_seconds}
            for key in ("node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready")
        ],
    }
    if spec.get("activeDeadlineSeconds"):
        pod_spec["activeDeadlineSeconds"] = int(spec["activeDeadlineSeconds"])

    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": meta["namespace"],
            "labels": labels,
            "ownerReferences": [{
                "apiVersion": API_VERSION, "kind": RUN_KIND, "name": meta["name"],
                "uid": meta["uid"], "controller": True, "blockOwnerDeletion": True,
            }],
        },
        "spec": pod_spec,
    }
