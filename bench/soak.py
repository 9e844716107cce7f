"""The chaos soak: many runs under operator kills, evictions, node loss and store restarts,
then an invariant checker that reads the cluster and the store.

    .venv/bin/python bench/soak.py [--store postgres|sqlite] [--runs 200] [--seed 1]
                                   [--live 8] [--out PATH]

Starts the control plane, the development node, the store (a throwaway Postgres, or a
SQLite file), `agentrun-store-api` on its own fixed port and two operator replicas with
leader election (as the chart runs them). Then, all from `--seed`:

- the driver keeps `--live` runs going at a time until `--runs` AgentRuns were created:
  tool-free scripts, send_email with and without delay_seconds, charge_card in doubt, long
  model thinks, chat turns continuing a session, retry with and without resume; after a
  run settles, sometimes an AgentRunReplay of it: plain, resume, forced (as the admin),
  or a concurrent pair. Among them, bad input that admission lets through: a malformed
  script, an agent that does not exist, an input at the size limit, a chat sessionId
  owned by another agent; each must end Failed (or, at the limit, settle) with a status
  message and no side effect;
- the fault injector (its own generator from the same seed), at random moments until the
  driver has created every run: SIGKILL of the leader (restarted), SIGKILL of the
  standby (restarted), the Eviction API, node-pressure eviction, OOM, pod delete on a
  random live runner pod, the node lost and back, Postgres stopped for a few seconds,
  the store API restarted.

Watches (runs, replays, pods) record what happened with timestamps while it runs. At the
end, once every run settled or 5 minutes after the last fault, the checker reads the
cluster and the store (never the operator's logs) and prints the figures; it exits 1 when
a must-be-0 figure is not 0, printing the runs concerned, their status, their ledger and
the operator log lines that name them. Also reported: wall time, the operators' peak RSS
and CPU (both replicas, every process they were over the restarts).

The output goes to stdout and to `--out` (default
~/.cache/agentrun/bench/soak-<store>-<time>.txt as docs/development.md says; `--out -` for
stdout only).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import json
import os
import random
import re
import shutil
import signal
import statistics
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
for extra in (ROOT / "devtools", ROOT, ROOT / "operator"):
    if str(extra) not in sys.path:
        sys.path.insert(0, str(extra))

from agentrun_devtools.cluster import start_dev_node  # noqa: E402
from agentrun_devtools.controlplane import ControlPlane  # noqa: E402
from agentrun_devtools.postgres import Postgres  # noqa: E402
from agentrun_devtools.processes import Child, ProcessDied, free_port, wait_for  # noqa: E402
from agentrun_devtools.stats import results_file  # noqa: E402
from agentrun_operator.decide import Original, decide, is_forced  # noqa: E402
from kubernetes import client, watch  # noqa: E402
from kubernetes.client.exceptions import ApiException  # noqa: E402
from sqlalchemy import select  # noqa: E402

from agentrun import effects, store  # noqa: E402
from agentrun.store import schema  # noqa: E402
from agentrun.vocabulary import (  # noqa: E402
    ANNOTATION_FORCE_REPLAY,
    GROUP,
    LABEL_ATTEMPT,
    LABEL_RUN,
    RUN_PLURAL,
    VERSION,
    LedgerOutcome,
    Phase,
    ReplayPhase,
)
from tests.cluster_fixtures import apply_crds  # noqa: E402
from tests.harness import Operator, agent_run  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from throughput import (  # noqa: E402
    CLK_TCK,
    Report,
    api_client,
    create_namespace,
    load,
)

NAMESPACE = "soak"
REPLAY_PLURAL = "agentrunreplays"
SIMULATE = "dev.agentrun.dev/simulate"
LEASE_SECONDS = 6
SETTLE_AFTER_FAULT = 300.0
TOLERATION = 6
INPUT_LIMIT = 65536
POD_FAULTS = ("evict", "node-pressure", "oom", "pod-delete")
FAULTS = (*POD_FAULTS, "kill-leader", "kill-standby", "node-lost", "postgres-stop",
          "store-api-restart")


def _now() -> float:
    return time.monotonic()


# -- the processes ---------------------------------------------------------------------------


class StoreAPI:
    """`agentrun-store-api` on one fixed port, restartable (runner pods keep its URL)."""

    def __init__(self, plane: ControlPlane, url: str, work: Path) -> None:
        self.plane, self.database_url, self.work = plane, url, work
        self.port = free_port()
        self.url = f"https://127.0.0.1:{self.port}"
        self.child: Child | None = None
        self.starts = 0

    def start(self) -> StoreAPI:
        self.starts += 1
        log = self.work / f"store-api-{self.starts}.log"
        self.child = Child(
            "store-api",
            [str(Path(sys.executable).parent / "agentrun-store-api"), "--listen",
             f"127.0.0.1:{self.port}", "--database-url", self.database_url,
             "--tls-cert-file", str(self.plane.store_api_tls.cert),  # type: ignore[union-attr]
             "--tls-private-key-file",
             str(self.plane.store_api_tls.key)],  # type: ignore[union-attr]
            log, env={**os.environ, "KUBECONFIG": str(self.plane.operator_kubeconfig)})

        def listening() -> bool:
            assert self.child is not None
            if not self.child.alive():
                raise ProcessDied(f"agentrun-store-api exited:\n{self.child.log_tail()}")
            return "event=store-api-listening" in log.read_text(errors="replace")

        wait_for(listening, timeout=60, what="store API")
        return self

    def stop(self) -> None:
        if self.child is not None:
            self.child.stop()
            self.child = None


class Meter:
    """Peak RSS and CPU seconds of every operator process, sampled each second."""

    def __init__(self, operators: list[Operator]) -> None:
        self.operators = operators
        self.ticks: dict[int, int] = {}
        self.peak_rss_kb = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def start(self) -> Meter:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)

    def cpu_seconds(self) -> float:
        return sum(self.ticks.values()) / CLK_TCK

    def _sample(self) -> None:
        while not self._stop.wait(1.0):
            for operator in self.operators:
                child = operator.child
                if child is None:
                    continue
                with contextlib.suppress(OSError, ValueError, IndexError):
                    fields = Path(f"/proc/{child.pid}/stat").read_text().rsplit(")", 1)[1].split()
                    self.ticks[child.pid] = int(fields[11]) + int(fields[12])
                    for line in Path(f"/proc/{child.pid}/status").read_text().splitlines():
                        if line.startswith("VmRSS:"):
                            self.peak_rss_kb = max(self.peak_rss_kb, int(line.split()[1]))


# -- what the watches saw --------------------------------------------------------------------


@dataclass
class PodSeen:
    uid: str
    run: str
    attempt: int
    added: float
    dead: float | None = None  # Succeeded/Failed or deleted, as the watch first saw it


@dataclass
class Seen:
    """Runs, replays and pods as the watches saw them, with monotonic times."""

    runs: dict[str, dict[str, Any]] = field(default_factory=dict)
    history: dict[str, list[tuple[float, str, str, int]]] = field(
        default_factory=lambda: defaultdict(list))
    replays: dict[str, dict[str, Any]] = field(default_factory=dict)
    pods: dict[str, PodSeen] = field(default_factory=dict)  # by uid
    lock: threading.Lock = field(default_factory=threading.Lock)

    def phase(self, name: str) -> str:
        with self.lock:
            return str(((self.runs.get(name) or {}).get("status") or {}).get("phase") or "")

    def run(self, name: str) -> dict[str, Any]:
        with self.lock:
            return self.runs.get(name) or {}

    def replay(self, name: str) -> dict[str, Any]:
        with self.lock:
            return self.replays.get(name) or {}

    def live_pods(self) -> list[PodSeen]:
        with self.lock:
            return [p for p in self.pods.values() if p.dead is None]


def _watch_forever(stop: threading.Event, list_fn: Callable[..., Any],
                   on: Callable[[str, dict[str, Any]], None], **kw: Any) -> None:
    sanitize = client.ApiClient().sanitize_for_serialization
    while not stop.is_set():
        try:
            for event in watch.Watch().stream(list_fn, timeout_seconds=30, **kw):
                obj = event["object"]
                on(event["type"], obj if isinstance(obj, dict) else sanitize(obj))
                if stop.is_set():
                    return
        except Exception as e:  # a dropped watch: list and watch again
            print(f"watch restarted: {type(e).__name__}: {str(e)[:120]}", file=sys.stderr)
            time.sleep(1)


def start_watches(api: client.ApiClient, seen: Seen, stop: threading.Event) -> None:
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)

    def on_run(kind: str, obj: dict[str, Any]) -> None:
        name = obj["metadata"]["name"]
        status = obj.get("status") or {}
        with seen.lock:
            if kind == "DELETED":
                return
            seen.runs[name] = obj
            entry = (str(status.get("phase") or ""), str(status.get("reason") or ""),
                     int(status.get("attempts") or 0))
            past = seen.history[name]
            if not past or past[-1][1:] != entry:
                past.append((_now(), *entry))

    def on_replay(kind: str, obj: dict[str, Any]) -> None:
        if kind != "DELETED":
            with seen.lock:
                seen.replays[obj["metadata"]["name"]] = obj

    def on_pod(kind: str, obj: dict[str, Any]) -> None:
        meta = obj["metadata"]
        labels = meta.get("labels") or {}
        if LABEL_RUN not in labels:
            return
        phase = (obj.get("status") or {}).get("phase")
        with seen.lock:
            pod = seen.pods.get(meta["uid"])
            if pod is None:
                pod = seen.pods[meta["uid"]] = PodSeen(
                    meta["uid"], labels[LABEL_RUN], int(labels.get(LABEL_ATTEMPT) or 0), _now())
            if pod.dead is None and (kind == "DELETED" or phase in ("Succeeded", "Failed")):
                pod.dead = _now()

    for fn, on, kw in (
        (custom.list_namespaced_custom_object, on_run,
         {"group": GROUP, "version": VERSION, "namespace": NAMESPACE, "plural": RUN_PLURAL}),
        (custom.list_namespaced_custom_object, on_replay,
         {"group": GROUP, "version": VERSION, "namespace": NAMESPACE,
          "plural": REPLAY_PLURAL}),
        (core.list_namespaced_pod, on_pod, {"namespace": NAMESPACE}),
    ):
        threading.Thread(target=_watch_forever, args=(stop, fn, on), kwargs=kw,
                         daemon=True).start()


# -- the work: scripts, runs, replays, bad input --------------------------------------------


def email(rng: random.Random, delay: int = 0) -> dict[str, Any]:
    args: dict[str, Any] = {"to": f"customer-{rng.randrange(1000)}@example.com",
                            "body": f"note {rng.randrange(10**6)}"}
    if delay:
        args["delay_seconds"] = delay
    return {"call": "send_email", "args": args}


def script_of(kind: str, rng: random.Random) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """(script, extra spec) of one run of `kind`."""
    if kind == "tool-free":
        return [{"sleep": rng.randint(1, 4)}, {"text": "nothing to do"}], {}
    if kind == "email":
        return [{"call": "read_message", "args": {}}, email(rng), {"text": "sent"}], {}
    if kind == "email-delay":
        return [email(rng, rng.randint(4, 12)), {"text": "sent"}], {}
    if kind == "charge":
        retry = {"retry": {"maxAttempts": 2, "resume": True}} if rng.random() < 0.5 else {}
        return [{"call": "charge_card", "args": {"customer": str(rng.randrange(100)),
                                                 "amount": rng.randint(1, 99),
                                                 "delay_seconds": rng.randint(5, 15)}},
                {"text": "charged"}], retry
    if kind == "think":
        return [{"sleep": rng.randint(12, 25)}, {"call": "read_message", "args": {}},
                {"text": "thought it over"}], {}
    if kind == "retry-resume":
        return [email(rng), {"sleep": rng.randint(5, 10)}, {"text": "done"}], {
            "retry": {"maxAttempts": 3, "resume": True}}
    if kind == "retry":
        return [{"sleep": rng.randint(4, 10)}, email(rng), {"text": "done"}], {
            "retry": {"maxAttempts": 2}}
    raise ValueError(kind)


KINDS = (("tool-free", 4), ("email", 3), ("email-delay", 3), ("charge", 2), ("think", 2),
         ("chat", 2), ("retry-resume", 2), ("retry", 2))
REPLAY_KINDS = (("plain", 3), ("resume", 2), ("forced", 2), ("pair", 1))
BAD_KINDS = ("malformed-script", "unknown-entry", "no-such-agent", "input-at-limit",
             "session-of-another-agent")


@dataclass
class Outcome:
    """What the driver created and what it expects of some of them."""

    runs: list[str] = field(default_factory=list)
    replays: list[str] = field(default_factory=list)
    forced: set[str] = field(default_factory=set)
    bad: dict[str, str] = field(default_factory=dict)  # run name -> bad-input kind
    refused_at_admission: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)


class Driver:
    def __init__(self, api: client.ApiClient, seen: Seen, seed: int, total: int,
                 live: int) -> None:
        self.custom = client.CustomObjectsApi(api)
        self.seen, self.total, self.live = seen, total, live
        self.rng = random.Random(seed)
        self.rng_lock = threading.Lock()
        self.created = 0
        self.done = threading.Event()
        self.out = Outcome()
        # The plan, drawn once from the seed so that it does not depend on thread timing.
        self.plan: list[tuple[int, str, int]] = []  # (index, kind, sub-seed)
        bad_at = set(self.rng.sample(range(10, total), min(len(BAD_KINDS) * 2, total - 10)))
        bad = iter(BAD_KINDS * 2)
        names, weights = zip(*KINDS, strict=True)
        i = 0
        while i < total:
            kind = next(bad) if i in bad_at else self.rng.choices(names, weights)[0]
            self.plan.append((i, kind, self.rng.randrange(2**31)))
            i += 2 if kind in ("chat", "session-of-another-agent") else 1

    def create(self, manifest: dict[str, Any]) -> None:
        manifest["metadata"]["namespace"] = NAMESPACE
        plural = RUN_PLURAL if manifest["kind"] == "AgentRun" else REPLAY_PLURAL
        for attempt in range(8):
            try:
                self.custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE, plural,
                                                            manifest)
                break
            except ApiException as e:
                if e.status == 409:
                    break
                if e.status not in (429, 500, 502, 503, 504) or attempt == 7:
                    raise
            time.sleep(0.2 * 2 ** attempt)
        with self.out.lock:
            if plural == RUN_PLURAL:
                self.out.runs.append(manifest["metadata"]["name"])
                self.created += 1
            else:
                self.out.replays.append(manifest["metadata"]["name"])

    def wait_settled(self, name: str, timeout: float = 300) -> str:
        end = _now() + timeout
        while _now() < end:
            phase = self.seen.phase(name)
            if phase in Phase.TERMINAL:
                return phase
            time.sleep(0.5)
        return ""

    def wait_decided(self, name: str, timeout: float = 120) -> dict[str, Any]:
        end = _now() + timeout
        while _now() < end:
            found = self.seen.replay(name)
            if (found.get("status") or {}).get("phase") in (ReplayPhase.APPROVED,
                                                             ReplayPhase.REFUSED):
                return found
            time.sleep(0.5)
        return {}

    def run_item(self, index: int, kind: str, sub: int) -> None:
        rng = random.Random(sub)
        if kind in BAD_KINDS:
            self.bad_input(index, kind, rng)
            return
        if kind == "chat":
            session = f"chat-{index}"
            first = agent_run(f"chat-{index}-a", [email(rng), {"text": "hello"}],
                              trigger="chat", sessionId=session, userId=f"u{index}")
            self.create(first)
            self.wait_settled(first["metadata"]["name"])
            second = agent_run(f"chat-{index}-b", [{"sleep": 2}, {"text": "and again"}],
                               trigger="chat", sessionId=session, userId=f"u{index}")
            self.create(second)
            self.wait_settled(second["metadata"]["name"])
            return
        script, spec = script_of(kind, rng)
        name = f"{kind}-{index}"
        self.create(agent_run(name, script, **spec))
        phase = self.wait_settled(name)
        if phase and rng.random() < 0.35:
            names, weights = zip(*REPLAY_KINDS, strict=True)
            self.replay(name, rng.choices(names, weights)[0])

    def replay(self, run: str, how: str) -> None:
        def manifest(name: str, *, resume: bool = False, force: bool = False) -> dict[str, Any]:
            meta: dict[str, Any] = {"name": name}
            if force:
                meta["annotations"] = {ANNOTATION_FORCE_REPLAY: "true"}
            spec: dict[str, Any] = {"runName": run}
            if resume:
                spec["resume"] = True
            return {"apiVersion": f"{GROUP}/{VERSION}", "kind": "AgentRunReplay",
                    "metadata": meta, "spec": spec}

        made = []
        if how == "pair":
            pair = [manifest(f"{run}-p1"), manifest(f"{run}-p2")]
            threads = [threading.Thread(target=self.create, args=(m,)) for m in pair]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            made = [m["metadata"]["name"] for m in pair]
        else:
            m = manifest(f"{run}-{how}", resume=how == "resume", force=how == "forced")
            self.create(m)
            made = [m["metadata"]["name"]]
            if how == "forced":
                with self.out.lock:
                    self.out.forced.add(made[0])
        for name in made:
            decided = self.wait_decided(name)
            again = (decided.get("status") or {}).get("replayRunName")
            if again:
                self.wait_settled(again)

    def bad_input(self, index: int, kind: str, rng: random.Random) -> None:
        name = f"bad-{kind}-{index}"
        if kind == "malformed-script":
            manifest = agent_run(name)
            manifest["spec"]["model"] = "scripted"
            manifest["spec"]["env"] = [{"name": "AGENTRUN_SCRIPT",
                                        "value": '[{"call": "send_email", "args": {'}]
        elif kind == "unknown-entry":
            manifest = agent_run(name, [{"bogus": 1}, email(rng)])
        elif kind == "no-such-agent":
            manifest = agent_run(name, [email(rng)], agent=f"no-such-agent-{index}")
        elif kind == "input-at-limit":
            manifest = agent_run(name, [{"text": "read it all"}], text="x" * INPUT_LIMIT)
            over = agent_run(f"{name}-over", [email(rng)], text="x" * (INPUT_LIMIT + 1))
            over["metadata"]["namespace"] = NAMESPACE
            try:
                self.custom.create_namespaced_custom_object(GROUP, VERSION, NAMESPACE,
                                                            RUN_PLURAL, over)
                with self.out.lock:
                    self.out.errors.append(f"{name}-over: an input over the limit was admitted")
                    self.out.runs.append(f"{name}-over")
                    self.out.bad[f"{name}-over"] = "input-over-limit"
            except ApiException as e:
                if e.status != 422:
                    raise
                with self.out.lock:
                    self.out.refused_at_admission.append(f"{name}-over")
        else:  # session-of-another-agent
            session = f"owned-{index}"
            owner = agent_run(f"bad-owner-{index}", [{"text": "mine"}], agent="noop-agent",
                              trigger="chat", sessionId=session, userId=f"u{index}")
            self.create(owner)
            self.wait_settled(owner["metadata"]["name"])
            manifest = agent_run(name, [email(rng)], trigger="chat", sessionId=session,
                                 userId=f"u{index}")
        with self.out.lock:
            self.out.bad[name] = kind
        self.create(manifest)
        self.wait_settled(name)

    def worker(self, queue: list[tuple[int, str, int]]) -> None:
        while True:
            with self.rng_lock:
                if not queue:
                    return
                item = queue.pop(0)
            try:
                self.run_item(*item)
            except Exception:
                with self.out.lock:
                    self.out.errors.append(f"item {item}: {traceback.format_exc(limit=3)}")

    def run(self) -> None:
        queue = list(self.plan)
        threads = [threading.Thread(target=self.worker, args=(queue,), daemon=True)
                   for _ in range(self.live)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        self.done.set()


# -- the faults ------------------------------------------------------------------------------


@dataclass
class Fault:
    at: float
    kind: str
    target: str = ""
    run: str = ""
    attempt: int = 0
    took: float = 0.0
    error: str = ""


class Injector:
    def __init__(self, api: client.ApiClient, plane: ControlPlane, seen: Seen,
                 operators: list[Operator], store_api: StoreAPI, pg: Postgres | None,
                 seed: int, mean_gap: float) -> None:
        self.core = client.CoreV1Api(api)
        self.plane, self.seen, self.operators = plane, seen, operators
        self.store_api, self.pg = store_api, pg
        self.rng = random.Random(seed * 7919 + 1)
        self.mean_gap = mean_gap
        self.faults: list[Fault] = []
        self.stop = threading.Event()
        # The processes this thread restarts die with it (Child's parent-death signal is
        # per thread): it ends only once they were stopped.
        self.finished = threading.Event()
        self.release = threading.Event()

    def leader(self) -> Operator | None:
        done = self.plane.kubectl("get", "lease", "agentrun-operator", "-n", NAMESPACE, "-o",
                                  "jsonpath={.spec.holderIdentity}", check=False)
        holder = done.stdout.strip()
        for operator in self.operators:
            if operator.child is not None and holder.endswith(f"-{operator.child.pid}"):
                return operator
        return None

    def loop(self) -> None:
        try:
            self._loop()
        finally:
            self.finished.set()
            self.release.wait()

    def _loop(self) -> None:
        kinds = [k for k in FAULTS if self.pg is not None or k != "postgres-stop"]
        # Drawn from a shuffled deck, not independently: every kind happens in every round
        # (a soak that never lost its node proved nothing about it). The pod faults are
        # most of a cluster's bad days: twice each per round.
        deck: list[str] = []
        while not self.stop.wait(self.rng.expovariate(1 / self.mean_gap)):
            if not deck:
                deck = [*POD_FAULTS, *kinds]
                self.rng.shuffle(deck)
            kind = deck.pop()
            fault = Fault(_now(), kind)
            try:
                self.inject(fault)
            except Exception as e:
                fault.error = f"{type(e).__name__}: {str(e)[:200]}"
            fault.took = _now() - fault.at
            if fault.target or fault.kind not in POD_FAULTS:
                self.faults.append(fault)

    def inject(self, fault: Fault) -> None:
        kind = fault.kind
        if kind in POD_FAULTS:
            live = [p for p in self.seen.live_pods()
                    if self.seen.phase(p.run) == Phase.RUNNING]
            if not live:
                return
            pod = self.rng.choice(sorted(live, key=lambda p: p.uid))
            fault.target, fault.run, fault.attempt = f"{pod.run}-{pod.attempt}", pod.run, \
                pod.attempt
            if kind == "evict":
                self.core.create_namespaced_pod_eviction(fault.target, NAMESPACE, {
                    "apiVersion": "policy/v1", "kind": "Eviction",
                    "metadata": {"name": fault.target, "namespace": NAMESPACE}})
            elif kind == "pod-delete":
                self.core.delete_namespaced_pod(fault.target, NAMESPACE)
            else:
                what = "node-pressure-eviction" if kind == "node-pressure" else "oom"
                self.core.patch_namespaced_pod(fault.target, NAMESPACE, {
                    "metadata": {"annotations": {SIMULATE: what}}})
        elif kind in ("kill-leader", "kill-standby"):
            leader = self.leader()
            if leader is None:
                victim = self.operators[self.rng.randrange(2)]
            elif kind == "kill-leader":
                victim = leader
            else:
                victim = next(o for o in self.operators if o is not leader)
            fault.target = f"operator pid {victim.child.pid if victim.child else '-'}"
            if victim.child is not None:
                victim.kill()
            time.sleep(self.rng.uniform(0.5, 4))
            for attempt in range(3):  # a start on a loaded machine may time out
                try:
                    victim.start()
                    break
                except (TimeoutError, ProcessDied):
                    victim.stop()
                    if attempt == 2:
                        raise
        elif kind == "node-lost":
            fault.target = "dev-node"
            self.plane.kubectl("annotate", "node", "dev-node", f"{SIMULATE}=lost",
                               "--overwrite")
            time.sleep(self.rng.uniform(TOLERATION + 6, TOLERATION + 20))
            self.plane.kubectl("annotate", "node", "dev-node", f"{SIMULATE}-")
            wait_for(self.node_healthy, timeout=180, what="dev-node Ready without taints",
                     interval=1)
        elif kind == "postgres-stop":
            assert self.pg is not None
            fault.target = "postgres"
            halt_postgres(self.pg)
            time.sleep(self.rng.uniform(2, 6))
            resume_postgres(self.pg)
        elif kind == "store-api-restart":
            fault.target = "agentrun-store-api"
            self.store_api.stop()
            time.sleep(self.rng.uniform(0.5, 3))
            self.store_api.start()

    def node_healthy(self) -> bool:
        node = self.core.read_node("dev-node")
        ready = [c for c in node.status.conditions or [] if c.type == "Ready"]
        return bool(ready) and ready[0].status == "True" and not node.spec.taints


def halt_postgres(pg: Postgres) -> None:
    """A fast shutdown (SIGINT): the smart one (Postgres.halt's SIGTERM) waits for every
    client, and its SIGKILL after the grace would leave backends holding the shared
    memory, so that the server could not start again."""
    if pg.child is not None:
        os.kill(pg.child.pid, signal.SIGINT)
        wait_for(lambda: pg.child is None or not pg.child.alive(), timeout=60,
                 what="postgres stopped", interval=0.2)
    pg.halt()


def resume_postgres(pg: Postgres) -> None:
    for attempt in range(3):
        try:
            pg.resume()
            return
        except (TimeoutError, ProcessDied):
            pg.halt()
            if attempt == 2:
                raise
            time.sleep(5)


# -- the checker -----------------------------------------------------------------------------


@dataclass
class Facts:
    """The cluster and the store at the end."""

    runs: dict[str, dict[str, Any]]
    replays: dict[str, dict[str, Any]]
    pods: list[dict[str, Any]]
    store_runs: dict[str, Any]  # by uid
    attempts: list[Any]
    ledger: dict[str, list[Any]]  # by run uid
    outbox: dict[str, list[Any]]  # by run uid
    approvals: list[Any]


def read_facts(api: client.ApiClient, url: str) -> Facts:
    custom, core = client.CustomObjectsApi(api), client.CoreV1Api(api)
    sanitize = client.ApiClient().sanitize_for_serialization
    runs = {r["metadata"]["name"]: r for r in custom.list_namespaced_custom_object(
        GROUP, VERSION, NAMESPACE, RUN_PLURAL)["items"]}
    replays = {r["metadata"]["name"]: r for r in custom.list_namespaced_custom_object(
        GROUP, VERSION, NAMESPACE, REPLAY_PLURAL)["items"]}
    pods = [sanitize(p) for p in core.list_namespaced_pod(NAMESPACE).items]

    async def query() -> tuple[Any, ...]:
        engine = store.make_engine(url)
        try:
            async with engine.connect() as conn:
                got = []
                for table in (schema.runs, schema.attempts, schema.tool_calls,
                              schema.sample_outbox, schema.replays):
                    got.append((await conn.execute(select(table))).fetchall())
                return tuple(got)
        finally:
            await engine.dispose()

    store_runs, attempts, calls, outbox, approvals = asyncio.run(query())
    ledger: dict[str, list[Any]] = defaultdict(list)
    for row in sorted(calls, key=lambda r: (r.attempt, r.seq)):
        ledger[row.run_uid].append(row)
    sent: dict[str, list[Any]] = defaultdict(list)
    for row in outbox:
        sent[row.run_uid].append(row)
    return Facts(runs, replays, pods, {r.uid: r for r in store_runs}, list(attempts),
                 ledger, sent, list(approvals))


def _aware(when: datetime.datetime | None) -> datetime.datetime | None:
    if when is not None and when.tzinfo is None:
        return when.replace(tzinfo=datetime.UTC)
    return when


class Checker:
    def __init__(self, facts: Facts, seen: Seen, out: Outcome, faults: list[Fault]) -> None:
        self.facts, self.seen, self.out, self.faults = facts, seen, out, faults
        self.figures: list[tuple[str, int, bool]] = []  # (what, count, must be 0)
        self.suspects: dict[str, list[str]] = defaultdict(list)  # run name -> why

    def flag(self, run: str, why: str) -> None:
        self.suspects[run].append(why)

    def figure(self, what: str, bad: list[str], must_be_zero: bool = True) -> None:
        self.figures.append((what, len(bad), must_be_zero))
        for item in bad:
            run, _, why = item.partition(": ")
            if must_be_zero:
                self.flag(run, f"{what}: {why}" if why else what)

    def uid(self, name: str) -> str:
        return str(((self.facts.runs.get(name) or {}).get("metadata") or {}).get("uid") or "")

    def lineage_root(self, name: str) -> str:
        seen: set[str] = set()
        while name not in seen:
            seen.add(name)
            parent = ((self.facts.runs.get(name) or {}).get("spec") or {}).get("replayOf")
            if not parent:
                return name
            name = parent
        return name

    def check(self) -> None:
        f = self.facts
        status = {n: r.get("status") or {} for n, r in f.runs.items()}
        self.figure("runs not terminal 5 minutes after the last fault",
                    [n for n, s in status.items() if s.get("phase") not in Phase.TERMINAL])
        missing, unrecorded, unknown = [], [], []
        for name, s in status.items():
            uid = self.uid(name)
            executed = s.get("toolsExecuted")
            effects_done = Counter(row.tool for row in f.outbox.get(uid, []))
            if executed is None:
                if effects_done and s.get("phase") in Phase.TERMINAL:
                    unknown.append(f"{name}: toolsExecuted null, outbox {dict(effects_done)}")
                continue
            listed = Counter(executed)
            for tool, n in effects_done.items():
                if listed[tool] < n:
                    missing.append(f"{name}: outbox {tool} x{n}, toolsExecuted {executed}")
            # A row answered from the journal ran in an earlier attempt, not again.
            ledgered = Counter(row.tool for row in f.ledger.get(uid, [])
                               if row.outcome != LedgerOutcome.JOURNAL)
            for tool, n in listed.items():
                if ledgered[tool] < n:
                    unrecorded.append(f"{name}: toolsExecuted {tool} x{n}, ledger x"
                                      f"{ledgered[tool]}")
        self.figure("runs whose toolsExecuted misses a side effect the outbox shows", missing)
        self.figure("runs whose toolsExecuted lists a call the ledger never recorded",
                    unrecorded)
        self.figure("settled runs with toolsExecuted null and a side effect in the outbox",
                    unknown, must_be_zero=False)

        # Side effects per lineage: the outbox's unique idempotency key already makes an
        # Idempotent call re-run with its key one row. A forced replay may repeat each once.
        forced_in = Counter(self.lineage_root(a.replay_run_name) for a in f.approvals
                            if a.forced)
        effects_by: dict[str, Counter[str]] = defaultdict(Counter)
        for name in f.runs:
            for row in f.outbox.get(self.uid(name), []):
                effects_by[self.lineage_root(name)][row.tool] += 1
        repeated = [f"{root}: {tool} x{n} in the lineage, {forced_in[root]} forced replays"
                    for root, tools in effects_by.items() for tool, n in tools.items()
                    if n > 1 + forced_in[root]]
        self.figure("side effects repeated within a lineage without force", repeated)

        replay_status = {n: r.get("status") or {} for n, r in f.replays.items()}
        self.figure("AgentRunReplays without a decision",
                    [f"{(f.replays[n].get('spec') or {}).get('runName')}: replay {n}"
                     for n, s in replay_status.items()
                     if s.get("phase") not in (ReplayPhase.APPROVED, ReplayPhase.REFUSED)])
        self.figure("replays approved against the decision table (facts at decision time)",
                    self.wrong_approvals())

        per_attempt: dict[tuple[str, int], set[str]] = defaultdict(set)
        with self.seen.lock:
            pods = list(self.seen.pods.values())
        for pod in pods:
            per_attempt[(pod.run, pod.attempt)].add(pod.uid)
        for a in f.attempts:
            run = f.store_runs.get(a.run_uid)
            if run is not None and a.pod_uid:
                per_attempt[(run.name, a.attempt)].add(a.pod_uid)
        self.figure("attempts with more than one runner pod",
                    [f"{run}: attempt {n}, pods {sorted(uids)}"
                     for (run, n), uids in per_attempt.items() if len(uids) > 1])
        orphans = []
        for pod in f.pods:
            labels = pod["metadata"].get("labels") or {}
            run = labels.get(LABEL_RUN)
            if run is None:
                continue
            phase = (pod.get("status") or {}).get("phase")
            owner = status.get(run)
            if owner is None or not pod["metadata"].get("ownerReferences"):
                orphans.append(f"{run}: pod {pod['metadata']['name']} has no owner run")
            elif owner.get("phase") in Phase.TERMINAL and phase in ("Pending", "Running") \
                    and not pod["metadata"].get("deletionTimestamp"):
                orphans.append(f"{run}: pod {pod['metadata']['name']} {phase} beside a "
                               f"{owner.get('phase')} run")
        self.figure("orphan pods", orphans)
        beside = []
        remaining = {p["metadata"]["uid"] for p in f.pods}
        by_run: dict[str, dict[int, list[PodSeen]]] = defaultdict(lambda: defaultdict(list))
        for pod in pods:
            by_run[pod.run][pod.attempt].append(pod)
        for run, attempts in by_run.items():
            for n, later in attempts.items():
                for earlier in attempts.get(n - 1, []):
                    if earlier.dead is None and earlier.uid not in remaining:
                        continue  # deleted while a watch was down: its end is unknown
                    for pod in later:
                        if earlier.dead is None or pod.added < earlier.dead:
                            beside.append(f"{run}: attempt {n} pod seen "
                                          f"{(earlier.dead or _now()) - pod.added:.1f} s before "
                                          f"attempt {n - 1}'s pod ended")
        # Live means unsettled in the store: a settled attempt is fenced (the store API
        # refuses its runner every ledger, session and outbox write, and no new tool call
        # may start in it), whether or not its pod is still going away.
        live_beside = []
        rows = {(a.run_uid, a.attempt): a for a in f.attempts}
        names = {self.uid(n): n for n in f.runs}
        for (uid, n), row in rows.items():
            before = rows.get((uid, n - 1))
            if before is None or row.started_at is None:
                continue
            settled = _aware(before.finished_at) if before.finished_at is not None else None
            if settled is None or _aware(row.started_at) < settled:
                live_beside.append(f"{names.get(uid, uid)}: attempt {n} started at "
                                   f"{row.started_at}, attempt {n - 1} settled at {settled}")
        self.figure("attempts started beside a live (unsettled) attempt", live_beside)
        self.figure("runner pods of a settled, fenced attempt still present when the next "
                    "attempt's pod was created", beside, must_be_zero=False)

        bad_end = []
        for name, kind in self.out.bad.items():
            s = status.get(name) or {}
            if kind == "input-over-limit":
                bad_end.append(f"{name}: admitted")
                continue
            sent = f.outbox.get(self.uid(name), [])
            expect_failed = kind != "input-at-limit"
            if s.get("phase") not in Phase.TERMINAL or not s.get("message") or sent or (
                    expect_failed and s.get("phase") != Phase.FAILED):
                bad_end.append(f"{name}: {kind} ended {s.get('phase')}/{s.get('reason')} "
                               f"message {s.get('message')!r}, {len(sent)} side effects")
        self.figure("bad inputs without a clear end (Failed, a message, no side effect)",
                    bad_end)

    def wrong_approvals(self) -> list[str]:
        f = self.facts
        wrong = []
        by_uid = {self.uid(n): n for n in f.runs}
        unforced = Counter(a.run_uid for a in f.approvals if not a.forced)
        for a in f.approvals:
            decided = _aware(a.decided_at)
            original = f.store_runs.get(a.run_uid)
            name = by_uid.get(a.run_uid, a.run_name)
            cr = f.replays.get(a.name) or {}
            annotated = is_forced((cr.get("metadata") or {}).get("annotations"))
            if a.forced and not annotated:
                wrong.append(f"{name}: replay {a.name} approved Forced without the annotation")
            if not a.forced and unforced[a.run_uid] > 1:
                wrong.append(f"{name}: replay {a.name} is one of {unforced[a.run_uid]} "
                             "non-forced approvals")
            finished = _aware(original.finished_at) if original is not None else None
            if original is None or finished is None or (decided and finished > decided):
                wrong.append(f"{name}: replay {a.name} approved at {decided} while the "
                             f"original had not finished ({finished})")
                continue
            if a.forced:
                continue
            phase = str(original.status).capitalize()  # the store's "failed" is Failed
            called = [c for c in f.ledger.get(a.run_uid, [])
                      if decided is None or _aware(c.started_at) <= decided]
            if a.resume:
                doubt = [c for c in called if c.effect == effects.EFFECTFUL and (
                    c.finished_at is None or (decided and _aware(c.finished_at) > decided))]
                if doubt or phase == Phase.SUCCEEDED:
                    wrong.append(f"{name}: resume {a.name} approved with "
                                 f"{[c.tool for c in doubt]} in doubt, original "
                                 f"{phase}")
                continue
            recheck = decide(a.run_name, Original(
                phase=phase, tools_executed=a.tools_executed,
                input_digest=original.input_digest, input_available=True),
                already_replayed_by=None, forced=False)
            if not recheck.approved:
                wrong.append(f"{name}: replay {a.name} approved {a.reason}; the table says "
                             f"{recheck.reason} on the recorded facts")
            if called:
                wrong.append(f"{name}: replay {a.name} approved {a.reason} though the ledger "
                             f"held {[c.tool for c in called]} at {decided}")
        return wrong

    def latencies(self) -> dict[str, list[float]]:
        out: dict[str, list[float]] = defaultdict(list)
        with self.seen.lock:
            history = {k: list(v) for k, v in self.seen.history.items()}
        for fault in self.faults:
            if fault.kind not in POD_FAULTS or not fault.run or fault.error:
                continue
            for at, phase, _reason, attempts in history.get(fault.run, []):
                if at > fault.at and (phase == Phase.FAILED or attempts > fault.attempt or
                                      phase in Phase.TERMINAL):
                    out[fault.kind].append(at - fault.at)
                    break
        return out

    def reasons(self) -> Counter[str]:
        return Counter(f"{(r.get('status') or {}).get('phase')}/"
                       f"{(r.get('status') or {}).get('reason')}"
                       for r in self.facts.runs.values())

    def replay_reasons(self) -> Counter[str]:
        return Counter(f"{(r.get('status') or {}).get('phase')}/"
                       f"{(r.get('status') or {}).get('reason')}"
                       for r in self.facts.replays.values())


def dist(values: list[float]) -> str:
    if not values:
        return "none"
    values = sorted(values)
    q = (statistics.quantiles(values, n=100, method="inclusive") if len(values) > 1
         else [values[0]] * 99)
    return (f"n={len(values)} p50 {statistics.median(values) * 1000:.0f} ms, p95 "
            f"{q[94] * 1000:.0f} ms, p99 {q[98] * 1000:.0f} ms, max {values[-1] * 1000:.0f} ms")


def explain(say: Report, checker: Checker, operators: list[Operator]) -> None:
    f = checker.facts
    logs = "\n".join(o.log() for o in operators).splitlines()
    for run, whys in sorted(checker.suspects.items()):
        say(f"\n--- {run}")
        for why in whys:
            say(f"  finding: {why}")
        cr = f.runs.get(run)
        if cr is not None:
            s = cr.get("status") or {}
            say("  status: " + json.dumps({k: s.get(k) for k in (
                "phase", "reason", "message", "attempts", "toolsExecuted", "resumedAttempts",
                "replayOf")}))
            say(f"  spec: {json.dumps({k: v for k, v in cr['spec'].items() if k != 'input'})}")
            uid = cr["metadata"]["uid"]
            for c in f.ledger.get(uid, []):
                say(f"  ledger: attempt {c.attempt} seq {c.seq} {c.tool} {c.effect} "
                    f"started {c.started_at} finished {c.finished_at} outcome {c.outcome}")
            for row in f.outbox.get(uid, []):
                say(f"  outbox: attempt {row.attempt} {row.tool} key "
                    f"{(row.idempotency_key or '')[:12]} at {row.created_at}")
            with checker.seen.lock:
                history = list(checker.seen.history.get(run, []))
            say("  seen: " + ", ".join(f"{p or '-'}/{r or '-'}#{n}" for _, p, r, n in history))
        pattern = re.compile(rf"\b{re.escape(run)}(?![-\w])")
        lines = [line for line in logs if pattern.search(line)]
        for line in lines[-15:]:
            say(f"  log: {line[:300]}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", choices=("postgres", "sqlite"), default="postgres")
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--live", type=int, default=8, help="runs driven at a time")
    parser.add_argument("--fault-gap", type=float, default=12.0,
                        help="mean seconds between faults")
    parser.add_argument("--out")
    args = parser.parse_args()
    out = results_file(f"soak-{args.store}", args.out)
    say = Report()
    work = Path(tempfile.mkdtemp(prefix="agentrun-soak-"))
    began = _now()
    plane = ControlPlane(work / "cp").start()
    pg: Postgres | None = None
    node = store_api = meter = injector = None
    operators: list[Operator] = []
    stop = threading.Event()
    ok = False
    failed = True
    try:
        apply_crds(plane)
        node = start_dev_node(plane, work / "pods")
        if args.store == "postgres":
            pg = Postgres().start()
            url = pg.create_database("soak")
        else:
            url = f"sqlite:///{work / 'agentrun.db'}"
        asyncio.run(store.migrate(url))
        create_namespace(plane, NAMESPACE)
        store_api = StoreAPI(plane, url, work).start()
        flags = (f"--namespace={NAMESPACE}", f"--leader-election-namespace={NAMESPACE}",
                 f"--leader-election-seconds={LEASE_SECONDS}", "--check-interval=30",
                 f"--toleration-seconds={TOLERATION}", "--store-api-listen=",
                 f"--store-api-url={store_api.url}")
        for replica in ("a", "b"):
            (work / replica).mkdir()
            operators.append(Operator(plane, url, work / replica, flags).start())
        meter = Meter(operators).start()
        api = api_client(plane, 32)
        seen = Seen()
        start_watches(api, seen, stop)
        say(f"bench/soak.py, {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, "
            f"{os.cpu_count()} CPUs, store {args.store}, seed {args.seed}, {args.runs} runs, "
            f"{args.live} at a time, a fault every ~{args.fault_gap:g} s; two operator "
            f"replicas ({' '.join(flags[:5])}); load average {load()}")
        driver = Driver(api, seen, args.seed, args.runs, args.live)
        injector = Injector(api, plane, seen, operators, store_api, pg, args.seed,
                            args.fault_gap)
        faults = threading.Thread(target=injector.loop, daemon=True)
        faults.start()
        drive = threading.Thread(target=driver.run, daemon=True)
        drive.start()
        while drive.is_alive():
            drive.join(30)
            with driver.out.lock:
                created = driver.created
            say(f"  {_now() - began:5.0f} s: {created} runs created, {len(injector.faults)} "
                f"faults, {len(seen.live_pods())} live pods, load {load()}")
            if driver.created >= args.runs:
                injector.stop.set()
        injector.stop.set()
        injector.finished.wait(300)
        last_fault = max((fl.at + fl.took for fl in injector.faults), default=_now())
        say(f"driver done at {_now() - began:.0f} s; last fault ended at "
            f"{last_fault - began:.0f} s; waiting for every run to settle (up to "
            f"{SETTLE_AFTER_FAULT:g} s after it)")

        def settled() -> bool:
            with seen.lock:
                return all((r.get("status") or {}).get("phase") in Phase.TERMINAL
                           for r in seen.runs.values())

        with contextlib.suppress(TimeoutError):
            wait_for(settled, timeout=max(5.0, last_fault + SETTLE_AFTER_FAULT - _now()),
                     what="every run settled", interval=2)
        wall = _now() - began
        meter.stop()
        if pg is not None and pg.child is None:  # a fault that could not bring it back
            resume_postgres(pg)
        facts = read_facts(api, url)
        checker = Checker(facts, seen, driver.out, injector.faults)
        checker.check()

        say(f"\nwall time {wall:.0f} s; {len(facts.runs)} AgentRuns ({driver.created} created "
            f"by the driver, the rest replay runs), {len(facts.replays)} AgentRunReplays, "
            f"{len(injector.faults)} faults")
        say(f"operators (both replicas, {sum(o.starts for o in operators)} processes over the "
            f"restarts): peak RSS {meter.peak_rss_kb / 1024:.0f} MB, CPU "
            f"{meter.cpu_seconds():.0f} s = {meter.cpu_seconds() * 100 / wall:.1f}% of one "
            f"core over the soak")
        say("\nfaults: " + ", ".join(f"{k} {n}" for k, n in sorted(
            Counter(fl.kind for fl in injector.faults).items())))
        for fl in injector.faults:
            say(f"  {fl.at - began:5.0f} s {fl.kind} {fl.target} ({fl.took:.1f} s)"
                + (f": {fl.error}" if fl.error else ""))
        say("\n| invariant | count | must be 0 |\n|---|---|---|")
        for what, count, must in checker.figures:
            say(f"| {what} | {count} | {'yes' if must else 'no'} |")
        say("\nrun phase/reason: " + ", ".join(f"{k} {n}" for k, n in sorted(
            checker.reasons().items())))
        say("replay phase/reason: " + ", ".join(f"{k} {n}" for k, n in sorted(
            checker.replay_reasons().items())))
        say("bad input refused at admission: " + (", ".join(
            driver.out.refused_at_admission) or "none"))
        say("\nfault -> the run's next status (Failed, or a new attempt), under load:")
        for kind, values in sorted(checker.latencies().items()):
            say(f"  {kind}: {dist(values)}")
        if driver.out.errors:
            say(f"\ndriver errors ({len(driver.out.errors)}):")
            for e in driver.out.errors[:20]:
                say(f"  {e}")
        failed = any(count for _, count, must in checker.figures if must)
        if failed:
            say("\nFAILED: the runs behind the non-zero figures:")
            explain(say, checker, operators)
        say(f"\nload average at the end {load()}" + (f"; logs kept in {work}" if failed else ""))
        ok = True
    finally:
        stop.set()
        if meter is not None:
            meter.stop()
        for operator in operators:
            operator.stop()
        if store_api is not None:
            store_api.stop()
        if node is not None:
            node.stop()
        if pg is not None:
            pg.stop()
        plane.stop()
        if injector is not None:
            injector.release.set()
        if not ok:
            print(f"soak failed to complete; logs kept in {work}", file=sys.stderr)
    say.write(out)
    if not failed:
        shutil.rmtree(work, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
