"""The trigger receiver against the real API server, as a sender meets it: its checks in the
contract's order (each refusal's status and sentence, and nothing created), one run per
event however often and however many at once it is delivered, the run it makes, two
tenants, and the API server gone.

Deliveries are made as senders make them: CloudEvents through CloudEvents' own SDK, in
binary and structured mode, and a GitHub-style webhook signed "sha256=<hex>". The
receiver runs as it does in a cluster (tests/receiver/receiver.py): its own process, its
identity, the chart's rights. These runs are made in namespaces the session operator
leaves alone (solo-*): what the receiver wrote is what is read back.
"""

from __future__ import annotations

import http.client
import json
import ssl
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from agentrun_devtools.controlplane import ControlPlane

from agentrun.triggered import run_name
from agentrun.vocabulary import (
    ANNOTATION_CREATED_BY,
    ANNOTATION_EVENT_ID,
    EVENT_FILE,
    LABEL_TRIGGER,
    TRIGGER_KIND,
)
from tests.cluster_fixtures import fresh_namespace
from tests.receiver.receiver import Outage, Receiver
from tests.triggers import (
    SECRET,
    SIGNATURE_HEADER,
    Answer,
    binary,
    cloudevent,
    deliver,
    secret_manifest,
    signature,
    signed,
    structured,
    trigger_manifest,
)

pytestmark = pytest.mark.cluster

CE_RUN = run_name("new-ticket", "/helpdesk/tickets\nticket-1001")
TESS, BEA = "tess", "bea"


def apply(plane: ControlPlane, namespace: str, manifest: dict[str, Any],
          as_user: str | None = None) -> None:
    plane.kubectl("apply", "--server-side", "-n", namespace, "-f", "-",
                  input=json.dumps(manifest), as_user=as_user)


def made(plane: ControlPlane, namespace: str) -> list[str]:
    """Every AgentRun and ConfigMap the receiver made in `namespace` (or anyone, by name)."""
    done = plane.kubectl("get", "agentruns,configmaps", "-n", namespace, "-o", "name")
    return sorted(line for line in done.stdout.split() if "kube-root-ca" not in line)


def get(plane: ControlPlane, namespace: str, what: str) -> dict[str, Any]:
    found: dict[str, Any] = json.loads(plane.kubectl("get", what, "-n", namespace, "-o",
                                                     "json").stdout)
    return found


def with_trigger(plane: ControlPlane, namespace: str, **spec: Any) -> None:
    apply(plane, namespace, secret_manifest())
    apply(plane, namespace, trigger_manifest(**spec))


def send(receiver: Receiver, namespace: str, body: bytes, headers: dict[str, str],
         trigger: str = "new-ticket") -> Answer:
    return deliver(receiver.url(namespace, trigger), body, headers, ca=receiver.ca)


def refused(answer: Answer, status: int, result: str, sentence: str) -> None:
    assert (answer.status, answer.body.get("result")) == (status, result), answer
    assert sentence in answer.body["message"], answer.body["message"]
    assert "run" not in answer.body or status == 409


# -- each check, in the contract's order --------------------------------------------------------


def test_each_refusal_says_why_and_creates_nothing(crds: ControlPlane, solo_namespace: str,
                                                  receiver: Receiver) -> None:
    ns = solo_namespace
    with_trigger(crds, ns, suspend=True, maxBodyBytes=2048, maxRunsPerMinute=1)
    body, headers = binary(cloudevent())
    # Suspended: before anything else is looked at, signature included.
    answer = send(receiver, ns, body, headers)
    refused(answer, 503, "unavailable", f"AgentRunTrigger {ns}/new-ticket is suspended")
    assert answer.headers["Retry-After"] == "30"
    apply(crds, ns, trigger_manifest(maxBodyBytes=2048, maxRunsPerMinute=1))
    # Over maxBodyBytes by Content-Length: answered before the body is read (none is sent).
    refused(_headers_only(receiver, ns, 10_000_000), 413, "too_large",
            "The body is 10000000 bytes, over this trigger's maxBodyBytes (2048)")
    big = json.dumps({"pad": "x" * 3000}).encode()
    refused(send(receiver, ns, big, signed(big, {"Content-Type": "application/json"})), 413,
            "too_large", "over this trigger's maxBodyBytes (2048)")
    # The signature: missing, then wrong (a body changed after signing).
    refused(send(receiver, ns, body, headers), 401, "unauthorized",
            f"The delivery has no {SIGNATURE_HEADER} header")
    refused(send(receiver, ns, body, {**headers, SIGNATURE_HEADER: signature(body + b" ")}),
            401, "unauthorized", f"The {SIGNATURE_HEADER} signature does not match the body")
    # A malformed event: a CloudEvent without the id that identifies it.
    no_id = {k: v for k, v in headers.items() if k != "ce-id"}
    refused(send(receiver, ns, body, signed(body, no_id)), 400, "malformed",
            "The CloudEvent has no ce-id")
    assert made(crds, ns) == []
    # The first event starts its run; a second one within the minute is over
    # maxRunsPerMinute, but a redelivery of the first is still answered duplicate.
    assert send(receiver, ns, body, signed(body, headers)).status == 201
    other, other_headers = binary(cloudevent("ticket-1002"))
    answer = send(receiver, ns, other, signed(other, other_headers))
    refused(answer, 429, "rate_limited", "has started maxRunsPerMinute (1) runs in the last "
            "minute; no run was started")
    assert 1 <= int(answer.headers["Retry-After"]) <= 60
    assert send(receiver, ns, body, signed(body, headers)).body["result"] == "duplicate"
    assert made(crds, ns) == [f"agentrun.agentrun.dev/{CE_RUN}",
                              f"configmap/{CE_RUN}-event"]
    # Each answer, counted by its result.
    assert receiver.events(ns, "new-ticket") == {
        "unavailable": 1, "too_large": 2, "unauthorized": 2, "malformed": 1, "created": 1,
        "rate_limited": 1, "duplicate": 1}


def _headers_only(receiver: Receiver, namespace: str, length: int) -> Answer:
    """A POST that announces `length` bytes and sends none: answered at once or never."""
    connection = http.client.HTTPSConnection(
        "127.0.0.1", receiver.port, timeout=10,
        context=ssl.create_default_context(cafile=str(receiver.ca)))
    connection.putrequest("POST", receiver.url(namespace, "new-ticket").split(
        str(receiver.port), 1)[1])
    connection.putheader("Content-Length", str(length))
    connection.putheader("Content-Type", "application/json")
    connection.endheaders()
    response = connection.getresponse()
    answer = Answer(response.status, dict(response.headers), json.loads(response.read()))
    connection.close()
    return answer


def test_a_run_of_that_name_that_is_not_the_events_is_a_conflict(
        crds: ControlPlane, solo_namespace: str, receiver: Receiver) -> None:
    ns = solo_namespace
    with_trigger(crds, ns)
    apply(crds, ns, {"apiVersion": "agentrun.dev/v1alpha1", "kind": "AgentRun",
                     "metadata": {"name": CE_RUN},
                     "spec": {"agent": "support-agent", "input": {"text": "mine"}}})
    body, headers = structured(cloudevent())
    answer = send(receiver, ns, body, signed(body, headers))
    refused(answer, 409, "conflict", f"AgentRun {CE_RUN} exists and is not this event's run")
    assert made(crds, ns) == [f"agentrun.agentrun.dev/{CE_RUN}"]
    assert send(receiver, ns, body, signed(body, headers), trigger="no-such").status == 404


# -- exactly once -------------------------------------------------------------------------------


def test_one_cloudevent_delivered_many_times_and_at_once_is_one_run(
        crds: ControlPlane, solo_namespace: str, receiver: Receiver) -> None:
    ns = solo_namespace
    with_trigger(crds, ns)
    event = cloudevent()
    modes = [binary(event), structured(event)]
    # Twenty at once, half in each mode, before any run exists.
    with ThreadPoolExecutor(20) as pool:
        answers = list(pool.map(lambda i: send(receiver, ns, modes[i % 2][0],
                                               signed(*modes[i % 2])), range(20)))
    # Then three in a row.
    answers += [send(receiver, ns, body, signed(body, headers))
                for body, headers in (modes[0], modes[1], modes[0])]
    assert sorted(a.status for a in answers) == [200] * 22 + [201], answers
    assert {a.body["run"] for a in answers} == {CE_RUN}
    assert made(crds, ns) == [f"agentrun.agentrun.dev/{CE_RUN}", f"configmap/{CE_RUN}-event"]
    # The trigger counts them: 23 received, 22 of them duplicates.
    _wait_counted(crds, ns, received=23, duplicates=22)


def test_a_webhook_identified_by_its_delivery_header_is_one_run_kept_as_sent(
        crds: ControlPlane, solo_namespace: str, receiver: Receiver) -> None:
    ns = solo_namespace
    with_trigger(crds, ns, identity={"header": "X-GitHub-Delivery"})
    body = b'{"action":"opened","issue":{"number":7,"title":"Refund \\u00e9"}}\n'
    headers = {"Content-Type": "application/json", "X-GitHub-Event": "issues",
               "X-GitHub-Delivery": "72d3162e-cc78-11e3-81ab-4c9367dc0958"}
    answers = [send(receiver, ns, body, signed(body, headers)) for _ in range(3)]
    with ThreadPoolExecutor(5) as pool:
        answers += list(pool.map(lambda _: send(receiver, ns, body, signed(body, headers)),
                                 range(5)))
    run = run_name("new-ticket", headers["X-GitHub-Delivery"])
    assert [a.status for a in answers[:3]] == [201, 200, 200]
    assert [a.status for a in answers[3:]] == [200] * 5
    assert {a.body["run"] for a in answers} == {run}
    # The run's input file is the body as received, byte for byte.
    configmap = get(crds, ns, f"configmap/{run}-event")
    assert configmap["data"][EVENT_FILE].encode() == body
    _wait_counted(crds, ns, received=8, duplicates=7)


def _wait_counted(plane: ControlPlane, namespace: str, *, received: int,
                  duplicates: int) -> None:
    done = plane.kubectl(
        "wait", "art/new-ticket", "-n", namespace, "--timeout=30s",
        f"--for=jsonpath={{.status.received}}={received}", check=False)
    status = get(plane, namespace, "art/new-ticket").get("status") or {}
    assert done.returncode == 0 and status.get("duplicates") == duplicates, status
    assert status["lastEventTime"]


# -- the run it makes ---------------------------------------------------------------------------


def _may_edit_and_get_the_hook(plane: ControlPlane, namespace: str, user: str) -> None:
    plane.kubectl("create", "rolebinding", "editors", "-n", namespace,
                  "--clusterrole=agentrun-edit", f"--user={user}")
    plane.kubectl("create", "role", "read-hook", "-n", namespace, "--verb=get",
                  "--resource=secrets", f"--resource-name={SECRET}")
    plane.kubectl("create", "rolebinding", "read-hook", "-n", namespace,
                  "--role=read-hook", f"--user={user}")


@pytest.fixture
def tenants(crds: ControlPlane, solo_namespace: str) -> Iterator[tuple[str, str]]:
    """(A, B): tess edits A, bea edits B; each may get the trigger's Secret of their own
    namespace."""
    _may_edit_and_get_the_hook(crds, solo_namespace, TESS)
    for other in fresh_namespace(crds, "solo-b"):
        _may_edit_and_get_the_hook(crds, other, BEA)
        yield solo_namespace, other


def _written_by(plane: ControlPlane, namespace: str, manifest: dict[str, Any],
                user: str) -> None:
    """Applied as `user`, once the admission policies let them (a policy matching a new kind
    is enforced a little after it is created, and before that the API server may refuse
    what it will allow)."""
    deadline = time.monotonic() + 60
    while True:
        done = plane.kubectl("apply", "--server-side", "-n", namespace, "-f", "-",
                             input=json.dumps(manifest), as_user=user, check=False)
        if done.returncode == 0:
            return
        assert time.monotonic() < deadline, done.stderr
        time.sleep(0.5)


def test_the_run_is_the_templates_for_this_event_by_the_templates_author(
        crds: ControlPlane, tenants: tuple[str, str], receiver: Receiver) -> None:
    ns, _ = tenants
    apply(crds, ns, secret_manifest())
    template = trigger_manifest()
    template["spec"]["runTemplate"]["metadata"] = {"labels": {"team": "support"}}
    _written_by(crds, ns, template, TESS)
    event = cloudevent()
    body, headers = binary(event)
    assert send(receiver, ns, body, signed(body, headers)).status == 201
    trigger = get(crds, ns, "art/new-ticket")
    run = get(crds, ns, f"agentrun/{CE_RUN}")
    meta, spec = run["metadata"], run["spec"]
    assert meta["labels"] == {"team": "support", LABEL_TRIGGER: "new-ticket"}
    assert meta["annotations"][ANNOTATION_EVENT_ID] == "/helpdesk/tickets\nticket-1001"
    # Four eyes: the run's creator is who wrote the template, not the receiver.
    assert meta["annotations"][ANNOTATION_CREATED_BY] == TESS
    assert meta["ownerReferences"] == [{
        "apiVersion": "agentrun.dev/v1alpha1", "kind": TRIGGER_KIND, "name": "new-ticket",
        "uid": trigger["metadata"]["uid"], "controller": True}]
    assert spec["trigger"] == "event"
    assert spec["input"] == {"text": "Triage this ticket", "files": [{
        "name": EVENT_FILE, "configMapKeyRef": {"name": f"{CE_RUN}-event",
                                                "key": EVENT_FILE}}]}
    configmap = get(crds, ns, f"configmap/{CE_RUN}-event")
    assert configmap["immutable"] is True
    assert [(o["kind"], o["name"], o.get("controller")) for o in
            configmap["metadata"]["ownerReferences"]] == [("AgentRun", CE_RUN, True)]
    # event.json: the whole event, in CloudEvents' structured format.
    assert json.loads(configmap["data"][EVENT_FILE]) == json.loads(structured(event)[0])


def test_a_trigger_reaches_no_other_namespace(crds: ControlPlane, tenants: tuple[str, str],
                                              receiver: Receiver) -> None:
    a, b = tenants
    apply(crds, a, secret_manifest())
    _written_by(crds, a, trigger_manifest(), TESS)
    # B has a trigger of the same name with its own secret.
    apply(crds, b, secret_manifest(value="bea's-own-secret"))
    _written_by(crds, b, trigger_manifest(), BEA)
    body, headers = structured(cloudevent())
    # A's signature opens nothing in B, and B's nothing in A.
    refused(send(receiver, b, body, signed(body, headers)), 401, "unauthorized",
            "does not match the body")
    refused(send(receiver, a, body, signed(body, headers, "bea's-own-secret")), 401,
            "unauthorized", "does not match the body")
    assert made(crds, a) == made(crds, b) == []
    # A's event makes its run in A, only.
    assert send(receiver, a, body, signed(body, headers)).status == 201
    assert made(crds, b) == []
    # Bea cannot read A's trigger, its status, or its runs.
    for what in (("get", "art/new-ticket"), ("get", "agentruns")):
        done = crds.kubectl(*what, "-n", a, as_user=BEA, check=False)
        assert done.returncode != 0 and "Forbidden" in done.stderr, done
    # A trigger in A naming a Secret that exists only in B (the admin may write it: the
    # admin may get every Secret): the receiver looks for it in A alone, finds nothing, and
    # checks nothing with B's.
    apply(crds, b, secret_manifest("b-only", "bea's-own-secret"))
    apply(crds, a, trigger_manifest("reaching", auth={"hmac": {
        "secretKeyRef": {"name": "b-only", "key": "secret"}}}))
    answer = send(receiver, a, body, signed(body, headers, "bea's-own-secret"),
                  trigger="reaching")
    refused(answer, 503, "unavailable", "The trigger's Secret b-only (key secret) is not there")


# -- the API server gone ------------------------------------------------------------------------


def test_while_the_api_server_cannot_be_reached_nothing_is_accepted(
        crds: ControlPlane, solo_namespace: str, tmp_path: Path, receiver: Receiver) -> None:
    ns = solo_namespace
    with_trigger(crds, ns)
    outage = Outage(crds.server)
    outage.up()
    relayed = Receiver(crds, tmp_path / "relayed", server=outage.server_url).start()
    try:
        body, headers = binary(cloudevent())
        outage.down()
        answer = send(relayed, ns, body, signed(body, headers))
        refused(answer, 503, "unavailable", "The receiver cannot reach the Kubernetes API "
                "server")
        assert "deliver this event again" in answer.body["message"]
        assert answer.headers["Retry-After"] == "30"
        assert made(crds, ns) == []
        outage.up()
        again = send(relayed, ns, body, signed(body, headers))
        assert (again.status, again.body["run"]) == (201, CE_RUN), again
        assert made(crds, ns) == [f"agentrun.agentrun.dev/{CE_RUN}",
                                  f"configmap/{CE_RUN}-event"]
    finally:
        relayed.stop()
        outage.close()


def test_the_receiver_says_how_to_start_it() -> None:
    done = subprocess.run([str(Path(__file__).resolve().parents[2] / ".venv" / "bin" /
                               "agentrun-receiver")], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2
    assert "set --tls-cert-file and --tls-private-key-file" in done.stderr
