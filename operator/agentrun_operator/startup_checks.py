"""At start-up: may this operator do what it must? Server-side dry runs, one line each.

An operator started with the wrong credential (a cluster admin's kubeconfig, say) runs
fine until it approves a replay: then the replayOf admission policy refuses the replay
run. It is better told at once. In each namespace it watches by name (or `default` when
it watches them all) it dry-runs the create of a runner pod and of a replay run (the API
server runs admission on dry runs, and persists nothing) and logs one clear line per
refusal naming the credential to use.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from kubernetes.client.exceptions import ApiException

from agentrun.vocabulary import API_VERSION, RUN_KIND
from agentrun_operator.kube import api_message

if TYPE_CHECKING:
    from agentrun_operator.controller import Context

log = logging.getLogger("agentrun.operator")


def namespaces_to_check(patterns: tuple[str, ...]) -> list[str]:
    """The namespaces named outright (no glob, no exclusion); `default` otherwise."""
    named = [p for p in patterns if not p.startswith("!") and not any(c in p for c in "*?[")]
    return named or ["default"]


def _pod(namespace: str, config: Any) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": "agentrun-start-up-check", "namespace": namespace},
            "spec": {"restartPolicy": "Never", "automountServiceAccountToken": False,
                     "containers": [{"name": "runner", "image": config.runner_image}]}}


def _replay_run(namespace: str) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": RUN_KIND,
            "metadata": {"name": "agentrun-start-up-check", "namespace": namespace},
            "spec": {"agent": "start-up-check", "input": {"text": "-"},
                     "replayOf": "agentrun-start-up-check"}}


async def check(ctx: Context) -> list[str]:
    """Runs the dry runs; returns (and logs) one line per thing the operator may not do."""
    problems: list[str] = []
    for namespace in namespaces_to_check(ctx.config.namespaces):
        for what, create in (
            ("create runner pods", lambda ns=namespace: ctx.kube.dry_run_create_pod(
                _pod(ns, ctx.config))),
            ("create replay runs (spec.replayOf)", lambda ns=namespace:
                ctx.kube.dry_run_create_run(_replay_run(ns))),
        ):
            try:
                await create()
            except ApiException as e:
                if e.status == 404:  # the namespace does not exist (yet): nothing to say
                    continue
                line = (f"event=startup-check-failed namespace={namespace} action={what!r} "
                        f"status={e.status} message={api_message(e)!r} hint='run the operator "
                        "with its own credential: in a cluster the ServiceAccount "
                        "agentrun-system:agentrun-operator (the chart), locally a credential "
                        "in group agentrun:operators (make run uses "
                        ".local/operator.kubeconfig on the development cluster)'")
                log.error(line)
                problems.append(line)
            except Exception as e:
                log.warning("event=startup-check-error namespace=%s action=%r error=%r",
                            namespace, what, e)
    if not problems:
        log.info("event=startup-check-passed namespaces=%s",
                 ",".join(namespaces_to_check(ctx.config.namespaces)))
    return problems
