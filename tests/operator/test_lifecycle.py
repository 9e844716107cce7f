"""AgentRun lifecycle end to end: real control plane, real Postgres, the development node,
real runner processes on the scripted model, the operator as a process."""

from __future__ import annotations

import json
import re

from agentrun_devtools.processes import Child, wait_for

from agentrun import store
from agentrun.vocabulary import Condition, Phase, Reason, RunStatus
from tests.harness import HAPPY, System, agent_run, email_then_wait, in_namespace


def conditions(run: dict) -> dict[str, dict]:
    return {c["type"]: c for c in run["status"].get("conditions") or []}


def test_happy_path(system: System, namespace: str) -> None:
    system.apply(in_namespace(agent_run("triage-42", HAPPY), namespace))
    run = system.wait_phase(namespace, "triage-42", Phase.SUCCEEDED, Phase.FAILED)
    status = run["status"]
    assert status["phase"] == Phase.SUCCEEDED, status
    assert status["toolsExecuted"] == ["read_message", "send_email", "update_crm"]
    assert status["podName"] == "triage-42-1"
    assert status["attempts"] == 1
    assert status["inputDigest"].startswith("hmac-sha256:")
    assert conditions(run)[Condition.SUCCEEDED]["status"] == "True"
    assert conditions(run)[Condition.TOOLS_EXECUTED]["status"] == "True"
    assert len(system.emails("triage-42")) == 1
    pod = system.get("pod", namespace, "triage-42-1")
    assert pod is not None
    assert pod["metadata"]["labels"]["agentrun.dev/run"] == "triage-42"
    assert pod["metadata"]["ownerReferences"][0]["uid"] == run["metadata"]["uid"]
    assert pod["spec"]["automountServiceAccountToken"] is False


def test_eviction_while_send_email_waits(system: System, namespace: str) -> None:
    system.apply(in_namespace(agent_run("evict-1", email_then_wait(60)), namespace))
    uid = system.wait_phase(namespace, "evict-1", Phase.RUNNING)["metadata"]["uid"]
    system.wait_ledger(uid, "send_email")
    system.evict(namespace, "evict-1-1")
    run = system.wait_phase(namespace, "evict-1", Phase.FAILED, Phase.SUCCEEDED)
    assert run["status"]["reason"] == Reason.EVICTED, run["status"]
    assert run["status"]["toolsExecuted"] == ["send_email"]
    assert conditions(run)[Condition.TOOLS_EXECUTED]["status"] == "True"
    assert len(system.emails("evict-1")) == 1


def think_then_email(seconds: int) -> list[dict]:
    """The model thinks for `seconds` before its first call: no tool has run meanwhile."""
    return [{"sleep": seconds},
            {"call": "send_email", "args": {"to": "customer-42@example.com", "body": "Hi"}},
            {"text": "done"}]


def test_eviction_while_thinking_is_retried_safely(system: System, namespace: str) -> None:
    manifest = agent_run("think-1", think_then_email(10), retry={"maxAttempts": 2})
    system.apply(in_namespace(manifest, namespace))
    system.wait_phase(namespace, "think-1", Phase.RUNNING)
    system.wait_pod_running(namespace, "think-1-1")
    system.evict(namespace, "think-1-1")
    retried = system.wait_run(namespace, "think-1",
                              lambda r: r["status"].get("podName") == "think-1-2",
                              what="attempt 2")
    assert retried["status"]["attempts"] == 2
    run = system.wait_phase(namespace, "think-1", Phase.SUCCEEDED, Phase.FAILED, timeout=120)
    assert run["status"]["phase"] == Phase.SUCCEEDED, run["status"]
    assert run["status"]["attempts"] == 2
    assert run["status"]["toolsExecuted"] == ["send_email"]
    assert len(system.emails("think-1")) == 1
    ledger = system.store(lambda e: store.ledger(e, run["metadata"]["uid"]))
    assert [(x.attempt, x.tool) for x in ledger] == [(2, "send_email")]


def test_eviction_while_thinking_without_retry_fails_with_no_tools(
        system: System, namespace: str) -> None:
    system.apply(in_namespace(agent_run("think-2", think_then_email(30)), namespace))
    system.wait_pod_running(namespace, "think-2-1")
    system.evict(namespace, "think-2-1")
    run = system.wait_phase(namespace, "think-2", Phase.FAILED, Phase.SUCCEEDED)
    assert run["status"]["reason"] == Reason.EVICTED
    assert run["status"]["toolsExecuted"] == []
    assert conditions(run)[Condition.TOOLS_EXECUTED]["status"] == "False"
    assert system.emails("think-2") == []


def test_node_pressure_eviction(system: System, namespace: str) -> None:
    system.apply(in_namespace(agent_run("pressure", email_then_wait(60)), namespace))
    uid = system.wait_phase(namespace, "pressure", Phase.RUNNING)["metadata"]["uid"]
    system.wait_ledger(uid, "send_email")
    system.kubectl("annotate", "pod", "pressure-1", "-n", namespace,
                   "dev.agentrun.dev/simulate=node-pressure-eviction")
    run = system.wait_phase(namespace, "pressure", Phase.FAILED, Phase.SUCCEEDED)
    assert run["status"]["reason"] == Reason.EVICTED
    assert "low on resource: memory" in run["status"]["message"]
    assert run["status"]["toolsExecuted"] == ["send_email"]


def test_oom(system: System, namespace: str) -> None:
    system.apply(in_namespace(agent_run("oom", think_then_email(60)), namespace))
    system.wait_pod_running(namespace, "oom-1")
    system.kubectl("annotate", "pod", "oom-1", "-n", namespace, "dev.agentrun.dev/simulate=oom")
    run = system.wait_phase(namespace, "oom", Phase.FAILED, Phase.SUCCEEDED)
    assert run["status"]["reason"] == Reason.OOM_KILLED
    assert "spec.resources.limits.memory" in run["status"]["message"]
    assert run["status"]["toolsExecuted"] == []


def test_pod_deleted_by_hand(system: System, namespace: str) -> None:
    system.apply(in_namespace(agent_run("deleted", think_then_email(60)), namespace))
    system.wait_pod_running(namespace, "deleted-1")
    system.kubectl("delete", "pod", "deleted-1", "-n", namespace, "--wait=false")
    run = system.wait_phase(namespace, "deleted", Phase.FAILED, Phase.SUCCEEDED)
    assert run["status"]["reason"] == Reason.POD_DELETED
    assert run["status"]["toolsExecuted"] == []


def test_agent_error_carries_the_runners_message(system: System, namespace: str) -> None:
    system.apply(in_namespace(agent_run("broken", [{"empty": True}, {"empty": True}]),
                              namespace))
    run = system.wait_phase(namespace, "broken", Phase.FAILED, Phase.SUCCEEDED)
    assert run["status"]["reason"] == Reason.AGENT_ERROR
    assert "empty" in run["status"]["message"].lower()
    assert run["status"]["toolsExecuted"] == []


def test_rate_limit_after_a_tool_call_is_not_retried(system: System, namespace: str) -> None:
    script = [{"call": "send_email", "args": {"to": "c@example.com", "body": "x"}},
              {"error": 429}]
    system.apply(in_namespace(agent_run("limited", script, retry={"maxAttempts": 3}),
                              namespace))
    run = system.wait_phase(namespace, "limited", Phase.FAILED, Phase.SUCCEEDED)
    assert run["status"]["reason"] == Reason.RATE_LIMITED_AFTER_TOOL_CALL
    assert run["status"]["attempts"] == 1
    assert run["status"]["toolsExecuted"] == ["send_email"]
    assert len(system.emails("limited")) == 1


def test_deleting_a_running_run_cancels_it(system: System, namespace: str) -> None:
    system.apply(in_namespace(agent_run("cancel-me", email_then_wait(60)), namespace))
    uid = system.wait_phase(namespace, "cancel-me", Phase.RUNNING)["metadata"]["uid"]
    system.wait_ledger(uid, "send_email")
    system.kubectl("delete", "agentrun", "cancel-me", "-n", namespace, "--timeout=60s")
    assert system.get("agentrun", namespace, "cancel-me") is None
    wait_for(lambda: system.get("pod", namespace, "cancel-me-1") is None, timeout=60,
             what="runner pod gone")
    recorded = system.store(lambda e: store.get_run(e, uid))
    assert recorded is not None
    assert recorded.status == RunStatus.CANCELLED
    assert recorded.tools_executed == ["send_email"]


def test_missing_input_config_map(system: System, namespace: str) -> None:
    manifest = agent_run("no-input", HAPPY)
    manifest["spec"]["input"]["files"] = [
        {"name": "invoice.pdf", "configMapKeyRef": {"name": "invoices", "key": "42.pdf"}}]
    system.apply(in_namespace(manifest, namespace))
    run = system.wait_phase(namespace, "no-input", Phase.FAILED, Phase.SUCCEEDED)
    assert run["status"]["reason"] == Reason.INPUT_UNAVAILABLE
    assert f"ConfigMap {namespace}/invoices does not exist" in run["status"]["message"]
    assert run["status"]["toolsExecuted"] == []
    assert system.get("pod", namespace, "no-input-1") is None


def test_input_files_are_copied_before_the_run(system: System, namespace: str) -> None:
    system.kubectl("create", "configmap", "invoices", "-n", namespace,
                   "--from-literal=42.pdf=PDF-BYTES")
    manifest = agent_run("with-input", HAPPY)
    manifest["spec"]["input"]["files"] = [
        {"name": "invoice.pdf", "configMapKeyRef": {"name": "invoices", "key": "42.pdf"}}]
    system.apply(in_namespace(manifest, namespace))
    run = system.wait_phase(namespace, "with-input", Phase.SUCCEEDED, Phase.FAILED)
    system.kubectl("delete", "configmap", "invoices", "-n", namespace)
    snapshot = system.store(lambda e: store.get_input(e, run["status"]["inputDigest"]))
    assert snapshot is not None
    assert snapshot.files == {"invoice.pdf": b"PDF-BYTES"}


def test_node_lost(system: System, namespace: str) -> None:
    """The node stops reporting: the run fails NodeLost after the short tolerations
    (6 s here), not after the 300 s default."""
    system.apply(in_namespace(agent_run("lost", email_then_wait(120)), namespace))
    uid = system.wait_phase(namespace, "lost", Phase.RUNNING)["metadata"]["uid"]
    system.wait_ledger(uid, "send_email")
    pod = system.get("pod", namespace, "lost-1")
    assert pod is not None
    # The runner pod leaves a lost node after the operator's --toleration-seconds (6 s),
    # not the 300 s the API server would add on its own.
    assert sorted((t["key"], t.get("effect"), t.get("tolerationSeconds"))
                  for t in pod["spec"]["tolerations"] if t.get("effect") == "NoExecute") == [
        ("node.kubernetes.io/not-ready", "NoExecute", 6),
        ("node.kubernetes.io/unreachable", "NoExecute", 6)]
    system.kubectl("annotate", "node", "dev-node", "dev.agentrun.dev/simulate=lost")
    try:
        # The check that the short grace is what acts: this wait's 120 s is well below the
        # 300 s default, so a run left to a 300 s toleration (or grace) times out here. How
        # long it takes is a timing, not bounded here (no benchmark times it yet).
        run = system.wait_phase(namespace, "lost", Phase.FAILED, Phase.SUCCEEDED, timeout=120)
    finally:
        system.kubectl("annotate", "node", "dev-node", "dev.agentrun.dev/simulate-")
        wait_node_healthy(system)
    assert run["status"]["reason"] == Reason.NODE_LOST
    assert run["status"]["toolsExecuted"] == ["send_email"]


def test_back_from_a_power_loss_a_runner_is_not_started_again(
        system: System, namespace: str, dev_node: Child) -> None:
    """The node comes back after losing power: the runner pod (restartPolicy Never) is
    reported Failed, ContainerStatusUnknown, as a kubelet does; its runner never runs a
    second time (found by make soak: a second process of the same attempt wrote to its
    session, and the resumed attempt then sent the email again). The pod may instead have
    been deleted while the node was away (the taint manager's eviction, DeletionByTaintManager:
    the runner pods' toleration is as long as the operator's grace, and which acts first is
    timing); once back and the pod Failed, it goes (the node confirms the deletion, or a
    repeated delete of a Failed pod is immediate) and nothing is started."""
    system.apply(in_namespace(agent_run("blackout", email_then_wait(120)), namespace))
    uid = system.wait_phase(namespace, "blackout", Phase.RUNNING)["metadata"]["uid"]
    system.wait_ledger(uid, "send_email")
    system.kubectl("annotate", "node", "dev-node", "dev.agentrun.dev/simulate=lost")
    try:
        system.wait_phase(namespace, "blackout", Phase.FAILED, Phase.SUCCEEDED, timeout=120)
    finally:
        system.kubectl("annotate", "node", "dev-node", "dev.agentrun.dev/simulate-")
        wait_node_healthy(system)
    reported = re.compile(rf"event=vanished pod={re.escape(namespace)}/blackout-1\b")

    def settled_by_the_node() -> bool:
        if not reported.search(dev_node.log_path.read_text()):
            return False
        done = system.kubectl("get", "pod", "blackout-1", "-n", namespace, "-o", "json",
                              check=False)
        if done.returncode != 0:
            return "NotFound" in done.stderr
        pod = json.loads(done.stdout)
        states = [c.get("state") or {} for c in (pod.get("status") or {}).get(
            "containerStatuses") or []]
        return pod.get("status", {}).get("phase") == "Failed" and any(
            (s.get("terminated") or {}).get("reason") == "ContainerStatusUnknown"
            for s in states) and not pod["metadata"].get("deletionTimestamp")

    wait_for(settled_by_the_node, timeout=60,
             what="blackout-1 Failed, ContainerStatusUnknown, or deleted")
    started = dev_node.log_path.read_text().count(f"event=started pod={namespace}/blackout-1 ")
    assert started == 1, "the runner was started again after the node came back"
    emails = [e for e in system.emails("blackout") if e.tool == "send_email"]
    assert len(emails) == 1


def wait_node_healthy(system: System) -> None:
    def healthy() -> bool:
        node = system.get("node", "default", "dev-node") or {}
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        return ready[0]["status"] == "True" and not node["spec"].get("taints")

    wait_for(healthy, timeout=120, what="dev-node Ready without taints")


def test_deadline_exceeded(system: System, namespace: str) -> None:
    manifest = agent_run("slow", [{"sleep": 120}], activeDeadlineSeconds=4,
                         retry={"maxAttempts": 3})
    system.apply(in_namespace(manifest, namespace))
    run = system.wait_phase(namespace, "slow", Phase.FAILED, Phase.SUCCEEDED)
    assert run["status"]["reason"] == Reason.DEADLINE_EXCEEDED
    assert "spec.activeDeadlineSeconds" in run["status"]["message"]
    # A spent deadline is not retried, even with attempts left and no tool called.
    assert run["status"]["attempts"] == 1
    assert run["status"]["toolsExecuted"] == []


def test_events_tell_the_story(system: System, namespace: str) -> None:
    system.apply(in_namespace(agent_run("told", HAPPY), namespace))
    system.wait_phase(namespace, "told", Phase.SUCCEEDED, Phase.FAILED)

    def reasons() -> list[str]:
        done = system.kubectl("get", "events", "-n", namespace, "--field-selector",
                              "involvedObject.name=told", "-o",
                              "jsonpath={range .items[*]}{.reason}{'\\n'}{end}")
        return done.stdout.split()

    wait_for(lambda: {"Created", "PodCreated", "Succeeded"} <= set(reasons()), timeout=30,
             what="events on the AgentRun")
    described = system.kubectl("describe", "agentrun", "told", "-n", namespace).stdout
    assert "Tools executed: read_message, send_email, update_crm." in described


def test_image_that_cannot_be_pulled(system: System, namespace: str) -> None:
    manifest = agent_run("no-image", HAPPY, image="registry.example/runner:unpullable",
                         retry={"maxAttempts": 3})
    system.apply(in_namespace(manifest, namespace))
    run = system.wait_phase(namespace, "no-image", Phase.FAILED, Phase.SUCCEEDED)
    assert run["status"]["reason"] == Reason.IMAGE_PULL_FAILED
    assert "ErrImagePull" in run["status"]["message"]
    assert "check spec.image" in run["status"]["message"]
    # Nothing ran, so nothing was called; and pulling again would fail again: no retry.
    assert run["status"]["toolsExecuted"] == []
    assert run["status"]["attempts"] == 1
    wait_for(lambda: system.get("pod", namespace, "no-image-1") is None, timeout=60,
             what="the pod that cannot start is removed")


def test_preempted_by_the_scheduler(system: System, namespace: str) -> None:
    """A higher-priority pod that only fits if ours goes: the real kube-scheduler preempts
    the runner pod (DisruptionTarget PreemptionByScheduler)."""
    manifest = agent_run("preempted", email_then_wait(120),
                         resources={"requests": {"cpu": "40"}})
    system.apply(in_namespace(manifest, namespace))
    uid = system.wait_phase(namespace, "preempted", Phase.RUNNING)["metadata"]["uid"]
    system.wait_ledger(uid, "send_email")
    system.kubectl("apply", "-f", "-", input=json.dumps({
        "apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass",
        "metadata": {"name": "agentrun-test-urgent"}, "value": 1000000}))
    try:
        system.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "urgent"},
            "spec": {"priorityClassName": "agentrun-test-urgent", "restartPolicy": "Never",
                     "containers": [{"name": "work", "image": "busybox",
                                     "command": ["sleep", "60"],
                                     "resources": {"requests": {"cpu": "40"}}}]}}))
        run = system.wait_phase(namespace, "preempted", Phase.FAILED, Phase.SUCCEEDED)
    finally:
        system.kubectl("delete", "pod", "urgent", "-n", namespace, "--wait=false",
                       check=False)
        system.kubectl("delete", "priorityclass", "agentrun-test-urgent", check=False)
    assert run["status"]["reason"] == Reason.PREEMPTED, run["status"]
    assert run["status"]["toolsExecuted"] == ["send_email"]
