"""An AgentRunTrigger in the whole system: the operator says where to send (status.url, an
address this host reaches: the session's receiver) and that it listens, as kstatus reads
it; a delivery there starts a run that the operator launches on the event, snapshotted
byte for byte as the run's input file event.json; its run is kept its dedupe window past
its time to live."""

from __future__ import annotations

import json
from typing import Any

from agentrun import store
from agentrun.triggered import run_name
from agentrun.vocabulary import EVENT_FILE, Phase, TriggerReason
from tests import kstatus
from tests.harness import System, agent_run, in_namespace
from tests.receiver.receiver import Receiver
from tests.triggers import deliver, secret_manifest, signed, trigger_manifest


def _status(system: System, namespace: str) -> dict[str, Any]:
    found = system.get("agentruntriggers.agentrun.dev", namespace, "new-ticket")
    assert found is not None
    status: dict[str, Any] = found.get("status") or {}
    return status


def test_a_delivery_to_status_url_starts_a_run_on_the_event(
        system: System, namespace: str, receiver: Receiver) -> None:
    system.apply({**secret_manifest(), "metadata": {"name": "ticket-hook",
                                                    "namespace": namespace}})
    trigger = trigger_manifest(identity={"header": "X-Delivery"}, runTemplate={"spec": {
        "agent": "support-agent", "model": "scripted", "input": {"text": "Triage it"},
        "ttlSecondsAfterFinished": 0,
        "env": [{"name": "AGENTRUN_SCRIPT", "value": json.dumps(
            [{"call": "read_message", "args": {}}, {"text": "Triaged."}])}]}})
    trigger["metadata"]["namespace"] = namespace
    system.apply(trigger)
    system.kubectl("wait", "art/new-ticket", "-n", namespace, "--timeout=60s",
                   "--for=condition=Ready")
    status = _status(system, namespace)
    url = receiver.url(namespace, "new-ticket")
    assert status["url"] == url
    ready = next(c for c in status["conditions"] if c["type"] == "Ready")
    assert ready["reason"] == TriggerReason.LISTENING and url in ready["message"]
    found = system.get("agentruntriggers.agentrun.dev", namespace, "new-ticket")
    assert found is not None and kstatus.compute(found).status == kstatus.CURRENT

    # A byte the JSON parsers would not keep as it is: the file is the body as sent.
    body = b'{"ticket": 1001,   "note": "caf\\u00e9"}'
    headers = {"Content-Type": "application/json", "X-Delivery": "d-1"}
    answer = deliver(status["url"], body, signed(body, headers), ca=receiver.ca)
    run = run_name("new-ticket", "d-1")
    assert (answer.status, answer.body["run"]) == (201, run), answer
    settled = system.wait_phase(namespace, run, Phase.SUCCEEDED)
    snapshot = system.store(lambda e: store.get_input(e, settled["status"]["inputDigest"]))
    assert snapshot is not None and snapshot.files == {EVENT_FILE: body}
    # Its time to live is 0, yet it stays for the trigger's dedupe window (3 days), where a
    # run of no trigger, settled after it with the same time to live, is gone.
    plain = agent_run("plain", [{"text": "done"}], ttlSecondsAfterFinished=0)
    system.apply(in_namespace(plain, namespace))
    system.kubectl("wait", "agentrun/plain", "-n", namespace, "--for=delete",
                   "--timeout=90s")
    assert system.get("agentruns.agentrun.dev", namespace, run) is not None
    # A redelivery finds it and starts nothing.
    again = deliver(status["url"], body, signed(body, headers), ca=receiver.ca)
    assert (again.status, again.body["result"]) == (200, "duplicate")
