"""The operator with many AgentRunSchedules: RSS and CPU at rest, and the lag from a slot to
its run's creation.

    .venv/bin/python bench/schedule.py [--schedules 1000] [--minutes 3] [--out PATH]

Two scenarios, each on its own control plane (etcd, kube-apiserver, kube-controller-manager,
kube-scheduler) with no node, a throwaway Postgres store, and the operator with its default
flags (scripted model off). `--schedules` AgentRunSchedules of `@every 1m` (Forbid) are
created in namespace `schedules`; every slot of every schedule comes due at the same second
(whole minutes), so each slot is a burst.

- idle: each schedule's first run stays live (its runner pod cannot be scheduled: there is
  no node), so every later slot is skipped (Forbid). The first slot is a burst of run
  creations; after it, the operator holds the schedules and their live runs, and only
  skips a slot a minute.
- churn: each run is refused at launch (model `scripted`, which this operator refuses) and
  settles at once, Failed ModelNotAllowed, before any pod: every slot creates a run per
  schedule, and the history limit (failedRunsHistoryLimit 1) deletes one: the schedule's
  whole cycle without a runner.

First the operator is measured with no schedules (the baseline). Then, for `--minutes`
whole minutes from the first slot at which every schedule exists:

- the lag of each slot's run: from the slot's time to the return of its create, as the
  operator logs it (`event=schedule-run-created ... lag=`): p50, p99, max, and how many of
  the minute's slots got a run or were skipped;
- the operator's RSS (VmRSS of the process and its descendants) every second: the last and
  the highest;
- its CPU (utime+stime, /proc) over each whole minute (the burst included) and at rest: from
  30 s after the slot to 5 s before the next, when nothing is due; kube-apiserver's CPU the
  same way.

Figures only: no goal is asserted. The output goes to stdout and to `--out` (default
~/.cache/agentrun/bench/schedule-<time>.txt as docs/development.md says; `--out -` for
stdout only).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
for extra in (BENCH, BENCH.parent / "devtools", BENCH.parent):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from agentrun_devtools.controlplane import ControlPlane  # noqa: E402
from agentrun_devtools.postgres import Postgres  # noqa: E402
from agentrun_devtools.stats import pct as percentile  # noqa: E402
from agentrun_devtools.stats import results_file  # noqa: E402
from kubernetes import client  # noqa: E402
from throughput import (  # noqa: E402
    CLK_TCK,
    Report,
    api_client,
    child_pid,
    cpu_ticks,
    create_many,
    create_namespace,
    load,
    rss_kib,
)

from agentrun import store  # noqa: E402
from agentrun.vocabulary import (  # noqa: E402
    API_VERSION,
    GROUP,
    SCHEDULE_KIND,
    SCHEDULE_PLURAL,
    VERSION,
)
from tests.cluster_fixtures import apply_crds  # noqa: E402
from tests.harness import Operator  # noqa: E402

NAMESPACE = "schedules"
PERIOD = 60
REST_FROM, REST_UNTIL = 30, PERIOD - 5  # seconds after the slot: nothing is due
_CREATED = re.compile(r"event=schedule-run-created schedule=\S+ run=\S+ slot=(\d+) lag=([\d.]+)")
_SKIPPED = re.compile(r"event=schedule-slot-skipped schedule=\S+ slot=(\d+)")
SCENARIOS = ("idle", "churn")


def schedule_manifest(name: str, scenario: str) -> dict[str, Any]:
    template: dict[str, Any] = {"agent": "noop-agent", "input": {"text": "hi"}}
    if scenario == "churn":
        template.update(model="scripted", env=[{"name": "AGENTRUN_SCRIPT",
                                                "value": json.dumps([{"text": "hi"}])}])
    return {"apiVersion": API_VERSION, "kind": SCHEDULE_KIND,
            "metadata": {"name": name, "namespace": NAMESPACE},
            "spec": {"schedule": "@every 1m", "failedRunsHistoryLimit": 1,
                     "runTemplate": {"spec": template}}}


def schedule_maker(api: client.ApiClient, scenario: str) -> Callable[[int], None]:
    custom: Any = client.CustomObjectsApi(api)

    def make(i: int) -> None:
        response = custom.create_namespaced_custom_object(
            GROUP, VERSION, NAMESPACE, SCHEDULE_PLURAL,
            schedule_manifest(f"every-{i}", scenario), _preload_content=False)
        response.release_conn()

    return make


def skips(log: Path) -> dict[int, int]:
    """slot -> how many schedules skipped it."""
    out: dict[int, int] = {}
    for found in _SKIPPED.finditer(log.read_text(errors="replace")):
        out[int(found.group(1))] = out.get(int(found.group(1)), 0) + 1
    return out


def lags(log: Path) -> dict[int, list[float]]:
    """slot -> the lag of each run created for it."""
    out: dict[int, list[float]] = {}
    for found in _CREATED.finditer(log.read_text(errors="replace")):
        out.setdefault(int(found.group(1)), []).append(float(found.group(2)))
    return out


@dataclass
class Minute:
    slot: int
    runs: int
    skipped: int
    p50: float
    p99: float
    worst: float
    cpu: float  # % of a core over the minute
    cpu_rest: float  # % of a core between REST_FROM and REST_UNTIL
    apiserver: float
    apiserver_rest: float
    rss_mb: float
    rss_max_mb: float
    load: str


def _wait_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.time()))


def measure_minute(plane: ControlPlane, operator: Operator, slot: int) -> Minute:
    """From `slot` to the next: CPU over the whole minute and over its rest window; RSS
    every second; then the lags the operator logged for `slot`."""
    assert operator.child is not None
    pid, apiserver = operator.child.pid, child_pid(plane, "kube-apiserver")
    _wait_until(slot)
    t0, op0, api0 = time.monotonic(), cpu_ticks(pid), cpu_ticks(apiserver)
    rss = [rss_kib(pid)]
    rest: dict[str, tuple[float, int, int]] = {}
    while time.time() < slot + PERIOD:
        time.sleep(max(0.0, min(1.0, slot + PERIOD - time.time())))
        rss.append(rss_kib(pid))
        into = time.time() - slot
        for mark, at in (("from", REST_FROM), ("until", REST_UNTIL)):
            if mark not in rest and into >= at:
                rest[mark] = (time.monotonic(), cpu_ticks(pid), cpu_ticks(apiserver))
    elapsed = time.monotonic() - t0
    op1, api1 = cpu_ticks(pid), cpu_ticks(apiserver)
    (r0, rop0, rapi0), (r1, rop1, rapi1) = rest["from"], rest["until"]
    found = lags(operator.child.log_path).get(slot, [0.0])

    def pct(ticks: int, seconds: float) -> float:
        return ticks * 100 / CLK_TCK / seconds

    return Minute(slot=slot, runs=len(lags(operator.child.log_path).get(slot, [])),
                  skipped=skips(operator.child.log_path).get(slot, 0),
                  p50=statistics.median(found), p99=percentile(found, 0.99),
                  worst=max(found), cpu=pct(op1 - op0, elapsed),
                  cpu_rest=pct(rop1 - rop0, r1 - r0), apiserver=pct(api1 - api0, elapsed),
                  apiserver_rest=pct(rapi1 - rapi0, r1 - r0), rss_mb=rss[-1] / 1024,
                  rss_max_mb=max(rss) / 1024, load=load())


def baseline(operator: Operator, seconds: float) -> tuple[float, float]:
    """(RSS MB, CPU %) with no schedules."""
    assert operator.child is not None
    pid = operator.child.pid
    t0, ticks = time.monotonic(), cpu_ticks(pid)
    time.sleep(seconds)
    return rss_kib(pid) / 1024, (cpu_ticks(pid) - ticks) * 100 / CLK_TCK / (
        time.monotonic() - t0)


_SAID = {
    "idle": "each schedule's first run stays live (no node), so every later slot is skipped "
            "(Forbid)",
    "churn": "each minute, one run per schedule, refused at launch (no pod), and one deleted "
             "by the history limit",
}


def table(scenario: str, n: int, minutes: list[Minute], base: tuple[float, float]
          ) -> list[str]:
    rows = [f"{scenario}: {n} AgentRunSchedules of @every 1m (every slot at the same "
            f"second): {_SAID[scenario]}",
            f"baseline, no schedules: RSS {base[0]:.0f} MB, CPU {base[1]:.1f}% of a core", "",
            "| slot (UTC) | runs created | slots skipped | lag p50 | lag p99 | lag max | "
            "operator CPU, minute | operator CPU, at rest | kube-apiserver CPU, minute / at "
            "rest | operator RSS (max) | load average |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for m in minutes:
        rows.append(
            f"| {datetime.datetime.fromtimestamp(m.slot, datetime.UTC):%H:%M:%S} | "
            f"{m.runs}/{n} | {m.skipped} | {m.p50 * 1000:.0f} ms | {m.p99 * 1000:.0f} ms | "
            f"{m.worst * 1000:.0f} ms | {m.cpu:.1f}% | {m.cpu_rest:.1f}% | "
            f"{m.apiserver:.1f}% / {m.apiserver_rest:.1f}% | {m.rss_mb:.0f} MB "
            f"({m.rss_max_mb:.0f}) | {m.load} |")
    created = [m for m in minutes if m.runs]
    later = minutes[1:] or minutes
    if created:
        rows += ["", f"lag from slot to run created: p50 "
                 f"{statistics.median(m.p50 for m in created) * 1000:.0f} ms (median of the "
                 f"minutes' p50), worst p99 {max(m.p99 for m in created) * 1000:.0f} ms, over "
                 f"{sum(m.runs for m in created)} runs; after the first slot, at rest (30 s to "
                 f"55 s after each slot) the operator used "
                 f"{statistics.mean(m.cpu_rest for m in later):.1f}% of a core, over whole "
                 f"minutes {statistics.mean(m.cpu for m in later):.1f}%; RSS "
                 f"{max(m.rss_max_mb for m in minutes):.0f} MB at most"]
    return rows


def scenario(name: str, n: int, minutes_wanted: int, threads: int, say: Report,
             keep: bool) -> bool:
    """One scenario on a control plane, a store and an operator of its own."""
    work = Path(tempfile.mkdtemp(prefix=f"agentrun-bench-schedule-{name}-"))
    ok = False
    with contextlib.ExitStack() as stack:
        try:
            plane = ControlPlane(work / "cp").start()
            stack.callback(plane.stop)
            pg = Postgres().start()
            stack.callback(pg.stop)
            apply_crds(plane)
            url = pg.create_database("bench")
            asyncio.run(store.migrate(url))
            create_namespace(plane, NAMESPACE)
            operator = Operator(plane, url, work, scripted=False).start()
            stack.callback(operator.stop)
            api = api_client(plane, threads + 4)
            say(f"\n{name}: load average {load()}")
            base = baseline(operator, 20)
            say(f"  baseline: RSS {base[0]:.0f} MB, CPU {base[1]:.1f}%")
            began = time.monotonic()
            create_many(schedule_maker(api, name), range(n), threads)
            say(f"  {n} schedules created in {time.monotonic() - began:.1f} s")
            first = (int(time.time()) // PERIOD + 1) * PERIOD
            minutes = []
            for k in range(minutes_wanted):
                minute = measure_minute(plane, operator, first + k * PERIOD)
                minutes.append(minute)
                say(f"  slot {minute.slot}: {minute.runs} runs, {minute.skipped} skipped, lag "
                    f"p50 {minute.p50 * 1000:.0f} ms p99 {minute.p99 * 1000:.0f} ms, CPU "
                    f"{minute.cpu:.1f}% (at rest {minute.cpu_rest:.1f}%), RSS "
                    f"{minute.rss_mb:.0f} MB")
            say("")
            for line in table(name, n, minutes, base):
                say(line)
            ok = True
        finally:
            if not ok:
                print(f"bench failed; logs kept in {work}", file=sys.stderr)
    if ok and not keep:
        shutil.rmtree(work, ignore_errors=True)
    elif ok:
        print(f"logs kept in {work}")
    return ok


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--schedules", type=int, default=1000)
    parser.add_argument("--minutes", type=int, default=3,
                        help="whole minutes measured, from the first slot")
    parser.add_argument("--scenarios", default=",".join(SCENARIOS),
                        help=f"comma-separated, of {', '.join(SCENARIOS)}")
    parser.add_argument("--threads", type=int, default=8, help="concurrent create calls")
    parser.add_argument("--keep", action="store_true", help="keep the operator's log")
    parser.add_argument("--out", help="results file (default ~/.cache/agentrun/bench/"
                                      "schedule-<time>.txt; '-' for stdout only)")
    args = parser.parse_args()
    chosen = [x for x in args.scenarios.split(",") if x]
    if not set(chosen) <= set(SCENARIOS):
        parser.error(f"--scenarios: of {', '.join(SCENARIOS)}")
    out = results_file("schedule", args.out)
    say = Report()
    say(f"bench/schedule.py, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, "
        f"{os.cpu_count()} CPUs, {args.schedules} schedules, {args.minutes} minutes each, "
        f"scenarios {', '.join(chosen)}; no node; operator with default flags")
    for name in chosen:
        if not scenario(name, args.schedules, args.minutes, args.threads, say, args.keep):
            return 1
    say(f"\nload average at the end {load()} (other processes share these CPUs)")
    say.write(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
