"""Queues (api.md, "Queues"), against Kueue itself: its controller manager built from its
Go module, its CRDs and webhooks served to the session's control plane
(agentrun_devtools.kueue), one Kueue for this module. Runs labelled
kueue.x-k8s.io/queue-name are admitted attempt by attempt against a ClusterQueue's quota;
Kueue's preemption ends an attempt Preempted, which does not count against
retry.maxAttempts, and the run goes on by itself."""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterator
from typing import Any

import pytest
from agentrun_devtools.controlplane import ControlPlane
from agentrun_devtools.kueue import Kueue

from agentrun import store
from agentrun.vocabulary import Condition, Phase, Reason, ReplayPhase, ReplayReason
from agentrun.vocabulary import Kueue as K
from tests.approvals import REQUIRED, SCRIPT
from tests.harness import System, agent_run, in_namespace
from tests.replays import create_replay, events, wait_decided

EMAIL = {"to": "customer-42@example.com", "body": "Refund on its way"}
# What Kueue says of a Workload its ClusterQueue has no room for.
NO_ROOM = "insufficient unused quota for cpu"


@pytest.fixture(scope="module")
def kueue(crds: ControlPlane, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kueue]:
    """Kueue for this module's tests; afterwards its webhooks leave the cluster (its CRDs
    stay, inert), so the session's other tests do not depend on it."""
    started = Kueue.on(crds, tmp_path_factory.mktemp("kueue")).start()
    try:
        yield started
    finally:
        started.stop()
        started.uninstall()


@pytest.fixture
def queues(system: System, kueue: Kueue, namespace: str) -> Iterator[QueueMaker]:
    maker = QueueMaker(system, namespace)
    try:
        yield maker
    finally:
        maker.delete()


class QueueMaker:
    """ClusterQueues (named after the test's namespace: they are cluster-wide), each with a
    LocalQueue of the same name in the namespace, and WorkloadPriorityClasses."""

    def __init__(self, system: System, namespace: str) -> None:
        self.system, self.namespace = system, namespace
        self.made: list[tuple[str, str]] = []

    def _apply(self, manifest: dict[str, Any]) -> None:
        self.system.kubectl("apply", "-f", "-", input=json.dumps(manifest))
        if manifest["kind"] != "LocalQueue":
            self.made.append((f"{manifest['kind'].lower()}s.{K.GROUP}",
                              manifest["metadata"]["name"]))

    def queue(self, name: str, cpu: str, *, preemption: bool = False) -> str:
        """A LocalQueue `name` whose ClusterQueue holds `cpu` of runner pods' requests."""
        flavor = f"{self.namespace}-flavor"
        if (f"resourceflavors.{K.GROUP}", flavor) not in self.made:
            self._apply({"apiVersion": f"{K.GROUP}/v1beta2", "kind": "ResourceFlavor",
                         "metadata": {"name": flavor}})
        cluster_queue = f"{self.namespace}-{name}"
        spec: dict[str, Any] = {
            "namespaceSelector": {"matchLabels": {
                "kubernetes.io/metadata.name": self.namespace}},
            "resourceGroups": [{"coveredResources": ["cpu", "memory"], "flavors": [{
                "name": flavor, "resources": [{"name": "cpu", "nominalQuota": cpu},
                                              {"name": "memory", "nominalQuota": "4Gi"}]}]}]}
        if preemption:
            spec["preemption"] = {"withinClusterQueue": "LowerPriority"}
        self._apply({"apiVersion": f"{K.GROUP}/v1beta2", "kind": "ClusterQueue",
                     "metadata": {"name": cluster_queue}, "spec": spec})
        self._apply({"apiVersion": f"{K.GROUP}/v1beta2", "kind": "LocalQueue",
                     "metadata": {"name": name, "namespace": self.namespace},
                     "spec": {"clusterQueue": cluster_queue}})
        return name

    def priority(self, name: str, value: int) -> str:
        full = f"{self.namespace}-{name}"
        self._apply({"apiVersion": f"{K.GROUP}/v1beta2", "kind": "WorkloadPriorityClass",
                     "metadata": {"name": full}, "value": value})
        return full

    def delete(self) -> None:
        for kind, name in reversed(self.made):
            self.system.kubectl("delete", kind, name, "--wait=false", "--ignore-not-found",
                                check=False)


def queued_run(namespace: str, name: str, script: list[dict[str, Any]], queue: str,
               priority: str | None = None, **spec: Any) -> dict[str, Any]:
    manifest = in_namespace(agent_run(name, script, **spec), namespace)
    labels = {K.LABEL_QUEUE_NAME: queue}
    if priority:
        labels[K.LABEL_PRIORITY_CLASS] = priority
    manifest["metadata"]["labels"] = labels
    return manifest


def admitted(run: dict[str, Any]) -> dict[str, Any] | None:
    return next((c for c in (run.get("status") or {}).get("conditions") or []
                 if c["type"] == Condition.ADMITTED), None)


def moment(stamp: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def test_a_queue_with_room_for_two_runs_two_and_queues_three(
        system: System, namespace: str, queues: QueueMaker) -> None:
    """Five runs in a ClusterQueue with room for two runner pods (2 x 100m): two run, three
    wait Pending/Queued with Kueue's own message, each starts when a slot frees, all five
    succeed, never more than two at once. The three waited longer than their
    activeDeadlineSeconds, which counts only once they run. A run with no queue label
    runs at once meanwhile, as it does without Kueue."""
    team = queues.queue("team", "200m")
    holders = ["slot-1", "slot-2"]
    waiters = ["slot-3", "slot-4", "slot-5"]
    for name in holders:
        system.apply(queued_run(namespace, name, [{"sleep": 12}, {"text": "done"}], team))
        system.wait_run(namespace, name, lambda r: (admitted(r) or {}).get("status") == "True",
                        what=f"{name} admitted")
    deadline = 10
    for name in waiters:
        system.apply(queued_run(namespace, name, [{"text": "done"}], team,
                                activeDeadlineSeconds=deadline))
    for name in waiters:
        run = system.wait_run(namespace, name, lambda r: r["status"]["reason"] == Reason.QUEUED
                              and NO_ROOM in r["status"]["message"],
                              what=f"{name} Queued with Kueue's message")
        assert run["status"]["phase"] == Phase.PENDING
        condition = admitted(run)
        assert condition is not None
        assert (condition["status"], condition["reason"]) == ("False", "Pending")
        assert NO_ROOM in condition["message"]  # Kueue's words, as its Workload has them
        assert f"waits in LocalQueue {team}" in run["status"]["message"]
    # kubectl get ar shows it: the Reason and Admitted columns.
    table = system.kubectl("get", "agentruns", "-n", namespace).stdout
    assert table.splitlines()[0].split()[:5] == ["NAME", "AGENT", "PHASE", "REASON",
                                                 "ADMITTED"]
    rows = {line.split()[0]: line.split() for line in table.splitlines()[1:]}
    assert [rows[n][2:5] for n in waiters] == [["Pending", "Queued", "False"]] * 3

    # Not in a queue: not held, not counted, and Kueue never sees its pod.
    system.apply(in_namespace(agent_run("plain", [{"text": "done"}]), namespace))
    plain = system.wait_phase(namespace, "plain", Phase.SUCCEEDED, Phase.FAILED)
    assert plain["status"]["phase"] == Phase.SUCCEEDED and admitted(plain) is None
    plain_pod = system.get("pod", namespace, "plain-1")
    assert plain_pod is not None
    assert K.POD_FINALIZER not in (plain_pod["metadata"].get("finalizers") or [])
    assert "kueue.x-k8s.io/managed" not in (plain_pod["metadata"].get("labels") or {})
    for name in waiters:
        assert system.run(namespace, name)["status"]["reason"] == Reason.QUEUED

    done = {name: system.wait_phase(namespace, name, Phase.SUCCEEDED, Phase.FAILED,
                                    timeout=180) for name in holders + waiters}
    assert {n: r["status"]["phase"] for n, r in done.items()} == dict.fromkeys(
        done, Phase.SUCCEEDED), {n: r["status"] for n, r in done.items()}
    for name in waiters:
        status = done[name]["status"]
        assert status["attempts"] == 1
        condition = admitted(done[name])
        assert condition is not None and condition["status"] == "True"
        queued_for = moment(condition["lastTransitionTime"]) - moment(
            done[name]["metadata"]["creationTimestamp"])
        assert queued_for.total_seconds() > deadline, (name, queued_for)
    # Never more than two runner pods ran at once: their containers' own times.
    spans = []
    for name in holders + waiters:
        pod = system.get("pod", namespace, f"{name}-1")
        assert pod is not None
        ended = pod["status"]["containerStatuses"][0]["state"]["terminated"]
        spans.append((moment(ended["startedAt"]), moment(ended["finishedAt"])))
    busiest = max(sum(1 for s, e in spans if s <= at < e) for at, _ in spans)
    assert busiest <= 2, spans


def _ledger(system: System, uid: str) -> list[store.LedgerEntry]:
    return system.store(lambda e: store.ledger(e, uid))


def _email_sent(system: System, uid: str) -> None:
    from agentrun_devtools.processes import wait_for

    wait_for(lambda: any(e.tool == "send_email" and e.finished_at is not None
                         for e in _ledger(system, uid)), timeout=90,
             what="send_email finished on the ledger", interval=0.2)


def _preempt(system: System, namespace: str, queues: QueueMaker, low_spec: dict[str, Any],
             name: str) -> tuple[str, str]:
    """A low-priority run that sends an email then thinks, in a queue with room for one;
    once its email is sent, a high-priority run comes. Returns (the low run's uid, the
    high run's name)."""
    one = queues.queue("one", "100m", preemption=True)
    low = queues.priority("low", 100)
    high = queues.priority("high", 1000)
    script = [{"call": "send_email", "args": EMAIL}, {"sleep": 8},
              {"text": "Refunded and told the customer."}]
    system.apply(queued_run(namespace, name, script, one, low, **low_spec))
    uid = system.wait_phase(namespace, name, Phase.RUNNING)["metadata"]["uid"]
    _email_sent(system, uid)
    urgent = f"{name}-urgent"
    system.apply(queued_run(namespace, urgent, [{"text": "urgent done"}], one, high))
    return uid, urgent


def test_a_higher_priority_run_preempts_a_lower_one_which_resumes_without_repeating_its_email(
        system: System, namespace: str, queues: QueueMaker) -> None:
    uid, urgent = _preempt(system, namespace, queues, {"retry": {"resume": True}}, "low")
    # Kueue evicts the low run's Workload and deletes its pod: attempt 1 ends Preempted,
    # which is not counted (maxAttempts is 1), and attempt 2 resumes it, queued again.
    run = system.wait_run(namespace, "low", lambda r: r["status"].get(
        "preemptedAttempts") == [1], what="low preempted")
    assert run["status"]["attempts"] == 2
    said = [e["message"] for e in events(system, namespace, "low")
            if e["reason"] == Reason.RESUMING]
    assert said and "by Kueue, which evicted its Workload: WorkloadEvictedDueToPreempted" \
        in said[0], said
    assert "does not count against retry.maxAttempts" in said[0]
    assert system.wait_phase(namespace, urgent, Phase.SUCCEEDED, Phase.FAILED)["status"][
        "phase"] == Phase.SUCCEEDED
    run = system.wait_phase(namespace, "low", Phase.SUCCEEDED, Phase.FAILED, timeout=180)
    status = run["status"]
    assert status["phase"] == Phase.SUCCEEDED, status
    assert (status["attempts"], status["resumedAttempts"], status["preemptedAttempts"]) == (
        2, [2], [1])
    assert status["toolsExecuted"] == ["send_email"]
    assert len(system.emails("low")) == 1  # the finished call was not repeated
    first = system.store(lambda e: store.get_attempt(e, uid, 1))
    assert first is not None and first.reason == Reason.PREEMPTED


def test_preempted_after_a_tool_call_without_resume_fails_preempted_and_is_not_replayed(
        system: System, namespace: str, queues: QueueMaker) -> None:
    _, urgent = _preempt(system, namespace, queues, {}, "no-resume")
    run = system.wait_phase(namespace, "no-resume", Phase.FAILED, Phase.SUCCEEDED)
    status = run["status"]
    assert (status["phase"], status["reason"]) == (Phase.FAILED, Reason.PREEMPTED), status
    assert "by Kueue, which evicted its Workload" in status["message"]
    assert status["toolsExecuted"] == ["send_email"]
    assert (status["attempts"], status["preemptedAttempts"]) == (1, [1])
    assert system.wait_phase(namespace, urgent, Phase.SUCCEEDED, Phase.FAILED)["status"][
        "phase"] == Phase.SUCCEEDED
    create_replay(system, namespace, "no-resume-again", "no-resume")
    decided = wait_decided(system, namespace, "no-resume-again")
    assert (decided["status"]["phase"], decided["status"]["reason"]) == (
        ReplayPhase.REFUSED, ReplayReason.TOOLS_EXECUTED)


def test_a_run_waiting_for_an_approval_holds_no_quota(
        system: System, namespace: str, queues: QueueMaker) -> None:
    """Its attempt ended and its pod went: the run queued behind it is admitted and runs
    while it waits for a human."""
    one = queues.queue("one", "100m")
    system.apply(queued_run(namespace, "asks", SCRIPT, one, tools=REQUIRED))
    system.wait_run(namespace, "asks", lambda r: (admitted(r) or {}).get("status") == "True",
                    what="asks admitted")
    system.apply(queued_run(namespace, "behind", [{"text": "done"}], one))
    system.wait_phase(namespace, "asks", Phase.WAITING)
    behind = system.wait_phase(namespace, "behind", Phase.SUCCEEDED, Phase.FAILED, timeout=120)
    assert behind["status"]["phase"] == Phase.SUCCEEDED, behind["status"]
    assert system.run(namespace, "asks")["status"]["phase"] == Phase.WAITING


def test_kueue_runs_here_as_a_process_with_its_webhooks_limited_to_queued_pods(
        kueue: Kueue, crds: ControlPlane) -> None:
    """The pod and Job webhooks (the Job integration is the benchmark's anchor) reach only
    objects labelled with a queue; Kueue's other integrations (Deployments, JobSets, ...)
    have no webhook here, so nothing else waits on Kueue."""
    queued = {"matchExpressions": [{"key": K.LABEL_QUEUE_NAME, "operator": "Exists"}]}
    for kind, name, pod_hook, job_hook in (
            ("mutatingwebhookconfiguration", "kueue-mutating-webhook-configuration",
             "mpod.kb.io", "mjob.kb.io"),
            ("validatingwebhookconfiguration", "kueue-validating-webhook-configuration",
             "vpod.kb.io", "vjob.kb.io")):
        hooks = json.loads(crds.kubectl("get", kind, name, "-o", "json").stdout)["webhooks"]
        integrated = {h["name"]: h for h in hooks if h["rules"][0]["apiGroups"] != [K.GROUP]}
        assert sorted(integrated) == sorted([pod_hook, job_hook]), sorted(integrated)
        assert integrated[pod_hook]["rules"][0]["resources"] == ["pods"]
        assert integrated[job_hook]["rules"][0]["apiGroups"] == ["batch"]
        assert all(h["objectSelector"] == queued for h in integrated.values()), integrated
    assert kueue.child is not None and kueue.child.alive()


def test_while_kueue_is_down_queued_runs_wait_and_runs_settle_without_its_finalizer(
        system: System, namespace: str, queues: QueueMaker, kueue: Kueue) -> None:
    """Kueue down: a queued run's next pod cannot be created (its webhook does not answer):
    the run says so and retries, no attempt spent; a run without a queue is not affected; a
    cancelled queued run settles though Kueue's finalizer keeps its pod Terminating. Kueue
    back: the pod goes, the waiting run runs. (Last in the module: it restarts Kueue.)"""
    team = queues.queue("team", "200m")
    system.apply(queued_run(namespace, "busy", [{"sleep": 60}, {"text": "done"}], team))
    system.wait_phase(namespace, "busy", Phase.RUNNING)
    kueue.stop()
    try:
        system.apply(queued_run(namespace, "blocked", [{"text": "done"}], team))
        blocked = system.wait_run(namespace, "blocked", lambda r: r["status"]["reason"] ==
                                  Reason.POD_CREATE_FAILED, what="blocked says why")
        assert "mpod.kb.io" in blocked["status"]["message"]  # Kueue's pod webhook
        assert "no attempt is used up" in blocked["status"]["message"]
        system.apply(in_namespace(agent_run("unqueued", [{"text": "done"}]), namespace))
        assert system.wait_phase(namespace, "unqueued", Phase.SUCCEEDED, Phase.FAILED)[
            "status"]["phase"] == Phase.SUCCEEDED
        system.kubectl("annotate", "agentrun", "busy", "-n", namespace,
                       "agentrun.dev/cancel=true")
        busy = system.wait_phase(namespace, "busy", Phase.CANCELLED, Phase.FAILED,
                                 Phase.SUCCEEDED)
        assert busy["status"]["phase"] == Phase.CANCELLED, busy["status"]
        held = system.get("pod", namespace, "busy-1")
        assert held is not None and held["metadata"].get("deletionTimestamp")
        assert K.POD_FINALIZER in held["metadata"]["finalizers"]
    finally:
        kueue.start()
    from agentrun_devtools.processes import wait_for

    wait_for(lambda: system.get("pod", namespace, "busy-1") is None, timeout=90,
             what="Kueue, back, lets the cancelled run's pod go")
    blocked = system.wait_phase(namespace, "blocked", Phase.SUCCEEDED, Phase.FAILED,
                                timeout=120)
    assert (blocked["status"]["phase"], blocked["status"]["attempts"]) == (
        Phase.SUCCEEDED, 1)
