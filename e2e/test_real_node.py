"""The promises, with real containers on a real kubelet (see conftest.py for the cluster).

In order: a run that sends an email and is evicted mid-tool (Failed Evicted, its replay
refused, forced by someone allowed to, the replay succeeds, two emails in the store); the
restricted security context in force inside the runner; a runner killed by the kernel
for its memory limit (OOMKilled); an image that cannot be pulled (ImagePullFailed, no
tool ran); the same thing in two tenants' namespaces; a run's answer and transcript read
through the chart's APIService; the declarative sample (an Agent and its MCP server as a
pod); `helm upgrade` keeping every run; `helm uninstall` keeping the store's data.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import time
from typing import Any

import pytest
from agentrun_devtools.controlplane import REPO

from agentrun.agents import header_env
from e2e.install import EMAIL, RELEASE_NAMESPACE, Cluster, run_manifest

pytestmark = pytest.mark.realnode

def replay_manifest(name: str, run: str) -> dict[str, Any]:
    return {"apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentRunReplay",
            "metadata": {"name": name}, "spec": {"runName": run}}


def evict(cluster: Cluster, namespace: str, pod: str) -> float:
    """Calls the Eviction API; returns when it answered (monotonic)."""
    body = {"apiVersion": "policy/v1", "kind": "Eviction",
            "metadata": {"name": pod, "namespace": namespace}}
    cluster.kubectl("create", "--raw", f"/api/v1/namespaces/{namespace}/pods/{pod}/eviction",
                    "-f", "-", input=json.dumps(body))
    return time.monotonic()


def pod_log(cluster: Cluster, namespace: str, pod: str) -> str:
    return cluster.kubectl("logs", "-n", namespace, pod, check=False).stdout


def test_evicted_mid_tool_refused_then_forced(cluster: Cluster) -> None:
    ns = "shop"
    script = [{"call": "send_email", "args": {**EMAIL, "delay_seconds": 60}},
              {"text": "Told the customer."}]
    cluster.apply(ns, run_manifest("evicted-42", script), as_user="alice")
    cluster.wait_phase("agentrun", "evicted-42", ns, ("Running",), timeout=240)
    cluster.wait("the email in the store", lambda: cluster.emails("evicted-42") == 1,
                 timeout=120)
    evict(cluster, ns, "evicted-42-1")
    run = cluster.wait_phase("agentrun", "evicted-42", ns, ("Failed", "Succeeded"))
    assert (run["status"]["phase"], run["status"]["reason"]) == ("Failed", "Evicted"), \
        run["status"]
    assert run["status"]["toolsExecuted"] == ["send_email"]

    cluster.apply(ns, replay_manifest("evicted-42-again", "evicted-42"), as_user="alice")
    replay = cluster.wait_phase("agentrunreplay", "evicted-42-again", ns,
                                ("Refused", "Approved"))
    assert replay["status"]["phase"] == "Refused", replay["status"]
    denied = cluster.kubectl("annotate", "agentrunreplay", "evicted-42-again", "-n", ns,
                             "agentrun.dev/force-replay=true", as_user="alice", check=False)
    assert denied.returncode != 0 and "force" in denied.stderr, denied.stderr
    cluster.kubectl("annotate", "agentrunreplay", "evicted-42-again", "-n", ns,
                    "agentrun.dev/force-replay=true", as_user="olga")
    replay = cluster.wait_phase("agentrunreplay", "evicted-42-again", ns, ("Approved",))
    again = replay["status"]["replayRunName"]
    # The replay run's script is the original's: send_email waits 60 s before answering.
    done = cluster.wait_phase("agentrun", again, ns, ("Succeeded", "Failed"), timeout=300)
    assert done["status"]["phase"] == "Succeeded", done["status"]
    assert cluster.emails("evicted-42", again) == 2, "one by the run, one by its forced replay"


def test_runner_is_not_root_and_its_root_filesystem_is_read_only(cluster: Cluster) -> None:
    ns = "shop"
    cluster.apply(ns, run_manifest("hello-1", [{"text": "Hello."}]), as_user="alice")
    run = cluster.wait_phase("agentrun", "hello-1", ns, ("Succeeded", "Failed"), timeout=240)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    log = pod_log(cluster, ns, "hello-1-1")
    start = next((line for line in log.splitlines() if "event=runner.start" in line), "")
    assert start, f"no runner.start line in the runner's log:\n{log[-2000:]}"
    fields = dict(part.split("=", 1) for part in start.split() if "=" in part)
    assert fields["process_uid"] != "0", start
    assert fields["root_read_only"] == "True", start


def test_over_its_memory_limit_the_runner_is_oom_killed(cluster: Cluster) -> None:
    ns = "shop"
    script = [{"call": "load_history", "args": {"customer": "c42", "megabytes": 1024}},
              {"text": "Loaded."}]
    cluster.apply(ns, run_manifest("big-history", script, resources={
        "limits": {"memory": "320Mi"}, "requests": {"memory": "320Mi"}}), as_user="alice")
    run = cluster.wait_phase("agentrun", "big-history", ns, ("Failed", "Succeeded"),
                             timeout=300)
    assert (run["status"]["phase"], run["status"]["reason"]) == ("Failed", "OOMKilled"), \
        run["status"]
    pod = cluster.get("pod", "big-history-1", ns)
    terminated = pod["status"]["containerStatuses"][0]["state"].get("terminated") or \
        pod["status"]["containerStatuses"][0]["lastState"].get("terminated") or {}
    assert terminated.get("reason") == "OOMKilled", pod["status"]


def test_an_image_that_cannot_be_pulled(cluster: Cluster) -> None:
    ns = "shop"
    # A registry on a loopback port nothing listens on: the pull is refused at once.
    cluster.apply(ns, run_manifest("no-image", [{"text": "never"}],
                                   image="127.0.0.1:9/agentrun/missing:1"))
    run = cluster.wait_phase("agentrun", "no-image", ns, ("Failed", "Succeeded"), timeout=300)
    assert (run["status"]["phase"], run["status"]["reason"]) == ("Failed", "ImagePullFailed"), \
        run["status"]
    assert run["status"]["toolsExecuted"] == []


def test_tenants_see_and_touch_only_their_own(cluster: Cluster) -> None:
    cluster.apply("bank", run_manifest("statement-1", [{"text": "Done."}]), as_user="bob")
    run = cluster.wait_phase("agentrun", "statement-1", "bank", ("Succeeded", "Failed"),
                             timeout=240)
    assert run["status"]["phase"] == "Succeeded", run["status"]
    for user, other in (("alice", "bank"), ("bob", "shop")):
        listed = cluster.kubectl("get", "agentruns", "-n", other, as_user=user, check=False)
        assert listed.returncode != 0 and "forbidden" in listed.stderr, (user, listed.stderr)
        replay = cluster.kubectl("apply", "-n", other, "-f", "-", as_user=user, check=False,
                                 input=json.dumps(replay_manifest("peek", "statement-1")))
        assert replay.returncode != 0 and "forbidden" in replay.stderr, (user, replay.stderr)


def test_the_answer_and_the_transcript_through_the_charts_api_service(
        cluster: Cluster) -> None:
    """The chart's APIService v1alpha1.store.agentrun.dev: the API server (with kubeadm's
    front-proxy flags) proxies to the store API's pods, which verify its front-proxy
    certificate and ask it whether the user may read."""
    ns = "shop"
    script = [{"call": "send_email", "args": EMAIL}, {"text": "Told the customer."}]
    cluster.apply(ns, run_manifest("told-42", script), as_user="alice")
    run = cluster.wait_phase("agentrun", "told-42", ns, ("Succeeded", "Failed"), timeout=240)
    assert run["status"]["phase"] == "Succeeded", run["status"]

    def available() -> bool:
        done = cluster.kubectl("get", "apiservice", "v1alpha1.store.agentrun.dev", "-o",
                               "json", check=False)
        found = json.loads(done.stdout) if done.returncode == 0 else {}
        return any(c.get("type") == "Available" and c.get("status") == "True"
                   for c in (found.get("status") or {}).get("conditions") or [])

    cluster.wait("APIService v1alpha1.store.agentrun.dev Available", available, timeout=120)
    got = cluster.kubectl("get", "transcripts.store.agentrun.dev", "told-42", "-n", ns,
                          "-o", "json", as_user="alice")
    transcript = json.loads(got.stdout)
    assert [(e["kind"], e.get("tool"), e.get("state")) for e in transcript["entries"]] == [
        ("input", None, None), ("toolCall", "send_email", "finished"),
        ("toolResult", "send_email", "finished"), ("text", None, None)], transcript
    assert transcript["entries"][1]["args"] == EMAIL
    assert transcript["result"]["text"] == "Told the customer."
    assert transcript["run"]["uid"] == run["metadata"]["uid"]
    refused = cluster.kubectl("get", "transcripts.store.agentrun.dev", "told-42", "-n", ns,
                              as_user="bob", check=False)
    assert refused.returncode != 0 and "forbidden" in refused.stderr, refused.stderr

    # kubectl agentrun, with alice's own kubeconfig (a client certificate of the cluster).
    env = {**cluster.env, "KUBECONFIG": str(cluster.plane.issue_kubeconfig("alice", "alice"))}

    def plugin(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([str(cluster.plane.bin / "kubectl"), "agentrun", *args, "-n", ns],
                              env=env, capture_output=True, text=True, timeout=60)

    answer = plugin("result", "told-42")
    assert answer.returncode == 0 and answer.stdout == "Told the customer.\n", \
        answer.stdout + answer.stderr
    told = plugin("transcript", "told-42")
    assert told.returncode == 0, told.stderr
    assert "support_agent calls send_email (call 1)" in told.stdout, told.stdout
    assert "support_agent: Told the customer." in told.stdout, told.stdout


def test_the_declarative_sample_runs_an_agent_with_its_mcp_server(cluster: Cluster) -> None:
    """samples/declarative/README.md as written: the MCP server as a pod of the runner image
    (its script from a ConfigMap) behind a Service, the Agent (alice may apply it once she
    may get the Secret it names), and a run of it, each a container on the real node."""
    ns, sample = "shop", REPO / "samples" / "declarative"
    cluster.kubectl("create", "configmap", "crm-mcp", "-n", ns,
                    f"--from-file={sample / 'crm_mcp.py'}")
    cluster.kubectl("apply", "-n", ns, "-f", str(sample / "crm-mcp.yaml"))
    cluster.kubectl("create", "secret", "generic", "crm", "-n", ns,
                    "--from-literal=token=Bearer demo-token")
    refused = cluster.kubectl("apply", "-n", ns, "-f", str(sample / "agent.yaml"),
                              as_user="alice", check=False)
    assert refused.returncode != 0 and "alice may not get secrets/crm" in refused.stderr, \
        refused.stderr
    cluster.kubectl("create", "role", "crm-reader", "-n", ns, "--verb=get",
                    "--resource=secrets", "--resource-name=crm")
    cluster.kubectl("create", "rolebinding", "alice-crm", "-n", ns, "--role=crm-reader",
                    "--user=alice")
    cluster.wait("the Agent admitted for alice", lambda: cluster.kubectl(
        "apply", "-n", ns, "-f", str(sample / "agent.yaml"), as_user="alice",
        check=False).returncode == 0, timeout=60)
    cluster.kubectl("wait", "-n", ns, "--for=condition=Ready", "agent/triage", "--timeout=120s")
    cluster.kubectl("wait", "-n", ns, "--for=condition=Ready", "pod/crm-mcp", "--timeout=300s",
                    timeout=320)
    cluster.kubectl("apply", "-n", ns, "-f", str(sample / "agentrun.yaml"), as_user="alice")
    run = cluster.wait_phase("agentrun", "refund-42", ns, ("Succeeded", "Failed"), timeout=300)
    status = run["status"]
    assert status["phase"] == "Succeeded", status
    assert status["toolsExecuted"] == ["lookup_customer", "refund_policy", "update_ticket"]
    assert status["agentDigest"] == cluster.get("agent", "triage", ns)["status"]["digest"]
    calls = {c["tool"]: c for c in status["toolCalls"]}
    assert {t: c["effect"] for t, c in calls.items()} == {
        "lookup_customer": "ReadOnly", "refund_policy": "ReadOnly", "update_ticket": "Idempotent"}
    seen = [json.loads(line.split("crm-mcp call ", 1)[1])
            for line in pod_log(cluster, ns, "crm-mcp").splitlines() if "crm-mcp call " in line]
    assert [c["tool"] for c in seen] == ["lookup_customer", "update_ticket"]
    assert all(c["idempotencyKey"] == calls[c["tool"]]["idempotencyKey"] for c in seen)
    token = hashlib.sha256(b"Bearer demo-token").hexdigest()
    assert all(c["authorizationSha256"] == token for c in seen)


def test_no_tenant_text_expands_into_the_agents_secret_on_a_real_kubelet(
        cluster: Cluster) -> None:
    """A run of the declarative sample's Agent whose model, env and input name the Agent's
    Secret header variable: the real kubelet expands $(VAR) only from what precedes it, and
    the operator's variables (the model among them) are escaped, so the runner is told
    the model as the tenant wrote it and the Secret reaches no status, Event or answer."""
    ns = "shop"
    header = f"$({header_env('triage', 'crm', 'Authorization')})"
    cluster.apply(ns, run_manifest("expand-42", [{"text": "never"}], agent="triage",
                                   model=header, input={"text": header},
                                   env=[{"name": "PROBE", "value": header}]), as_user="alice")
    run = cluster.wait_phase("agentrun", "expand-42", ns, ("Succeeded", "Failed"), timeout=300)
    status = run["status"]
    assert status["phase"] == "Failed" and status["toolsExecuted"] == [], status
    assert header in status.get("message", ""), status
    assert "demo-token" not in json.dumps(run)
    events = cluster.kubectl("get", "events", "-n", ns, "-o", "json").stdout
    assert "demo-token" not in events


def test_helm_upgrade_keeps_every_run(cluster: Cluster) -> None:
    before = {(r["metadata"]["namespace"], r["metadata"]["name"]): r["metadata"]["uid"]
              for r in json.loads(cluster.kubectl("get", "agentruns", "-A", "-o",
                                                  "json").stdout)["items"]}
    assert len(before) >= 5
    stored = cluster.query("SELECT count(*) FROM runs")[0][0]
    done = subprocess.run(
        ["helm", "upgrade", "agentrun", "charts/agentrun", "--namespace", RELEASE_NAMESPACE,
         "--reuse-values", "--set", "operator.checkIntervalSeconds=120", "--wait",
         "--timeout", "5m"], cwd=REPO, env=cluster.env, capture_output=True, text=True,
        timeout=600)
    assert done.returncode == 0, done.stderr
    after = {(r["metadata"]["namespace"], r["metadata"]["name"]): r["metadata"]["uid"]
             for r in json.loads(cluster.kubectl("get", "agentruns", "-A", "-o",
                                                 "json").stdout)["items"]}
    assert after == before
    assert cluster.query("SELECT count(*) FROM runs")[0][0] == stored
    # The upgraded operator still works: a new run succeeds.
    cluster.apply("shop", run_manifest("after-upgrade", [{"text": "Still here."}]))
    run = cluster.wait_phase("agentrun", "after-upgrade", "shop", ("Succeeded", "Failed"),
                             timeout=240)
    assert run["status"]["phase"] == "Succeeded", run["status"]


def test_helm_uninstall_keeps_the_store(cluster: Cluster) -> None:
    done = subprocess.run(["helm", "uninstall", "agentrun", "--namespace", RELEASE_NAMESPACE,
                           "--wait", "--timeout", "5m"], cwd=REPO, env=cluster.env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    pvcs = json.loads(cluster.kubectl("get", "pvc", "-n", RELEASE_NAMESPACE, "-o",
                                      "json").stdout)["items"]
    assert [p["metadata"]["name"] for p in pvcs] == ["data-agentrun-postgres-0"], pvcs
    secret = cluster.get("secret", "agentrun-postgres", RELEASE_NAMESPACE)
    assert secret, "the generated Postgres password is kept with the data"
