"""The running operator's /metrics, scraped after a run succeeded, a run was evicted to
Failed Evicted and a replay of it was refused: the names, their labels, and counts that
moved by exactly what happened. The store API beside it (its own process, as `make run`
and the chart run it; its own /metrics) counts the ledger writes of those runs. The
operator logs in JSON (--log-format json) throughout."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

from agentrun_devtools.controlplane import ControlPlane
from agentrun_devtools.processes import free_port, wait_for
from prometheus_client.parser import text_string_to_metric_families

from agentrun.vocabulary import Phase, Reason, ReplayPhase, ReplayReason
from tests.harness import HAPPY, Operator, System, agent_run, email_then_wait, in_namespace
from tests.replays import create_replay, wait_decided

# Every family the operator exports, with its label names (the last four are the store
# API's, agentrun_store_api.metrics, on its own /metrics).
FAMILIES = {
    "agentrun_runs": ("gauge", {"phase"}),
    "agentrun_runs_settled": ("counter", {"phase", "reason"}),
    "agentrun_attempts_started": ("counter", set()),
    "agentrun_attempts_retried": ("counter", {"reason"}),
    "agentrun_attempts_resumed": ("counter", {"reason"}),
    "agentrun_evictions": ("counter", {"reason"}),
    "agentrun_eviction_to_failed_seconds": ("histogram", {"reason"}),
    "agentrun_replay_decisions": ("counter", {"phase", "reason"}),
    "agentrun_tools_unknown": ("counter", set()),
    "agentrun_store_errors": ("counter", {"operation"}),
    "agentrun_reconcile_duration_seconds": ("histogram", {"kind", "result"}),
    "agentrun_workqueue_depth": ("gauge", set()),
    "agentrun_ledger_write_duration_seconds": ("histogram", {"operation", "code"}),
    "agentrun_store_api_errors": ("counter", {"route"}),
    "agentrun_store_api_refusals": ("counter", {"route", "code"}),
    "agentrun_store_api_token_reviews": ("counter", {"result"}),
}


class Scrape:
    """The agentrun_ families of every port's /metrics (the operator's, its store API's:
    no family is exported by both)."""

    def __init__(self, ports: tuple[int, ...]) -> None:
        texts = []
        for port in ports:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
                texts.append(r.read().decode())
        self.text = "\n".join(texts)
        self.families = {f.name: f for text in texts
                         for f in text_string_to_metric_families(text)
                         if f.name.startswith("agentrun_")}

    def value(self, sample: str, **labels: str) -> float:
        """The sample's value (0 when it has not been written yet)."""
        for family in self.families.values():
            for s in family.samples:
                if s.name == sample and s.labels == labels:
                    return float(s.value)
        return 0.0


def wait_value(ports: tuple[int, ...], sample: str, expected: float, **labels: str) -> Scrape:
    """Until `sample{labels}` is `expected` (the count moves once the status write that
    the test waited for has returned); then exactly that."""
    seen: list[Scrape] = []

    def there() -> bool:
        seen[:] = [Scrape(ports)]
        return seen[0].value(sample, **labels) >= expected

    try:
        wait_for(there, timeout=20, what=f"{sample}{labels} = {expected}")
    except TimeoutError as e:
        shown = "\n".join(x for x in seen[0].text.splitlines() if x.startswith(sample)) \
            if seen else ""
        raise AssertionError(f"{e}; scraped:\n{shown}") from e
    assert seen[0].value(sample, **labels) == expected, sample
    return seen[0]


def test_metrics_of_a_success_an_eviction_and_a_replay(
    crds: ControlPlane, dev_node: object, store_url: str, solo_namespace: str, tmp_path: Path
) -> None:
    # The operator's /metrics and its store API's.
    ns, ports = solo_namespace, (free_port(), free_port())
    operator = Operator(crds, store_url, tmp_path / "op", (
        f"--namespace={ns}", f"--metrics-port={ports[0]}", "--log-format=json",
        "--toleration-seconds=6", "--check-interval=1"),
        store_api_metrics_port=ports[1]).start()
    system = System(crds, store_url, operator)
    try:
        before = Scrape(ports)
        for name, (kind, labels) in FAMILIES.items():
            family = before.families.get(name)
            assert family is not None, f"{name} is not exported"
            assert family.type == kind, (name, family.type)
            for s in family.samples:
                # A histogram's buckets add `le`; everything else is the declared labels.
                assert set(s.labels) - {"le"} == labels, (name, s.labels)
        assert before.value("agentrun_attempts_started_total") == 0

        # Timings are measured by bench/; here only what the clock of this test encloses.
        began = time.monotonic()
        system.apply(in_namespace(agent_run("counted", HAPPY), ns))
        assert system.wait_phase(ns, "counted", Phase.SUCCEEDED, Phase.FAILED)[
            "status"]["phase"] == Phase.SUCCEEDED
        after = wait_value(ports, "agentrun_runs_settled_total", 1, phase=Phase.SUCCEEDED,
                           reason=Reason.SUCCEEDED)
        assert after.value("agentrun_attempts_started_total") == 1
        # HAPPY calls three tools: three ledger rows opened by the store API, and closed:
        # a close rides on the next call's open when that comes soon enough, so one to
        # three of them are requests of their own (the last one always is).
        assert after.value("agentrun_ledger_write_duration_seconds_count",
                           operation="open", code="200") == 3
        assert 1 <= after.value("agentrun_ledger_write_duration_seconds_count",
                                operation="close", code="200") <= 3
        took = time.monotonic() - began
        # Each write was timed (a sum of zero is an observation that measured nothing), in
        # seconds: the writes were all made during this run, so together they took no
        # longer than the test's own clock saw the run take (milliseconds would not fit).
        sums = {operation: after.value("agentrun_ledger_write_duration_seconds_sum",
                                       operation=operation, code="200")
                for operation in ("open", "close")}
        assert all(v > 0 for v in sums.values()) and sum(sums.values()) <= took, (sums, took)

        system.apply(in_namespace(agent_run("evicted", email_then_wait(60)), ns))
        uid = system.wait_phase(ns, "evicted", Phase.RUNNING)["metadata"]["uid"]
        system.wait_ledger(uid, "send_email")
        evicting = time.monotonic()
        system.evict(ns, "evicted-1")
        run = system.wait_phase(ns, "evicted", Phase.FAILED, Phase.SUCCEEDED)
        took = time.monotonic() - evicting
        assert run["status"]["reason"] == Reason.EVICTED, run["status"]
        after = wait_value(ports, "agentrun_runs_settled_total", 1, phase=Phase.FAILED,
                           reason=Reason.EVICTED)
        assert after.value("agentrun_evictions_total", reason=Reason.EVICTED) == 1
        assert after.value("agentrun_attempts_started_total") == 2
        assert after.value("agentrun_attempts_retried_total", reason=Reason.EVICTED) == 0
        assert after.value("agentrun_ledger_write_duration_seconds_count", operation="open",
                           code="200") == 4
        assert after.value("agentrun_eviction_to_failed_seconds_count",
                           reason=Reason.EVICTED) == 1
        # From the DisruptionTarget condition (whole seconds, so up to 1 s early) to the
        # Failed write: inside the test's clock from the eviction to seeing Failed, where
        # one measured from an earlier moment (the pod's creation, its start) is not.
        measured = after.value("agentrun_eviction_to_failed_seconds_sum", reason=Reason.EVICTED)
        assert 0 < measured <= took + 1, (measured, took)

        create_replay(system, ns, "evicted-again", "evicted")
        replay = wait_decided(system, ns, "evicted-again")
        assert (replay["status"]["phase"], replay["status"]["reason"]) == (
            ReplayPhase.REFUSED, ReplayReason.TOOLS_EXECUTED)
        after = wait_value(ports, "agentrun_replay_decisions_total", 1,
                           phase=ReplayPhase.REFUSED, reason=ReplayReason.TOOLS_EXECUTED)

        # The runs the operator knows, by phase, from its cache.
        assert {p: after.value("agentrun_runs", phase=p) for p in (
            Phase.PENDING, Phase.RUNNING, Phase.SUCCEEDED, Phase.FAILED, Phase.CANCELLED)} \
            == {Phase.PENDING: 0, Phase.RUNNING: 0, Phase.SUCCEEDED: 1, Phase.FAILED: 1,
                Phase.CANCELLED: 0}
        assert after.value("agentrun_reconcile_duration_seconds_count", kind="run",
                           result="ok") > 0
        assert after.value("agentrun_reconcile_duration_seconds_count", kind="replay",
                           result="ok") > 0
        # Nothing left to do: the queue drains back to exactly empty.
        wait_for(lambda: Scrape(ports).value("agentrun_workqueue_depth") == 0, timeout=20,
                 what="agentrun_workqueue_depth back to 0")
        assert after.value("agentrun_store_errors_total", operation="settle") == 0
    finally:
        operator.stop()

    # --log-format json reached the program: every line of ours is one object.
    lines = operator.log().splitlines()
    assert not [x for x in lines if x.startswith("ts=")], "text lines in a JSON log"
    objects = [json.loads(x) for x in lines if x.startswith("{")]
    started = [o for o in objects if o.get("event") == "started"]
    assert len(started) == 1 and started[0]["logger"] == "agentrun.operator"
    assert started[0]["namespaces"] == ns and started[0]["level"] == "INFO"
    settled = {(o.get("run"), o.get("phase"), o.get("reason")) for o in objects
               if o.get("event") == "settled"}
    assert settled == {(f"{ns}/counted", Phase.SUCCEEDED, Reason.SUCCEEDED),
                       (f"{ns}/evicted", Phase.FAILED, Reason.EVICTED)}
