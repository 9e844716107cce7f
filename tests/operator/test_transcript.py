"""The transcript through the Kubernetes API server: the aggregated API store.agentrun.dev,
served by the session's store API (beside the session operator) and registered with the real
kube-apiserver (APIService v1alpha1.store.agentrun.dev, front-proxy flags as kubeadm sets
them). Users are real users of the control plane's CA with their own kubeconfigs, bound to
agentrun-view in their own namespace; runs are real runners of the scripted model."""

from __future__ import annotations

import json
import os
import re
import ssl
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from agentrun_devtools import transcript_api
from agentrun_devtools.controlplane import REPO, ControlPlane
from agentrun_devtools.processes import wait_for
from agentrun_devtools.transcript_api import TranscriptEndpoint
from agentrun_kubectl import cluster, main

from agentrun import store
from agentrun.vocabulary import (
    APPROVER_CLUSTER_ROLE,
    ENV_TEST_CRASH_IN,
    TRANSCRIPT_API_SERVICE,
    TRANSCRIPT_API_VERSION,
    EntryKind,
    EntryState,
    Phase,
)
from tests.approvals import REQUIRED, SCRIPT, approval, create_as, waiting
from tests.cluster_fixtures import fresh_namespace
from tests.harness import HAPPY, System, agent_run, in_namespace

TRANSCRIPTS = "transcripts.store.agentrun.dev"
BIN = Path(sys.executable).parent  # kubectl-agentrun, found by kubectl on PATH


@pytest.fixture(scope="module")
def users(control_plane: ControlPlane) -> dict[str, Path]:
    """Kubeconfigs of alice, bob, carol and dave: client certificates of the cluster's CA,
    as a cluster admin hands them out."""
    return {name: control_plane.issue_kubeconfig(name, name)
            for name in ("alice", "bob", "carol", "dave")}


@pytest.fixture
def transcripts(system: System) -> System:
    """The system once the API server has the transcript API Available."""
    transcript_api.wait_available(system.plane)
    return system


@pytest.fixture
def tenants(transcripts: System, namespace: str, control_plane: ControlPlane
            ) -> Iterator[tuple[str, str]]:
    """Two namespaces: alice views the first, bob the second (agentrun-view), dave edits the
    first (agentrun-edit); carol is bound nowhere."""
    for other in fresh_namespace(control_plane, "t"):
        for ns, user, role in ((namespace, "alice", "agentrun-view"),
                               (other, "bob", "agentrun-view"),
                               (namespace, "dave", "agentrun-edit")):
            transcripts.kubectl("create", "rolebinding", f"{user}-{role}", "-n", ns,
                                f"--clusterrole={role}", f"--user={user}")
        yield namespace, other


def as_user(system: System, kubeconfig: Path, *args: str,
            **kw: Any) -> subprocess.CompletedProcess[str]:
    """kubectl with the user's own kubeconfig (the plugin on PATH)."""
    return subprocess.run([str(system.plane.bin / "kubectl"), *args], capture_output=True,
                          text=True, env=user_env(kubeconfig), timeout=kw.pop("timeout", 120),
                          **kw)


def user_env(kubeconfig: Path) -> dict[str, str]:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "KUBECONFIG": str(kubeconfig)}
    env.pop("DATABASE_URL", None)
    return env


def read(system: System, kubeconfig: Path, namespace: str, name: str) -> dict[str, Any]:
    done = as_user(system, kubeconfig, "get", TRANSCRIPTS, name, "-n", namespace, "-o", "json")
    assert done.returncode == 0, done.stderr
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def settled(system: System, namespace: str, name: str) -> dict[str, Any]:
    return system.wait_run(namespace, name, lambda r: (r.get("status") or {}).get(
        "phase") in Phase.TERMINAL and r["status"].get("toolsExecuted") is not None)


def kinds(transcript: dict[str, Any]) -> list[tuple[str, str | None]]:
    return [(e["kind"], e.get("tool")) for e in transcript["entries"]]


def test_each_tenant_reads_its_own_transcripts_and_no_one_elses(
        transcripts: System, tenants: tuple[str, str], users: dict[str, Path]) -> None:
    ns_a, ns_b = tenants
    transcripts.apply(in_namespace(agent_run("ours", [{"text": "Done in A."}]), ns_a))
    transcripts.apply(in_namespace(agent_run("theirs", [{"text": "Done in B."}]), ns_b))
    settled(transcripts, ns_a, "ours")
    settled(transcripts, ns_b, "theirs")

    mine = read(transcripts, users["alice"], ns_a, "ours")
    assert (mine["apiVersion"], mine["kind"]) == (TRANSCRIPT_API_VERSION, "Transcript")
    assert mine["metadata"]["name"] == "ours" and mine["metadata"]["namespace"] == ns_a
    assert mine["run"]["phase"] == Phase.SUCCEEDED
    assert mine["run"]["uid"] == transcripts.run(ns_a, "ours")["metadata"]["uid"]
    assert mine["result"]["text"] == "Done in A."
    assert read(transcripts, users["bob"], ns_b, "theirs")["result"]["text"] == "Done in B."
    # An editor reads too (agentrun-edit).
    assert read(transcripts, users["dave"], ns_a, "ours")["result"]["text"] == "Done in A."

    listed = as_user(transcripts, users["alice"], "get", TRANSCRIPTS, "-n", ns_a, "-o", "json")
    assert listed.returncode == 0, listed.stderr
    assert [t["metadata"]["name"] for t in json.loads(listed.stdout)["items"]] == ["ours"]
    table = as_user(transcripts, users["alice"], "get", TRANSCRIPTS, "-n", ns_a)
    assert table.returncode == 0, table.stderr
    # A list holds summaries: the run's usage and its answer's first words, no entries.
    assert table.stdout.split("\n")[0].split() == ["NAME", "PHASE", "MODEL-CALLS",
                                                   "TOOL-CALLS", "RESULT", "AGE"]
    assert table.stdout.split("\n")[1].split()[:6] == ["ours", "Succeeded", "1", "0", "Done",
                                                       "in"]
    (item,) = json.loads(listed.stdout)["items"]
    assert "entries" not in item and item["result"]["preview"] == "Done in A."

    for user, other, name in (("alice", ns_b, "theirs"), ("bob", ns_a, "ours"),
                              ("carol", ns_a, "ours")):
        got = as_user(transcripts, users[user], "get", TRANSCRIPTS, name, "-n", other)
        assert got.returncode != 0
        assert (f'Error from server (Forbidden): {TRANSCRIPTS} "{name}" is forbidden: User '
                f'"{user}" cannot get resource "transcripts" in API group "store.agentrun.dev" '
                f'in the namespace "{other}"') in got.stderr, got.stderr
        listed = as_user(transcripts, users[user], "get", TRANSCRIPTS, "-n", other)
        assert listed.returncode != 0 and f'User "{user}" cannot list resource "transcripts"' \
            in listed.stderr, listed.stderr
    # Nor across namespaces, nor through the plugin.
    everywhere = as_user(transcripts, users["alice"], "get", TRANSCRIPTS, "-A")
    assert everywhere.returncode != 0 and "at the cluster scope" in everywhere.stderr
    peek = as_user(transcripts, users["carol"], "agentrun", "result", "ours", "-n", ns_a)
    assert peek.returncode == 1 and "forbidden" in peek.stderr, peek.stderr
    missing = as_user(transcripts, users["alice"], "get", TRANSCRIPTS, "nobody", "-n", ns_a)
    assert f'Error from server (NotFound): {TRANSCRIPTS} "nobody" not found' in missing.stderr


def test_the_entries_are_the_conversation(transcripts: System, tenants: tuple[str, str],
                                          users: dict[str, Path]) -> None:
    ns, _ = tenants
    transcripts.apply(in_namespace(agent_run("told", HAPPY), ns))
    settled(transcripts, ns, "told")
    found = read(transcripts, users["alice"], ns, "told")
    assert kinds(found) == [
        ("input", None), ("toolCall", "read_message"), ("toolResult", "read_message"),
        ("toolCall", "send_email"), ("toolResult", "send_email"),
        ("toolCall", "update_crm"), ("toolResult", "update_crm"), ("text", None)]
    entries = found["entries"]
    assert entries[0] == {**entries[0], "attempt": 1, "author": "user",
                          "text": "Customer 42 asks for a refund"}
    call, answer = entries[3], entries[4]
    assert call["args"] == {"to": "customer-42@example.com", "body": "Refund on its way"}
    assert (call["seq"], call["state"], call["author"]) == (2, EntryState.FINISHED,
                                                            "support_agent")
    assert answer["result"] == {"status": "sent", "to": "customer-42@example.com"}
    assert (answer["seq"], answer["state"]) == (2, EntryState.FINISHED)
    assert entries[-1]["text"] == "Refunded customer 42 and told them."
    assert found["result"]["text"] == "Refunded customer 42 and told them."
    assert found["result"]["digest"].startswith("sha256:")
    assert found["usage"] == {"modelCalls": 4, "toolCalls": 3, "inputTokens": 400,
                              "outputTokens": 40}
    assert [e["time"] for e in entries] == sorted(e["time"] for e in entries)


def test_a_runner_killed_mid_tool_leaves_the_call_in_doubt(
        transcripts: System, tenants: tuple[str, str], users: dict[str, Path]) -> None:
    ns, _ = tenants
    script = [{"call": "send_email", "args": {"to": "c42@example.com", "body": "Refund"}},
              {"text": "never said"}]
    transcripts.apply(in_namespace(agent_run(
        "killed", script, env=[{"name": ENV_TEST_CRASH_IN, "value": "send_email"}]), ns))
    status = settled(transcripts, ns, "killed")["status"]
    assert status["phase"] == Phase.FAILED and status["toolsExecuted"] == ["send_email"]
    found = read(transcripts, users["alice"], ns, "killed")
    assert kinds(found) == [("input", None), ("toolCall", "send_email"), ("error", None)]
    call = found["entries"][1]
    assert (call["state"], call["seq"], call["args"]) == (
        EntryState.IN_DOUBT, 1, {"to": "c42@example.com", "body": "Refund"})
    error = found["entries"][2]
    assert error["author"] == "agentrun" and error["result"]["reason"] == status["reason"]
    assert "result" not in found
    shown = as_user(transcripts, users["alice"], "agentrun", "transcript", "killed", "-n", ns)
    assert shown.returncode == 0, shown.stderr
    assert re.search(r"support_agent calls send_email \(call 1\) .*\[IN DOUBT: called, its "
                     r"end never recorded", shown.stdout), shown.stdout


def test_approved_and_denied_calls(transcripts: System, tenants: tuple[str, str],
                                   users: dict[str, Path]) -> None:
    ns, _ = tenants
    transcripts.kubectl("create", "rolebinding", "ann-approver", "-n", ns,
                        f"--clusterrole={APPROVER_CLUSTER_ROLE}", "--user=ann")
    for name in ("allowed", "refused"):
        transcripts.apply(in_namespace(agent_run(name, SCRIPT, tools=REQUIRED), ns))
    pending = waiting(transcripts, ns, "allowed")["status"]["pendingApproval"]
    # While it waits: the call, and that it waits (no state yet).
    held = read(transcripts, users["alice"], ns, "allowed")
    assert held["run"]["phase"] == Phase.WAITING
    assert kinds(held)[-2:] == [("toolCall", "charge_card"), ("approval", "charge_card")]
    assert "state" not in held["entries"][-2]
    assert held["entries"][-1]["args"] == {"customer": "42", "amount": 120}
    assert held["entries"][-1]["seq"] == pending["seq"] == 2
    assert "expiresAt" in held["entries"][-1]["result"]
    assert create_as(transcripts, "ann", approval(ns, "allowed-2", "allowed", pending, "ann",
                                                  note="customer confirmed")).returncode == 0
    denied = waiting(transcripts, ns, "refused")["status"]["pendingApproval"]
    assert create_as(transcripts, "ann", approval(ns, "refused-2", "refused", denied, "ann",
                                                  decision="Deny", note="not this month")
                     ).returncode == 0
    settled(transcripts, ns, "allowed")
    settled(transcripts, ns, "refused")

    yes = read(transcripts, users["alice"], ns, "allowed")
    assert kinds(yes) == [
        ("input", None), ("toolCall", "read_message"), ("toolResult", "read_message"),
        ("toolCall", "charge_card"), ("approval", "charge_card"), ("approval", "charge_card"),
        ("toolResult", "charge_card"), ("text", None)]
    call, asked, decided, result = yes["entries"][3:7]
    assert (call["attempt"], call["seq"], call["state"]) == (1, 2, EntryState.FINISHED)
    assert (asked["author"], decided["author"]) == ("agentrun", "ann")
    assert decided["result"] == {"decision": "Approve", "note": "customer confirmed"}
    assert (result["attempt"], result["seq"], result["state"]) == (2, 2, EntryState.FINISHED)
    assert result["result"] == {"status": "charged", "customer": "42", "amount": 120}

    no = read(transcripts, users["alice"], ns, "refused")
    call, _, decided, result = no["entries"][3:7]
    assert call["state"] == decided["state"] == result["state"] == EntryState.DENIED
    assert decided["result"] == {"decision": "Deny", "note": "not this month"}
    assert result["result"] == {"error": "denied by ann: not this month"}
    shown = as_user(transcripts, users["alice"], "agentrun", "transcript", "refused", "-n", ns)
    assert "charge_card (call 2) waits for an approval of" in shown.stdout, shown.stdout
    assert "ann denied charge_card (call 2): not this month" in shown.stdout
    assert re.search(r"charge_card \(call 2\) returned .*denied by ann.*\[denied\]",
                     shown.stdout), shown.stdout


def _follow(system: System, kubeconfig: Path, namespace: str, name: str
            ) -> list[tuple[float, dict[str, Any]]]:
    """GET ...?follow=true through the API server as the kubeconfig's user: each line with
    when it arrived (the wall clock, as the store's timestamps are), until the stream
    ends."""
    config = json.loads(kubeconfig.read_text())
    user = config["users"][0]["user"]
    context = ssl.create_default_context(cafile=str(system.plane.ca_cert))
    context.load_cert_chain(user["client-certificate"], user["client-key"])
    url = (f"{system.plane.server}/apis/store.agentrun.dev/v1alpha1/namespaces/{namespace}"
           f"/transcripts/{name}?follow=true")
    lines = []
    with urllib.request.urlopen(url, context=context, timeout=120) as response:
        assert response.headers["Content-Type"] == "application/x-ndjson"
        for line in response:
            lines.append((time.time(), json.loads(line)))
    return lines


def test_follow_streams_a_live_run_and_ends_when_it_settles(
        transcripts: System, tenants: tuple[str, str], users: dict[str, Path]) -> None:
    ns, _ = tenants
    script = [{"call": "read_message", "args": {}}, {"sleep": 6},
              {"call": "update_crm", "args": {"customer": "42", "status": "refunded"}},
              {"sleep": 4}, {"text": "Refunded."}]
    transcripts.apply(in_namespace(agent_run("slow", script), ns))
    transcripts.wait_phase(ns, "slow", Phase.RUNNING)
    streamed: list[tuple[float, dict[str, Any]]] = []
    follower = threading.Thread(target=lambda: streamed.extend(
        _follow(transcripts, users["alice"], ns, "slow")))
    follower.start()
    plugin = subprocess.Popen(
        [str(transcripts.plane.bin / "kubectl"), "agentrun", "transcript", "slow", "-n", ns,
         "-f"], stdout=subprocess.PIPE, text=True, env=user_env(users["alice"]))
    run = settled(transcripts, ns, "slow")
    settled_at = time.time()
    follower.join(60)
    assert not follower.is_alive(), "the stream did not end once the run settled"
    out, _ = plugin.communicate(timeout=60)
    assert plugin.returncode == 0, out

    assert run["status"]["phase"] == Phase.SUCCEEDED
    said = [(e["kind"], e.get("tool")) for _, e in streamed]
    assert said[0] == ("input", None) and said[-1] == ("text", None), said
    first_call = next(at for at, e in streamed if e.get("tool") == "read_message")
    # The first call was streamed while the run was still at it: before the model (6 s of
    # thought later) had even started the second call, as its ledger row records. An
    # order of two moments, not a bound on how soon a line arrives (no timing here).
    [crm] = [c for c in transcripts.store(lambda e: store.ledger(e, run["metadata"]["uid"]))
             if c.tool == "update_crm"]
    assert first_call < crm.started_at.timestamp(), (first_call, crm.started_at, streamed)
    assert first_call < settled_at
    # Each entry as the Transcript has it at the end (a call's line comes again when it
    # finishes: the last of each is the final one).
    last = {(e["kind"], e["time"]): e for _, e in streamed}
    final = read(transcripts, users["alice"], ns, "slow")["entries"]
    assert [last[(e["kind"], e["time"])] for e in final] == final
    assert "support_agent: Refunded." in out
    assert "update_crm (call 2) returned" in out
    assert out.rstrip().endswith("slow Succeeded; its whole answer: kubectl agentrun result "
                                 "slow")


def test_kubectl_agentrun_result_and_transcript_as_the_readme_shows(
        transcripts: System, tenants: tuple[str, str], users: dict[str, Path]) -> None:
    ns, _ = tenants
    sample = yaml.safe_load((REPO / "samples" / "agentrun-scripted.yaml").read_text())
    transcripts.apply(in_namespace(sample, ns))
    settled(transcripts, ns, "scripted-refund")
    readme = _readme_plugin_block()
    for command, expected in readme:
        argv = command.split()
        assert argv[:3] == ["kubectl", "agentrun", argv[2]]
        done = as_user(transcripts, users["alice"], *argv[1:], "-n", ns)
        assert done.returncode == 0, done.stderr
        assert _without_times(done.stdout) == _without_times(expected), (command, done.stdout)

    triaged = {"priority": "urgent", "summary": "Customer 42 wants a refund"}
    transcripts.apply(in_namespace(agent_run("triaged", [{"text": json.dumps(triaged)}],
                                             agent="triage-agent"), ns))
    settled(transcripts, ns, "triaged")
    done = as_user(transcripts, users["alice"], "agentrun", "result", "triaged", "-n", ns,
                   "-o", "json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == triaged
    plain = as_user(transcripts, users["alice"], "agentrun", "result", "scripted-refund",
                    "-n", ns, "-o", "json")
    assert plain.returncode == 1 and "not an object of an output schema" in plain.stderr


def test_the_plugin_waits_out_an_apiservice_not_yet_available(
        transcripts: System, tenants: tuple[str, str], users: dict[str, Path],
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """The API server answers 503 while its aggregator has not found the transcript API
    available (as right after `make run` or an install: it looks again every 30 s): the
    plugin says so, waits, and answers once it is; past its wait it says what the
    APIService says. Made unavailable here by pointing the APIService at a port its Service
    does not have (an APIService's change is looked at at once)."""
    ns, _ = tenants
    transcripts.apply(in_namespace(agent_run("awaited", HAPPY), ns))
    settled(transcripts, ns, "awaited")

    def point_at(port: int) -> None:
        transcripts.kubectl("patch", "apiservice", TRANSCRIPT_API_SERVICE, "--type=merge",
                            "-p", json.dumps({"spec": {"service": {"port": port}}}))

    def available() -> str:
        found = json.loads(transcripts.kubectl("get", "apiservice", TRANSCRIPT_API_SERVICE,
                                               "-o", "json").stdout)
        return next(c["status"] for c in found.get("status", {}).get("conditions", [])
                    if c["type"] == "Available")

    point_at(444)
    try:
        wait_for(lambda: available() == "False", timeout=60, what="the APIService unavailable")
        # Past its wait, as a cluster admin: the APIService's own words.
        monkeypatch.setattr(cluster, "UNAVAILABLE_WAIT", 2.0)
        code = main.main(["result", "awaited", "-n", ns, "--kubeconfig",
                          str(transcripts.plane.kubeconfig)])
        told = capsys.readouterr().err
        assert code == cluster.ERROR, told
        assert "trying again for up to 2 s" in told, told
        assert f"APIService {TRANSCRIPT_API_SERVICE} Available=False" in told, told
        # A viewer who may not read APIServices: waits, then has the answer.
        plugin = subprocess.Popen(
            [str(transcripts.plane.bin / "kubectl"), "agentrun", "result", "awaited", "-n", ns],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env=user_env(users["alice"]))
        assert plugin.stderr is not None
        first = plugin.stderr.readline()
        assert "has not found the transcript API available yet" in first, first
        assert "not readable by you (403)" in first, first
        point_at(443)
        out, err = plugin.communicate(timeout=60)
        assert plugin.returncode == 0, first + err
        assert out == "Refunded customer 42 and told them.\n", out
    finally:
        point_at(443)
        transcript_api.wait_available(transcripts.plane)


def _readme_plugin_block() -> list[tuple[str, str]]:
    """(command, its output) of README's transcript example ("$ kubectl agentrun ...")."""
    text = (REPO / "README.md").read_text()
    section = text.split("### The transcript", 1)[1].split("\n## ", 1)[0]
    block = re.findall(r"```sh\n(.*?)```", section, re.S)[0]
    found: list[tuple[str, str]] = []
    for chunk in re.split(r"^\$ ", block, flags=re.M)[1:]:
        command, _, output = chunk.partition("\n")
        found.append((command.strip(), output))
    return found


def _without_times(text: str) -> str:
    return re.sub(r"\b\d\d:\d\d:\d\d\b", "HH:MM:SS", text).strip()


# -- the transcript API's own door: only the API server's front proxy comes in --------------


def _direct(system: System, endpoint: TranscriptEndpoint, path: str,
            cert: tuple[Path, Path] | None, headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
    tls = system.plane.store_api_tls
    assert tls is not None
    context = ssl.create_default_context(cafile=str(tls.ca))
    if cert is not None:
        context.load_cert_chain(str(cert[0]), str(cert[1]))
    request = urllib.request.Request(f"https://{endpoint.listen}{path}", headers=headers)
    try:
        with urllib.request.urlopen(request, context=context, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_only_the_api_servers_front_proxy_is_served(
        transcripts: System, tenants: tuple[str, str],
        transcript_endpoint: TranscriptEndpoint) -> None:
    ns, _ = tenants
    transcripts.apply(in_namespace(agent_run("door", [{"text": "Hello."}]), ns))
    settled(transcripts, ns, "door")
    path = f"/apis/store.agentrun.dev/v1alpha1/namespaces/{ns}/transcripts/door"
    front = transcripts.plane.front_proxy
    pki = transcripts.plane.root / "pki"
    assert front is not None
    as_alice = {"X-Remote-User": "alice", "X-Remote-Group": "system:authenticated"}

    code, said = _direct(transcripts, transcript_endpoint, path, None, as_alice)
    assert (code, said["kind"], said["reason"]) == (401, "Status", "Unauthorized")
    assert "no client certificate" in said["message"]
    # A client certificate of the cluster's own CA (the admin's) is not the front proxy's:
    # the handshake refuses it (the listener trusts the front-proxy CA alone).
    with pytest.raises((ssl.SSLError, ConnectionError, urllib.error.URLError)):
        _direct(transcripts, transcript_endpoint, path, (pki / "admin.crt", pki / "admin.key"),
                as_alice)
    # The front proxy's certificate, naming nobody.
    code, said = _direct(transcripts, transcript_endpoint, path, (front.cert, front.key), {})
    assert code == 401 and "named no user" in said["message"]
    # The front proxy naming a user: the API server is asked (SubjectAccessReview).
    code, said = _direct(transcripts, transcript_endpoint, path, (front.cert, front.key),
                         {"X-Remote-User": "carol"})
    assert (code, said["reason"]) == (403, "Forbidden"), said
    assert 'User "carol" cannot get resource "transcripts"' in said["message"]
    code, said = _direct(transcripts, transcript_endpoint, path, (front.cert, front.key),
                         as_alice)
    assert code == 200 and said["result"]["text"] == "Hello."
    assert [e["kind"] for e in said["entries"]] == [EntryKind.INPUT, EntryKind.TEXT]
    # The API server's OpenAPI aggregation asks every minute for documents there are none
    # of: 404, and no log line for it (a refusal is logged: carol's, above).
    for openapi in ("/openapi/v2", "/openapi/v3"):
        code, said = _direct(transcripts, transcript_endpoint, openapi, (front.cert, front.key),
                             as_alice)
        assert (code, said["reason"]) == (404, "NotFound"), said
    # The transcript API's log is the store API's (the session's, beside its operator).
    assert transcripts.operator.store_api is not None
    log = transcripts.operator.store_api.log_path.read_text(errors="replace")
    assert "event=transcript-refused path=/openapi/" not in log
    assert f"event=transcript-refused path={path} code=403" in log


def test_a_follower_goes_on_past_the_api_servers_request_timeout(
        transcripts: System, tenants: tuple[str, str], users: dict[str, Path]) -> None:
    """The API server cuts any GET that is not a watch at its --request-timeout (60 s): a
    stream ends before that (FOLLOW_SECONDS) while the run thinks on, and the plugin asks
    again, printing each entry once."""
    from agentrun_store_api.transcripts import FOLLOW_SECONDS

    ns, _ = tenants
    script = [{"call": "read_message", "args": {}}, {"sleep": FOLLOW_SECONDS + 8},
              {"text": "Thought it over."}]
    transcripts.apply(in_namespace(agent_run("pensive", script), ns))
    transcripts.wait_phase(ns, "pensive", Phase.RUNNING)
    plugin = subprocess.Popen(
        [str(transcripts.plane.bin / "kubectl"), "agentrun", "transcript", "pensive", "-n", ns,
         "-f"], stdout=subprocess.PIPE, text=True, env=user_env(users["alice"]))
    first = _follow(transcripts, users["alice"], ns, "pensive")
    assert transcripts.run(ns, "pensive")["status"]["phase"] == Phase.RUNNING, \
        "the first stream should have ended at its window, the run still thinking"
    assert [e["kind"] for _, e in first][:3] == ["input", "toolCall", "toolResult"]
    settled(transcripts, ns, "pensive")
    out, _ = plugin.communicate(timeout=60)
    assert plugin.returncode == 0, out
    assert out.count("calls read_message (call 1)") == 1, out
    assert "support_agent: Thought it over." in out


def _get_as(system: System, kubeconfig: Path, path: str, **kw: Any) -> Any:
    """GET `path` of the API server as the kubeconfig's user (the response, still open)."""
    config = json.loads(kubeconfig.read_text())
    user = config["users"][0]["user"]
    context = ssl.create_default_context(cafile=str(system.plane.ca_cert))
    context.load_cert_chain(user["client-certificate"], user["client-key"])
    return urllib.request.urlopen(f"{system.plane.server}{path}", context=context,
                                  timeout=60, **kw)


def test_a_list_comes_in_pages_of_summaries(
        transcripts: System, tenants: tuple[str, str], users: dict[str, Path]) -> None:
    ns, _ = tenants
    names = [f"paged-{i}" for i in range(5)]
    for name in names:
        transcripts.apply(in_namespace(agent_run(name, [{"text": f"Answer of {name}."}]), ns))
    for name in names:
        settled(transcripts, ns, name)
    base = f"/apis/store.agentrun.dev/v1alpha1/namespaces/{ns}/transcripts?limit=2"
    pages, token = [], ""
    while True:
        with _get_as(transcripts, users["alice"],
                     base + (f"&continue={urllib.parse.quote(token)}" if token else "")) as r:
            page = json.loads(r.read())
        pages.append(page)
        token = page["metadata"].get("continue", "")
        if not token:
            break
    assert [len(p["items"]) for p in pages][:2] == [2, 2]
    seen = [t["metadata"]["name"] for p in pages for t in p["items"]]
    assert sorted(n for n in seen if n.startswith("paged-")) == names
    assert len(seen) == len(set(seen))  # no run twice across pages
    first = next(t for p in pages for t in p["items"] if t["metadata"]["name"] == "paged-0")
    assert "entries" not in first
    assert first["result"] == {"preview": "Answer of paged-0.", "attempt": 1}
    assert first["usage"]["modelCalls"] == 1
    # kubectl follows the pages itself (its --chunk-size is the limit).
    chunked = as_user(transcripts, users["alice"], "get", TRANSCRIPTS, "-n", ns,
                      "--chunk-size=2", "-o", "name")
    assert chunked.returncode == 0, chunked.stderr
    assert {line.rsplit("/", 1)[1] for line in chunked.stdout.split()} >= set(names)


def test_one_viewer_holds_at_most_a_few_follows(
        transcripts: System, tenants: tuple[str, str], users: dict[str, Path]) -> None:
    from agentrun_store_api.transcripts import FOLLOW_RETRY_SECONDS, FOLLOWS_PER_USER

    ns, other = tenants
    transcripts.apply(in_namespace(agent_run("watched", [{"sleep": 20}, {"text": "Done."}]),
                                   ns))
    transcripts.apply(in_namespace(agent_run("bobs", [{"sleep": 20}, {"text": "Done."}]),
                                   other))
    transcripts.wait_phase(ns, "watched", Phase.RUNNING)
    transcripts.wait_phase(other, "bobs", Phase.RUNNING)
    path = f"/apis/store.agentrun.dev/v1alpha1/namespaces/{ns}/transcripts/watched?follow=true"
    held = [_get_as(transcripts, users["alice"], path) for _ in range(FOLLOWS_PER_USER)]
    try:
        assert all(r.status == 200 for r in held)
        refused = []
        for _ in range(3):
            with pytest.raises(urllib.error.HTTPError) as caught:
                _get_as(transcripts, users["alice"], path)
            refused.append(caught.value)
        assert [e.code for e in refused] == [429] * 3
        assert refused[0].headers["Retry-After"] == str(FOLLOW_RETRY_SECONDS)
        status = json.loads(refused[0].read())
        assert status["reason"] == "TooManyRequests"
        assert f"alice follows {FOLLOWS_PER_USER} transcripts already" in status["message"]
        # Another viewer is not counted with alice.
        with _get_as(transcripts, users["bob"], path.replace(ns, other).replace(
                "watched", "bobs")) as theirs:
            assert theirs.status == 200
            assert json.loads(theirs.readline())["kind"] == "input"
    finally:
        for r in held:
            r.close()
    # Once the run settles the streams end, and alice may follow again.
    settled(transcripts, ns, "watched")

    def follows_again() -> bool:
        try:
            with _get_as(transcripts, users["alice"], path) as r:
                r.read()
                return r.status == 200
        except urllib.error.HTTPError as e:
            assert e.code == 429
            return False

    wait_for(follows_again, timeout=60, what="alice's follows given back")


# ~2 KB of arguments whose decisive part comes after byte 1,024 of their canonical JSON
# (keys sorted: "body" before "to"), as an injected prompt would pad them.
PADDED = {"body": "Please find the refund details below. " + "x" * 1900,
          "to": "attacker@evil.example"}


def test_an_approver_reads_the_whole_arguments_and_approves_only_what_was_shown(
        transcripts: System, namespace: str, control_plane: ControlPlane) -> None:
    ns = namespace
    paula = control_plane.issue_kubeconfig("paula", "paula")
    quinn = control_plane.issue_kubeconfig("quinn", "quinn")
    # paula: agentrun-approver only (no agentrun-view: the approver role reads transcripts).
    transcripts.kubectl("create", "rolebinding", "paula-approver", "-n", ns,
                        f"--clusterrole={APPROVER_CLUSTER_ROLE}", "--user=paula")
    # quinn may create approvals and read runs, not transcripts.
    transcripts.kubectl("create", "role", "approvals-only", "-n", ns,
                        "--verb=create,get,list,watch",
                        "--resource=agentrunapprovals.agentrun.dev,agentruns.agentrun.dev")
    transcripts.kubectl("create", "rolebinding", "quinn-approvals-only", "-n", ns,
                        "--role=approvals-only", "--user=quinn")
    script = [{"call": "send_email", "args": PADDED}, {"text": "Sent."}]
    tools = [{"name": "send_email", "effect": "Effectful", "approval": "Required"}]
    transcripts.apply(in_namespace(agent_run("padded", script, tools=tools), ns))
    pending = waiting(transcripts, ns, "padded")["status"]["pendingApproval"]
    assert pending["argsTruncated"] is True
    assert "attacker@evil.example" not in pending["args"]  # past the first 1,024 bytes

    # The approver reads it whole, with their own identity.
    held = read(transcripts, paula, ns, "padded")
    asked = [e for e in held["entries"] if e["kind"] == EntryKind.APPROVAL]
    assert [e["args"] for e in asked] == [PADDED]

    # Without the transcript, nothing is approved: a sentence, and no AgentRunApproval.
    blind = as_user(transcripts, quinn, "agentrun", "approve", "padded", "-n", ns)
    assert blind.returncode == cluster.REFUSED, blind.stdout + blind.stderr
    assert "Not deciding call 1 (send_email) of AgentRun padded" in blind.stderr
    assert "nothing is approved unseen" in blind.stderr
    assert "get on transcripts.store.agentrun.dev" in blind.stderr
    listed = transcripts.kubectl("get", "agentrunapprovals", "-n", ns, "-o", "json")
    assert json.loads(listed.stdout)["items"] == []

    shown = as_user(transcripts, paula, "agentrun", "approve", "padded", "-n", ns)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert '"to": "attacker@evil.example"' in shown.stdout
    assert PADDED["body"] in shown.stdout
    assert "(cut" not in shown.stdout
    assert "Accepted (Decided)" in shown.stdout
    status = settled(transcripts, ns, "padded")["status"]
    assert status["toolsExecuted"] == ["send_email"]
