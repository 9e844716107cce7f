"""The operator at rest with many live runs: memory and CPU at 1,000, 2,500 and 5,000.

    .venv/bin/python bench/scale.py [--levels 1000,2500,5000] [--window 30] [--out PATH]

One control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler) and no
node, so every runner pod stays Pending (Unschedulable) and every run stays live. A
throwaway Postgres store and the operator with its default flags.

First the operator is measured with no runs (the baseline). Then, for each level, runs
(noop-agent, a one-line script, input "hi") are created in namespace `scale` up to that
many; we wait until every run's status says Pending with reason Unschedulable and names
its pod, and that pod exists; then until the operator has gone quiet (5 seconds in a
row under 5% of a core each, and its log not growing; at most 3 minutes). Then, for
`--window` seconds with nothing changing (the runs' and pods' resourceVersions are
compared before and after):

- the operator's RSS (VmRSS of the process and its descendants, /proc/<pid>/status),
  sampled every second: the last sample and the highest;
- its CPU: utime+stime deltas (/proc/<pid>/stat) over the window as % of one core, the
  busiest second, and the split between the main thread (the event loop: kopf, the
  handlers, the reconciles) and the others (the informers, the API client threads);
- kube-apiserver's CPU the same way (its pid from the ControlPlane's children), and
  etcd's, kube-controller-manager's and kube-scheduler's for context.

The goals (at 5,000 live runs): RSS <= 250 MB, CPU <= 5% of a core.

The output goes to stdout and to `--out` (default ~/.cache/agentrun/bench/scale-<time>.txt
as docs/development.md says; `--out -` for stdout only).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import shutil
import sys
import tempfile
import time
from collections import Counter
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
from agentrun_devtools.stats import results_file  # noqa: E402
from kubernetes import client  # noqa: E402
from throughput import (  # noqa: E402
    CLK_TCK,
    Report,
    agentrun_maker,
    api_client,
    child_pid,
    cpu_ticks,
    create_many,
    create_namespace,
    load,
    rss_kib,
    thread_ticks,
)

from agentrun import store  # noqa: E402
from agentrun.vocabulary import GROUP, LABEL_RUN, RUN_PLURAL, VERSION  # noqa: E402
from tests.cluster_fixtures import apply_crds  # noqa: E402
from tests.harness import Operator  # noqa: E402

NAMESPACE = "scale"
GOAL_RSS_MB = 250
GOAL_CPU = 5.0
QUIET_CPU = 5.0  # % of a core, per second, for QUIET_SECONDS in a row
QUIET_SECONDS = 5
QUIET_TIMEOUT = 180


# -- what the API says ----------------------------------------------------------------------


def _raw(fn: Callable[..., Any], *args: Any, **kw: Any) -> dict[str, Any]:
    response = fn(*args, _preload_content=False, _request_timeout=120, **kw)
    return json.loads(response.data)


def listed_runs(api: client.ApiClient, namespace: str) -> list[dict[str, Any]]:
    # resourceVersion "0": from the API server's watch cache (no etcd read).
    return _raw(client.CustomObjectsApi(api).list_namespaced_custom_object, GROUP, VERSION,
                namespace, RUN_PLURAL, resource_version="0").get("items") or []


def listed_pods(api: client.ApiClient, namespace: str,
                selector: str = LABEL_RUN) -> list[dict[str, Any]]:
    return _raw(client.CoreV1Api(api).list_namespaced_pod, namespace,
                label_selector=selector, resource_version="0").get("items") or []


def versions(api: client.ApiClient, namespace: str) -> dict[tuple[str, str], str]:
    """(kind, name) -> resourceVersion of every run and runner pod in `namespace`."""
    out = {("run", o["metadata"]["name"]): o["metadata"]["resourceVersion"]
           for o in listed_runs(api, namespace)}
    out.update({("pod", o["metadata"]["name"]): o["metadata"]["resourceVersion"]
                for o in listed_pods(api, namespace)})
    return out


def wait_live(api: client.ApiClient, namespace: str, n: int, say: Report, *,
              timeout: float = 1800, reason: str = "Unschedulable") -> float:
    """Until `n` runs in `namespace` are Pending with `reason`, their pod existing;
    returns the seconds it took. Looked at every n/200 s (at least 5 s): listing
    thousands of objects costs the API server, and the machine is shared."""
    every = max(5.0, n / 200)
    began = time.monotonic()
    last = 0.0
    while True:
        runs = listed_runs(api, namespace)
        pods = {p["metadata"]["name"] for p in listed_pods(api, namespace)}
        reasons: Counter[str] = Counter()
        live = 0
        for run in runs:
            status = run.get("status") or {}
            ok = (status.get("phase") == "Pending" and status.get("reason") == reason
                  and status.get("podName") in pods)
            live += ok
            reasons[f"{status.get('phase')}/{status.get('reason')}"] += 1
        took = time.monotonic() - began
        if live >= n:
            return took
        if took - last >= 30:
            last = took
            say(f"    {took:4.0f} s: {live}/{n} live and {reason}; {len(runs)} runs, "
                f"{len(pods)} pods; " + ", ".join(f"{k} {v}" for k, v in reasons.most_common()))
        if took > timeout:
            raise TimeoutError(f"{live}/{n} runs live after {timeout:.0f}s: {dict(reasons)}")
        time.sleep(every)


def wait_quiet(pid: int, log: Path) -> tuple[float, bool]:
    """Until the operator has used under QUIET_CPU % of a core in each of QUIET_SECONDS
    seconds in a row and its log has not grown; (seconds waited, whether it went quiet)."""
    began = time.monotonic()
    calm = 0
    ticks, size = cpu_ticks(pid), log.stat().st_size
    while time.monotonic() - began < QUIET_TIMEOUT:
        time.sleep(1)
        now_ticks, now_size = cpu_ticks(pid), log.stat().st_size
        busy = (now_ticks - ticks) * 100 / CLK_TCK
        calm = calm + 1 if busy < QUIET_CPU and now_size == size else 0
        ticks, size = now_ticks, now_size
        if calm >= QUIET_SECONDS:
            return time.monotonic() - began, True
    return time.monotonic() - began, False


# -- one window -------------------------------------------------------------------------------


@dataclass
class Window:
    runs: int
    ready_s: float
    quiet_s: float
    quiet: bool
    rss_mb: float
    rss_max_mb: float
    cpu: float  # % of one core over the window
    cpu_max_1s: float
    main_thread: float
    other_threads: float
    apiserver: float
    etcd: float
    kcm: float
    scheduler: float
    changed: int
    log_lines: int
    uptime_s: float
    load: str


def measure(plane: ControlPlane, operator: Operator, api: client.ApiClient, runs: int,
            ready_s: float, seconds: float, started: float,
            namespace: str = NAMESPACE) -> Window:
    assert operator.child is not None
    pid = operator.child.pid
    quiet_s, quiet = wait_quiet(pid, operator.child.log_path)
    before = versions(api, namespace)
    time.sleep(3)  # the lists' own cost is behind us
    others = {name: child_pid(plane, name) for name in
              ("kube-apiserver", "etcd", "kube-controller-manager", "kube-scheduler")}
    lines0 = operator.child.log_path.read_text(errors="replace").count("\n")
    uptime = time.monotonic() - started
    t0, op0, threads0 = time.monotonic(), cpu_ticks(pid), thread_ticks(pid)
    rest0 = {name: cpu_ticks(p) for name, p in others.items()}
    rss: list[int] = [rss_kib(pid)]
    per_second: list[float] = []
    last = op0
    while time.monotonic() - t0 < seconds:
        time.sleep(max(0.0, min(1.0, seconds - (time.monotonic() - t0))))
        now = cpu_ticks(pid)
        per_second.append((now - last) * 100 / CLK_TCK)
        last = now
        rss.append(rss_kib(pid))
    elapsed = time.monotonic() - t0
    op1, threads1 = cpu_ticks(pid), thread_ticks(pid)
    rest1 = {name: cpu_ticks(p) for name, p in others.items()}
    lines1 = operator.child.log_path.read_text(errors="replace").count("\n")
    after = versions(api, namespace)
    changed = sum(1 for k in set(before) | set(after) if before.get(k) != after.get(k))

    def pct(ticks: int) -> float:
        return ticks * 100 / CLK_TCK / elapsed

    main = threads1.get(pid, 0) - threads0.get(pid, 0)
    total_threads = sum(threads1.values()) - sum(v for k, v in threads0.items()
                                                 if k in threads1)
    return Window(
        runs=runs, ready_s=ready_s, quiet_s=quiet_s, quiet=quiet,
        rss_mb=rss[-1] / 1024, rss_max_mb=max(rss) / 1024,
        cpu=pct(op1 - op0), cpu_max_1s=max(per_second or [0.0]),
        main_thread=pct(main), other_threads=pct(total_threads - main),
        apiserver=pct(rest1["kube-apiserver"] - rest0["kube-apiserver"]),
        etcd=pct(rest1["etcd"] - rest0["etcd"]),
        kcm=pct(rest1["kube-controller-manager"] - rest0["kube-controller-manager"]),
        scheduler=pct(rest1["kube-scheduler"] - rest0["kube-scheduler"]),
        changed=changed, log_lines=lines1 - lines0, uptime_s=uptime, load=load())


def table(windows: list[Window], seconds: float) -> list[str]:
    rows = [f"Operator at rest, {seconds:.0f} s windows with nothing changing "
            "(goals at 5,000 live runs: RSS <= 250 MB, CPU <= 5% of a core)",
            "| live runs | all live after | quiet after | operator RSS (max) | operator CPU "
            "| busiest 1 s | main thread / others | kube-apiserver CPU | etcd | kcm | "
            "scheduler | objects changed | operator log lines | operator uptime | "
            "load average |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for w in windows:
        rows.append(
            f"| {w.runs} | {w.ready_s:.0f} s | {w.quiet_s:.0f} s"
            f"{'' if w.quiet else ' (not quiet)'} | {w.rss_mb:.0f} MB ({w.rss_max_mb:.0f}) | "
            f"{w.cpu:.1f}% | {w.cpu_max_1s:.0f}% | {w.main_thread:.1f}% / "
            f"{w.other_threads:.1f}% | {w.apiserver:.1f}% | {w.etcd:.1f}% | {w.kcm:.1f}% | "
            f"{w.scheduler:.1f}% | {w.changed} | {w.log_lines} | {w.uptime_s:.0f} s | "
            f"{w.load} |")
    top = max(windows, key=lambda w: w.runs)
    rows += ["", f"| goal at 5,000 | measured at {top.runs} | met |", "|---|---|---|",
             f"| RSS <= {GOAL_RSS_MB} MB | {top.rss_max_mb:.0f} MB | "
             f"{'yes' if top.rss_max_mb <= GOAL_RSS_MB else 'NO'} |",
             f"| CPU <= {GOAL_CPU:.0f}% of a core | {top.cpu:.1f}% | "
             f"{'yes' if top.cpu <= GOAL_CPU else 'NO'} |"]
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", default="1000,2500,5000",
                        help="live runs to measure at, comma-separated, increasing")
    parser.add_argument("--window", type=float, default=30.0, help="seconds measured")
    parser.add_argument("--threads", type=int, default=8, help="concurrent create calls")
    parser.add_argument("--keep", action="store_true",
                        help="keep the work directory (the operator's log) afterwards")
    parser.add_argument("--out", help="results file (default ~/.cache/agentrun/bench/"
                                      "scale-<time>.txt; '-' for stdout only)")
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",") if x]
    if levels != sorted(levels):
        parser.error("--levels must increase")
    out = results_file("scale", args.out)
    say = Report()
    work = Path(tempfile.mkdtemp(prefix="agentrun-bench-scale-"))
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
            started = time.monotonic()
            operator = Operator(plane, url, work).start()
            stack.callback(operator.stop)
            api = api_client(plane, args.threads + 4)
            say(f"bench/scale.py, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, "
                f"{os.cpu_count()} CPUs, levels {levels}, {args.window:.0f} s windows; no node "
                f"(runner pods stay Pending); operator with default flags (resync every "
                f"~300 s); load average {load()}")
            windows = []
            say("\n0 runs (baseline)")
            windows.append(measure(plane, operator, api, 0, 0.0, args.window, started))
            say(f"  RSS {windows[-1].rss_mb:.0f} MB, CPU {windows[-1].cpu:.1f}%, load "
                f"{windows[-1].load}")
            have = 0
            make = agentrun_maker(api, NAMESPACE)
            for level in levels:
                say(f"\n{level} runs: creating {level - have}")
                began = time.monotonic()
                create_many(make, range(have, level), args.threads)
                say(f"  created in {time.monotonic() - began:.1f} s")
                have = level
                wait_live(api, NAMESPACE, level, say)
                ready = time.monotonic() - began
                say(f"  all {level} live (Pending, Unschedulable, pod exists) "
                    f"{ready:.0f} s after the first create")
                w = measure(plane, operator, api, level, ready, args.window, started)
                windows.append(w)
                say(f"  RSS {w.rss_mb:.0f} MB (max {w.rss_max_mb:.0f}), CPU {w.cpu:.1f}% "
                    f"(busiest second {w.cpu_max_1s:.0f}%), kube-apiserver {w.apiserver:.1f}%, "
                    f"{w.changed} objects changed, load {w.load}")
            say("")
            for line in table(windows, args.window):
                say(line)
            say(f"\nload average at the end {load()} (other processes share these CPUs)")
            ok = True
        finally:
            if not ok:
                print(f"bench failed; logs kept in {work}", file=sys.stderr)
    if ok:
        say.write(out)
        if args.keep:
            print(f"logs kept in {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
