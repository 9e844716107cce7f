"""The operator itself fails: killed mid-run, pods vanishing while it is down, the store
unreachable when a run ends, a run that never reports. Each test runs its own operator in
a solo-* namespace (the session operator ignores those) with the settings it needs."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
from agentrun_devtools.controlplane import ControlPlane
from agentrun_devtools.postgres import Postgres
from agentrun_devtools.processes import wait_for

from agentrun import store
from agentrun.vocabulary import Condition, Phase, Reason
from tests.harness import HAPPY, Operator, System, agent_run, email_then_wait, in_namespace

SoloFactory = Callable[..., System]


@pytest.fixture
def solo(crds: ControlPlane, dev_node: object, store_url: str, solo_namespace: str,
         tmp_path: Path) -> Iterator[SoloFactory]:
    """Starts an operator watching only this test's namespace, with extra flags."""
    started: list[Operator] = []

    def start(*args: str, url: str = store_url, wait: bool = True) -> System:
        operator = Operator(crds, url, tmp_path / f"op{len(started)}",
                            (f"--namespace={solo_namespace}", "--check-interval=1", *args))
        started.append(operator.start(wait=wait))
        return System(crds, url, operator)

    try:
        yield start
    finally:
        for operator in started:
            operator.stop()


def pods_of(system: System, namespace: str, run: str) -> Sequence[str]:
    done = system.kubectl("get", "pods", "-n", namespace, "-l", f"agentrun.dev/run={run}",
                          "-o", "json")
    return [p["metadata"]["name"] for p in json.loads(done.stdout)["items"]]


def test_operator_killed_mid_run_and_restarted(solo: SoloFactory, solo_namespace: str) -> None:
    system = solo()
    script = [{"sleep": 6}, *HAPPY]
    system.apply(in_namespace(agent_run("survivor", script), solo_namespace))
    system.wait_phase(solo_namespace, "survivor", Phase.RUNNING)
    system.operator.kill()
    system.operator.start()
    run = system.wait_phase(solo_namespace, "survivor", Phase.SUCCEEDED, Phase.FAILED)
    assert run["status"]["phase"] == Phase.SUCCEEDED, run["status"]
    assert run["status"]["attempts"] == 1
    assert pods_of(system, solo_namespace, "survivor") == ["survivor-1"]
    assert len(system.emails("survivor")) == 1


def test_pod_missing_when_the_operator_starts(solo: SoloFactory, solo_namespace: str) -> None:
    system = solo()
    system.apply(in_namespace(agent_run("vanished", [{"sleep": 120}]), solo_namespace))
    system.wait_phase(solo_namespace, "vanished", Phase.RUNNING)
    system.operator.kill()
    system.kubectl("delete", "pod", "vanished-1", "-n", solo_namespace, "--grace-period=0",
                   "--force")
    wait_for(lambda: system.get("pod", solo_namespace, "vanished-1") is None, timeout=30,
             what="pod gone")
    system.operator.start()
    run = system.wait_phase(solo_namespace, "vanished", Phase.FAILED, Phase.SUCCEEDED)
    assert run["status"]["reason"] == Reason.POD_LOST
    assert run["status"]["toolsExecuted"] == []
    assert pods_of(system, solo_namespace, "vanished") == []


def test_store_unreachable_at_settle_time(solo: SoloFactory, solo_namespace: str,
                                          tmp_path: Path) -> None:
    """toolsExecuted is null (Unknown) while the store is down, never [], and is filled
    in once the store is back."""
    own = Postgres().start()  # its own directory: postgres must reach it
    try:
        url = own.url
        import asyncio

        asyncio.run(store.migrate(url))
        system = solo(url=url)
        system.apply(in_namespace(agent_run("blind", email_then_wait(120)), solo_namespace))
        uid = system.wait_phase(solo_namespace, "blind", Phase.RUNNING)["metadata"]["uid"]
        system.wait_ledger(uid, "send_email")
        own.halt()
        system.evict(solo_namespace, "blind-1")
        run = system.wait_phase(solo_namespace, "blind", Phase.FAILED, Phase.SUCCEEDED)
        assert run["status"]["reason"] == Reason.EVICTED
        assert "toolsExecuted" in run["status"] and run["status"]["toolsExecuted"] is None
        unknown = {c["type"]: c for c in run["status"]["conditions"]}
        assert unknown[Condition.TOOLS_EXECUTED]["status"] == "Unknown"
        own.resume()
        run = system.wait_run(solo_namespace, "blind",
                              lambda r: r["status"].get("toolsExecuted") is not None,
                              what="toolsExecuted filled in")
        assert run["status"]["toolsExecuted"] == ["send_email"]
        known = {c["type"]: c for c in run["status"]["conditions"]}
        assert known[Condition.TOOLS_EXECUTED]["status"] == "True"
        recorded = system.store(lambda e: store.get_run(e, uid))
        assert recorded is not None and recorded.tools_executed == ["send_email"]
    finally:
        own.stop()


def test_store_unreachable_at_start_up(solo: SoloFactory, solo_namespace: str) -> None:
    """A fresh install starts the operator and its database together, the operator often
    first: it waits for the store with a short backoff, saying so (without the password),
    and goes on once the store answers; a run created meanwhile is not lost."""
    own = Postgres().start()
    try:
        own.halt()
        url = own.url.replace("agentrun@", "agentrun:pw-not-in-logs@")  # trust auth
        system = solo(url=url, wait=False)

        def waits() -> list[str]:
            return [line for line in system.operator.log().splitlines()
                    if "event=store-unreachable" in line]

        wait_for(lambda: len(waits()) >= 3, timeout=60, what="three store-unreachable lines")
        assert f"store={store.redact(url)}" in waits()[0], waits()[0]
        assert "pw-not-in-logs" not in system.operator.log()
        system.apply(in_namespace(agent_run("early", HAPPY), solo_namespace))
        assert "event=started" not in system.operator.log()
        own.resume()
        system.operator.wait_started()
        run = system.wait_phase(solo_namespace, "early", Phase.SUCCEEDED, Phase.FAILED)
        assert run["status"]["phase"] == Phase.SUCCEEDED, run["status"]
        delays = [float(re.search(r"retry_in=([\d.]+)s", line).group(1))  # type: ignore[union-attr]
                  for line in waits()]
        assert delays[:3] == [0.5, 1.0, 2.0], delays
        assert max(delays) <= 10, delays
    finally:
        own.stop()


def test_stale_run(solo: SoloFactory, solo_namespace: str) -> None:
    system = solo("--stale-after=4")
    system.apply(in_namespace(agent_run("forever", [{"sleep": 600}]), solo_namespace))
    run = system.wait_phase(solo_namespace, "forever", Phase.FAILED, Phase.SUCCEEDED,
                            timeout=60)
    assert run["status"]["reason"] == Reason.STALE
    assert run["status"]["message"] == (
        "no completion was recorded within 4s; its actual outcome is unknown")
    wait_for(lambda: pods_of(system, solo_namespace, "forever") == [], timeout=60,
             what="stale pod stopped")


def test_a_namespace_deleted_while_the_operator_is_down_goes_once_it_is_back(
        solo: SoloFactory, solo_namespace: str) -> None:
    # An operator given namespaces (kopf watches each on its own) that starts while one
    # of them is being deleted: kopf does not watch that namespace, yet our finalizer on
    # its runs must still come off, or the namespace stays Terminating for ever.
    system = solo()
    system.apply(in_namespace(agent_run("leftover", HAPPY), solo_namespace))
    run = system.wait_run(solo_namespace, "leftover",
                          lambda r: r["status"].get("toolsExecuted") is not None)
    assert run["status"]["phase"] == Phase.SUCCEEDED, run["status"]
    system.operator.stop()
    system.kubectl("delete", "namespace", solo_namespace, "--wait=false")

    def held() -> bool:
        found = system.get("agentrun", solo_namespace, "leftover")
        return found is not None and bool(found["metadata"].get("deletionTimestamp"))

    def blocked() -> bool:  # kopf, when it sees this, stops watching the namespace
        found = system.get("namespace", "", solo_namespace) or {}
        return any(c["status"] == "True" for c in found["status"]["conditions"])

    wait_for(held, timeout=30, what="the run marked deleted, held by our finalizer")
    wait_for(blocked, timeout=30, what="the namespace's deletion waiting on our finalizer")
    system.operator.start()
    wait_for(lambda: system.get("namespace", "", solo_namespace) is None, timeout=90,
             what=f"namespace {solo_namespace} gone")
