"""`make demo`: the replay story, told in the terminal with real objects.

    python -m agentrun_devtools.demo [--state .local]

Starts the development cluster if it is not up (control plane + development node, state in
--state), installs the CRDs and admission policies (`make install`), starts the operator,
the store API and the trigger receiver in the background, each its own process (logs:
<state>/operator.log, store-api.log and receiver.log, pids: <state>/operator.pid,
store-api.pid and receiver.pid; embedded SQLite store <state>/agentrun.db), then tells
these stories in namespace `demo`:

1. a support agent sends an email and its pod is evicted while the email tool has not
   answered yet: Failed, toolsExecuted [send_email]; a replay is refused and says why; a
   user without the right to force is denied by the API server; an admin forces; the
   replay runs, and the customer gets a second email (the outbox shows both);
2. a run is evicted while its model still thinks, before any tool: its replay is approved
   at once;
3. resume (retry.resume): a run evicted after send_email answered resumes by itself and
   finishes with exactly one email; one evicted while charge_card (Effectful) is in doubt is
   not resumed, and says why (ToolCallInDoubt, the model sentence);
4. a schedule (AgentRunSchedule, @every 10s, Forbid) whose runs take longer than a slot:
   the slot that comes due while its run is live is skipped, and counted; then it is
   suspended.
5. outcome: a run's answer and usage on the run; a budget (maxModelCalls) that stops a run
   before its next model call;
6. approval: a charge_card call waits for a human with no pod; a user without
   agentrun-approver is refused by the API server; an approver approves and the card is
   charged once; a second payment is denied, and the agent is told;
7. a trigger (samples/trigger/github-issues.yaml): one signed webhook delivered three
   times makes one run (201, then 200 duplicate twice, each naming the run); a delivery
   with a wrong signature is refused 401 and makes nothing.

It leaves everything running and prints the commands to look around; `make
dev-cluster-down` (cluster.py `down --state`) stops the operator and the cluster.
Nothing outside --state is touched.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import hmac
import json
import os
import shlex
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrun_kubectl.replay import replay_manifest

from agentrun import store
from agentrun.vocabulary import (
    ANNOTATION_FORCE_REPLAY,
    API_VERSION,
    APPROVER_CLUSTER_ROLE,
    ENV_DATABASE_URL,
    ENV_SCRIPT,
    FORCER_CLUSTER_ROLE,
    LABEL_SCHEDULE,
    RUN_KIND,
    SCHEDULE_KIND,
    SCRIPTED_MODEL,
    Phase,
    ReplayPhase,
)
from agentrun_devtools import cluster
from agentrun_devtools.controlplane import REPO
from agentrun_devtools.processes import ProcessDied, free_port, pids_alive, wait_for

NAMESPACE = "demo"
USER = "sam"  # may create and edit replays, may not force
APPROVER = "ann"  # may approve tool calls (agentrun-approver)
VENV_BIN = Path(sys.executable).parent
CUSTOMER = "customer-42@example.com"


def say(text: str = "") -> None:
    print(text, flush=True)


def heading(text: str) -> None:
    say()
    say(f"== {text} ==")


class Demo:
    def __init__(self, state: Path) -> None:
        self.paths = cluster._Paths(state)
        self.state = state
        self.store_url = f"sqlite:///{state / 'agentrun.db'}"
        self.kubectl_bin = state / "bin" / "kubectl"
        self.env = {
            **os.environ,
            "KUBECONFIG": str(self.paths.kubeconfig),
            "PATH": os.pathsep.join([str(state / "bin"), str(VENV_BIN),
                                     os.environ.get("PATH", "")]),
            ENV_DATABASE_URL: self.store_url,
        }

    # -- running commands, shown as the user would type them ------------------------------

    def kubectl(self, *args: str, input: str | None = None, as_user: str | None = None,
                show: bool = True, check: bool = True) -> subprocess.CompletedProcess[str]:
        argv = [*(["--as", as_user] if as_user else []), *args]
        if show:
            say(f"$ kubectl {shlex.join(argv)}" + (" <<EOF" if input else ""))
            if input:
                for line in input.rstrip().splitlines():
                    say(f"  {line}")
                say("  EOF")
        done = subprocess.run([str(self.kubectl_bin), *argv], input=input, env=self.env,
                              capture_output=True, text=True, timeout=120)
        if show:
            for line in (done.stdout + done.stderr).rstrip().splitlines():
                say(f"  {line}")
        if check and done.returncode != 0:
            raise RuntimeError(f"kubectl {shlex.join(argv)} failed: {done.stderr}")
        return done

    def get(self, kind: str, name: str) -> dict[str, Any]:
        done = self.kubectl("get", kind, name, "-n", NAMESPACE, "-o", "json", show=False)
        found: dict[str, Any] = json.loads(done.stdout)
        return found

    def wait(self, what: str, check: Callable[[], bool], timeout: float = 120) -> None:
        wait_for(check, timeout=timeout, what=what, interval=0.2)

    def wait_status(self, kind: str, name: str, phases: tuple[str, ...],
                    timeout: float = 120) -> dict[str, Any]:
        found: dict[str, Any] = {}

        def reached() -> bool:
            nonlocal found
            found = self.get(kind, name)
            return (found.get("status") or {}).get("phase") in phases

        self.wait(f"{kind} {name} {'/'.join(phases)}", reached, timeout)
        return found

    def query(self, fn: Callable[[Any], Any]) -> Any:
        async def go() -> Any:
            engine = store.make_engine(self.store_url, pool_size=1, max_overflow=0)
            try:
                return await fn(engine)
            finally:
                await engine.dispose()

        return asyncio.run(go())

    def emails(self, run_name: str) -> list[Any]:
        return [r for r in self.query(lambda e: store.outbox(e, run_name))
                if r.tool == "send_email"]

    # -- setting up -------------------------------------------------------------------------

    def setup(self) -> None:
        heading("Setting up: development cluster, CRDs and policies, operator")
        if cluster.up(self.paths) != 0:
            raise RuntimeError("the development cluster did not start")
        say("$ make install")
        done = subprocess.run(["make", "--no-print-directory", "-C", str(REPO), "install",
                               f"KUBECTL={self.kubectl_bin}"], env=self.env,
                              capture_output=True, text=True, timeout=180)
        for line in (done.stdout + done.stderr).rstrip().splitlines():
            say(f"  {line}")
        if done.returncode != 0:
            raise RuntimeError("make install failed")
        self.start_programs()
        self.kubectl("delete", "namespace", NAMESPACE, "--ignore-not-found", "--timeout=120s",
                     show=False)
        self.kubectl("create", "namespace", NAMESPACE)
        self.kubectl("create", "rolebinding", "demo-editors", "-n", NAMESPACE,
                     "--clusterrole=agentrun-edit", f"--user={USER}")
        say(f"  ({USER} may create, edit and annotate AgentRuns and AgentRunReplays here, "
            f"but is not bound to {FORCER_CLUSTER_ROLE})")
        self.kubectl("create", "rolebinding", "approvers", "-n", NAMESPACE,
                     f"--clusterrole={APPROVER_CLUSTER_ROLE}", f"--user={APPROVER}",
                     check=False)
        self.wait_for_policy()

    def start_programs(self) -> None:
        """The operator, the store API and the trigger receiver in the background, each its
        own process, as `make run` runs them in the foreground (pids and logs:
        <state>/operator.pid and .log, store-api.pid and .log, receiver.pid and .log;
        `cluster down` stops them)."""
        with contextlib.suppress(OSError, ValueError):
            pid = int(self.paths.operator_pid.read_text())
            if pids_alive([pid]):
                say(f"operator already running (pid {pid}, log {self.paths.operator_log})")
                return
        env = {**self.env, "KUBECONFIG": str(self.paths.operator_kubeconfig)}
        # The store API speaks TLS only: the development pair `cluster up` wrote into this
        # state directory; the transcript API where `up` registered it (APIService
        # v1alpha1.store.agentrun.dev).
        tls = self.paths.store_api_tls
        listen = tls / "transcript-api-listen"
        transcripts = [f"--transcript-listen={listen.read_text().strip()}"] \
            if listen.is_file() else []
        address = f"127.0.0.1:{free_port()}"
        store_api = self.background(
            self.paths.store_api_pid, self.paths.store_api_log,
            [str(VENV_BIN / "agentrun-store-api"), f"--listen={address}",
             f"--tls-cert-file={tls / 'tls.crt'}", f"--tls-private-key-file={tls / 'tls.key'}",
             *transcripts], env)
        # The trigger receiver, with its own credential and serving pair (`cluster up`).
        self.receiver_address = f"127.0.0.1:{free_port()}"
        receiver_tls = self.paths.receiver
        receiver = self.background(
            self.paths.receiver_pid, self.paths.receiver_log,
            [str(VENV_BIN / "agentrun-receiver"), f"--listen={self.receiver_address}",
             f"--tls-cert-file={receiver_tls / 'tls.crt'}",
             f"--tls-private-key-file={receiver_tls / 'tls.key'}"],
            {**self.env, "KUBECONFIG": str(self.paths.receiver_kubeconfig)})
        # The demo's runs use the scripted model, which the operator honours only when
        # told to (the chart leaves it off).
        operator = self.background(
            self.paths.operator_pid, self.paths.operator_log,
            [str(VENV_BIN / "agentrun-operator"), "--allow-scripted-model",
             f"--store-api-url=https://{address}", f"--store-api-ca-file={tls / 'ca.crt'}",
             f"--receiver-url=https://{self.receiver_address}"],
            env)
        self.wait_logged(operator, self.paths.operator_log, "event=started")
        self.wait_logged(receiver, self.paths.receiver_log, "event=started")
        # Ready once the operator has migrated the store.
        self.wait_logged(store_api, self.paths.store_api_log, "event=store-ready")
        say(f"operator started in the background (pid {operator.pid}, log "
            f"{self.paths.operator_log}, store {self.store_url})")
        say(f"store API started in the background (pid {store_api.pid}, log "
            f"{self.paths.store_api_log}, https://{address})")
        say(f"trigger receiver started in the background (pid {receiver.pid}, log "
            f"{self.paths.receiver_log}, https://{self.receiver_address})")

    def background(self, pid_file: Path, log: Path, argv: list[str],
                   env: dict[str, str]) -> subprocess.Popen[bytes]:
        with open(log, "w") as out:
            process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, env=env,
                                       start_new_session=True)
        pid_file.write_text(str(process.pid))
        return process

    def wait_logged(self, process: subprocess.Popen[bytes], log: Path, marker: str) -> None:
        def logged() -> bool:
            if process.poll() is not None:
                raise ProcessDied(f"{log.stem} exited; see {log}:\n"
                                   f"{log.read_text()[-3000:]}")
            return marker in log.read_text(errors="replace")

        self.wait(f"{marker} in {log.name}", logged, timeout=60)

    def wait_for_policy(self) -> None:
        """A new admission policy is enforced a few seconds after it is created; until then
        it would let anyone force. Ask the API server (a dry run) until it refuses."""
        probe = json.dumps(replay_manifest("policy-probe", "nothing", force=True))

        def enforced() -> bool:
            done = self.kubectl("create", "--dry-run=server", "-n", NAMESPACE, "-f", "-",
                                input=probe, as_user=USER, show=False, check=False)
            return done.returncode != 0 and "agentrun-force-replay" in done.stderr

        self.wait("the force-replay admission policy", enforced, timeout=120)
        say("the force-replay admission policy is in force")

    # -- the stories ------------------------------------------------------------------------

    def story_email(self) -> None:
        heading("1. A support agent emails a customer; its pod is evicted mid-tool")
        say("The scripted model calls send_email; the tool records the email, then takes 20 s "
            "to answer.")
        email = {"to": CUSTOMER, "body": "Your refund is on its way.", "delay_seconds": 20}
        script: list[dict[str, Any]] = [{"call": "send_email", "args": email},
                                        {"text": "Told the customer about the refund."}]
        self.kubectl("apply", "-n", NAMESPACE, "-f", "-",
                     input=json.dumps(run_manifest("refund-42", script), indent=1))
        run = self.wait_status("agentrun", "refund-42", (Phase.RUNNING,))
        uid = run["metadata"]["uid"]
        self.wait("send_email in the ledger", lambda: any(
            e.tool == "send_email" for e in self.query(lambda en: store.ledger(en, uid))))
        say("The runner wrote send_email to its ledger before calling it:")
        self.kubectl("agentrun", "tools", "refund-42", "-n", NAMESPACE)
        say("Now someone drains the node (the Eviction API):")
        self.evict("refund-42-1")
        self.wait_status("agentrun", "refund-42", (Phase.FAILED, Phase.SUCCEEDED))
        self.kubectl("get", "agentrun", "refund-42", "-n", NAMESPACE, "-o", "wide")
        self.kubectl("get", "agentrun", "refund-42", "-n", NAMESPACE, "-o",
                     "jsonpath={.status.toolsExecuted}")
        say(f"Emails in the outbox so far: {len(self.emails('refund-42'))}")

        heading("2. Ask to replay it: refused")
        self.kubectl("apply", "-n", NAMESPACE, "-f", "-", input=json.dumps(replay_manifest(
            "refund-42-again", "refund-42", note="customer says no email arrived"), indent=1))
        self.wait_status("agentrunreplay", "refund-42-again",
                         (ReplayPhase.REFUSED, ReplayPhase.APPROVED))
        self.kubectl("get", "agentrunreplay", "refund-42-again", "-n", NAMESPACE)
        self.kubectl("get", "agentrunreplay", "refund-42-again", "-n", NAMESPACE, "-o",
                     "jsonpath={.status.message}")

        heading(f"3. {USER}, who may edit replays but not force them, tries to force it")
        denied = self.kubectl("annotate", "agentrunreplay", "refund-42-again", "-n", NAMESPACE,
                              f"{ANNOTATION_FORCE_REPLAY}=true", as_user=USER, check=False)
        if denied.returncode == 0:
            raise RuntimeError("the API server let an unprivileged user force a replay")
        say("The API server refused: the admission policy asked the authorizer whether "
            f"{USER} may 'force' agentrunreplays here.")

        heading("4. An admin (allowed verb 'force') forces it")
        self.kubectl("annotate", "agentrunreplay", "refund-42-again", "-n", NAMESPACE,
                     f"{ANNOTATION_FORCE_REPLAY}=true")
        replay = self.wait_status("agentrunreplay", "refund-42-again", (ReplayPhase.APPROVED,))
        self.kubectl("get", "agentrunreplay", "refund-42-again", "-n", NAMESPACE)
        self.kubectl("agentrun", "why", "refund-42-again", "-n", NAMESPACE, check=False)
        again = replay["status"]["replayRunName"]
        say(f"The replay run {again} runs the agent again on the same input snapshot, in a "
            "fresh session (about 20 s)...")
        self.wait_status("agentrun", again, (Phase.SUCCEEDED, Phase.FAILED), timeout=180)
        self.kubectl("get", "agentruns", "-n", NAMESPACE, "-o", "wide")
        total = len(self.emails("refund-42")) + len(self.emails(again))
        say(f"Emails sent to {CUSTOMER}: {total} (one by refund-42, one by its forced replay "
            f"{again}): that is what force means.")

    def story_no_tool(self) -> None:
        heading("5. A run evicted before calling any tool: its replay is approved at once")
        script: list[dict[str, Any]] = [{"sleep": 30}, {"call": "read_message", "args": {}},
                  {"text": "Looked up order 7."}]
        self.kubectl("apply", "-n", NAMESPACE, "-f", "-",
                     input=json.dumps(run_manifest("lookup-7", script), indent=1))
        self.wait_status("agentrun", "lookup-7", (Phase.RUNNING,))
        self.wait("pod lookup-7-1 running", lambda: self.get("pod", "lookup-7-1").get(
            "status", {}).get("phase") == "Running")
        say("The model is still thinking (30 s) when the pod is evicted:")
        self.evict("lookup-7-1")
        self.wait_status("agentrun", "lookup-7", (Phase.FAILED, Phase.SUCCEEDED))
        self.kubectl("get", "agentrun", "lookup-7", "-n", NAMESPACE, "-o", "wide")
        self.kubectl("apply", "-n", NAMESPACE, "-f", "-",
                     input=json.dumps(replay_manifest("lookup-7-again", "lookup-7"), indent=1))
        self.wait_status("agentrunreplay", "lookup-7-again",
                         (ReplayPhase.APPROVED, ReplayPhase.REFUSED))
        self.kubectl("get", "agentrunreplay", "lookup-7-again", "-n", NAMESPACE)
        self.kubectl("get", "agentrunreplay", "lookup-7-again", "-n", NAMESPACE, "-o",
                     "jsonpath={.status.message}")
        self.kubectl("get", "agentruns", "-n", NAMESPACE, "-l",
                     "agentrun.dev/replay-of=lookup-7")

    def story_resume(self) -> None:
        heading("6. With retry.resume, a run evicted after send_email answered resumes by itself")
        say("The model thinks for 20 s after send_email answered; the pod is evicted then. "
            "send_email is Idempotent, update_crm Effectful (the sample agent declares them).")
        script: list[dict[str, Any]] = [
            {"call": "send_email", "args": {"to": CUSTOMER, "body": "Refund approved."}},
            {"sleep": 20},
            {"call": "update_crm", "args": {"customer": "43", "status": "refunded"}},
            {"text": "Refunded customer 43 and told them."}]
        resume = {"retry": {"maxAttempts": 2, "resume": True}}
        self.kubectl("apply", "-n", NAMESPACE, "-f", "-",
                     input=json.dumps(run_manifest("refund-43", script, **resume), indent=1))
        run = self.wait_status("agentrun", "refund-43", (Phase.RUNNING,))
        uid = run["metadata"]["uid"]
        self.wait("send_email answered", lambda: any(
            e.tool == "send_email" and e.finished_at is not None
            for e in self.query(lambda en: store.ledger(en, uid))))
        self.evict("refund-43-1")
        say("Attempt 2 continues the session from its journal: the model is asked only for "
            "what comes after send_email's answer (about 20 s)...")
        self.wait_status("agentrun", "refund-43", (Phase.SUCCEEDED, Phase.FAILED), timeout=180)
        self.kubectl("get", "agentrun", "refund-43", "-n", NAMESPACE, "-o", "wide")
        self.kubectl("get", "agentrun", "refund-43", "-n", NAMESPACE, "-o",
                     "jsonpath={.status.resumedAttempts} {.status.toolsExecuted}")
        self.kubectl("agentrun", "tools", "refund-43", "-n", NAMESPACE)
        say(f"Emails sent by refund-43: {len(self.emails('refund-43'))}")

        heading("7. Evicted while charge_card (Effectful) is in doubt: not resumed")
        script = [{"call": "charge_card", "args": {"customer": "44", "amount": 42,
                                                   "delay_seconds": 30}},
                  {"text": "Charged."}]
        self.kubectl("apply", "-n", NAMESPACE, "-f", "-",
                     input=json.dumps(run_manifest("charge-44", script, **resume), indent=1))
        run = self.wait_status("agentrun", "charge-44", (Phase.RUNNING,))
        uid = run["metadata"]["uid"]
        self.wait("charge_card in the ledger", lambda: any(
            e.tool == "charge_card" for e in self.query(lambda en: store.ledger(en, uid))))
        self.evict("charge-44-1")

        def refused() -> bool:
            found = self.get("agentrun", "charge-44")
            return any(c.get("type") == "Resumable" for c in
                       (found.get("status") or {}).get("conditions") or [])

        self.wait("the resume decision", refused)
        self.kubectl("get", "agentrun", "charge-44", "-n", NAMESPACE, "-o", "wide")
        self.kubectl("get", "agentrun", "charge-44", "-n", NAMESPACE, "-o",
                     "jsonpath={.status.conditions[?(@.type==\"Resumable\")].message}")

    def story_schedule(self) -> None:
        heading("8. A schedule under Forbid skips a slot while its run is live")
        say("An AgentRunSchedule starts a run every 10 s; each run thinks for 15 s. Forbid "
            "(the default) never starts a second run while one is live: that slot is skipped.")
        script: list[dict[str, Any]] = [{"sleep": 15}, {"text": "Queue triaged."}]
        template = run_manifest("unused", script)
        schedule = {"apiVersion": API_VERSION, "kind": SCHEDULE_KIND,
                    "metadata": {"name": "triage"},
                    "spec": {"schedule": "@every 10s", "concurrencyPolicy": "Forbid",
                             "runTemplate": {"spec": template["spec"]}}}
        self.kubectl("apply", "-n", NAMESPACE, "-f", "-", input=json.dumps(schedule, indent=1))

        def skipped() -> bool:
            return int((self.get("agentrunschedule", "triage").get("status") or {}).get(
                "skipped") or 0) >= 1

        self.wait("a skipped slot", skipped, timeout=90)
        self.kubectl("get", "agentrunschedule", "triage", "-n", NAMESPACE)
        self.kubectl("get", "agentruns", "-n", NAMESPACE, "-l", f"{LABEL_SCHEDULE}=triage")
        self.kubectl("get", "agentrunschedule", "triage", "-n", NAMESPACE, "-o",
                     "jsonpath=skipped: {.status.skipped}, missed: {.status.missed}")
        events = self.kubectl("get", "events", "-n", NAMESPACE, "--field-selector",
                              "involvedObject.name=triage,reason=SlotSkipped", "-o",
                              "jsonpath={.items[0].message}")
        if not events.stdout.strip():
            raise RuntimeError("no SlotSkipped Event on the schedule")
        say("Suspended, it starts nothing more (the run that is live finishes):")
        self.kubectl("patch", "agentrunschedule", "triage", "-n", NAMESPACE, "--type=merge",
                     "-p", '{"spec": {"suspend": true}}')
        self.kubectl("get", "agentrunschedule", "triage", "-n", NAMESPACE)

    def story_outcome(self) -> None:
        heading("9. A run's answer and what it used are on the run")
        script: list[dict[str, Any]] = [
            {"call": "read_message", "args": {}, "usage": {"inputTokens": 500,
                                                           "outputTokens": 20}},
            {"text": "Refunded customer 45 and told them.",
             "usage": {"inputTokens": 700, "outputTokens": 30}}]
        self.kubectl("apply", "-n", NAMESPACE, "-f", "-",
                     input=json.dumps(run_manifest("answer-45", script), indent=1))
        self.wait_status("agentrun", "answer-45", (Phase.SUCCEEDED, Phase.FAILED))
        self.kubectl("get", "agentrun", "answer-45", "-n", NAMESPACE, "-o", "wide")
        say("A pipeline step reads the answer with kubectl alone:")
        self.kubectl("get", "agentrun", "answer-45", "-n", NAMESPACE, "-o",
                     "jsonpath={.status.result.text}")
        self.kubectl("get", "agentrun", "answer-45", "-n", NAMESPACE, "-o",
                     "jsonpath={.status.usage}")

        heading("10. A budget stops a run before its next model call")
        say("spec.limits.maxModelCalls: 2, on a script of four steps:")
        steps: list[dict[str, Any]] = [
            {"call": "read_message", "args": {}},
            {"call": "send_email", "args": {"to": CUSTOMER, "body": "Refund approved."}},
            {"call": "update_crm", "args": {"customer": "46", "status": "refunded"}},
            {"text": "Refunded customer 46 and told them."}]
        self.kubectl("apply", "-n", NAMESPACE, "-f", "-", input=json.dumps(run_manifest(
            "chatty-46", steps, limits={"maxModelCalls": 2}), indent=1))
        self.wait_status("agentrun", "chatty-46", (Phase.FAILED, Phase.SUCCEEDED))
        self.kubectl("get", "agentrun", "chatty-46", "-n", NAMESPACE, "-o", "wide")
        self.kubectl("get", "agentrun", "chatty-46", "-n", NAMESPACE, "-o",
                     "jsonpath={.status.message}")
        crm = [r for r in self.query(lambda e: store.outbox(e, "chatty-46"))
               if r.tool == "update_crm"]
        say(f"Emails sent by chatty-46: {len(self.emails('chatty-46'))}; CRM updates: "
            f"{len(crm)} (the third step never ran)")

    def story_approval(self) -> None:
        heading("11. A payment waits for a human: no pod runs while it waits")
        say(f"{APPROVER} is bound to ClusterRole {APPROVER_CLUSTER_ROLE} in {NAMESPACE}; "
            f"{USER} is not.")
        script: list[dict[str, Any]] = [
            {"call": "charge_card", "args": {"customer": "47", "amount": 120}},
            {"text": "Charged customer 47 the 120 they owed."}]
        required = {"tools": [{"name": "charge_card", "effect": "Effectful",
                               "approval": "Required"}]}
        self.kubectl("apply", "-n", NAMESPACE, "-f", "-",
                     input=json.dumps(run_manifest("pay-47", script, **required), indent=1))
        self.wait_status("agentrun", "pay-47", (Phase.WAITING,))
        self.kubectl("get", "agentrun", "pay-47", "-n", NAMESPACE)
        self.wait("pay-47's pod gone", lambda: not json.loads(self.kubectl(
            "get", "pods", "-n", NAMESPACE, "-l", "agentrun.dev/run=pay-47", "-o", "json",
            show=False).stdout)["items"])
        self.kubectl("get", "pods", "-n", NAMESPACE, "-l", "agentrun.dev/run=pay-47")
        denied = self.kubectl("agentrun", "approve", "pay-47", "-n", NAMESPACE, "--as", USER,
                              check=False)
        if denied.returncode == 0:
            raise RuntimeError("the API server let a user who may not approve approve")
        say(f"The API server refused {USER}: creating an AgentRunApproval needs "
            f"{APPROVER_CLUSTER_ROLE}.")
        self.kubectl("agentrun", "approve", "pay-47", "-n", NAMESPACE, "--as", APPROVER,
                     "--note", "customer confirmed by phone")
        self.wait_status("agentrun", "pay-47", (Phase.SUCCEEDED, Phase.FAILED), timeout=180)
        self.kubectl("get", "agentrun", "pay-47", "-n", NAMESPACE, "-o", "wide")
        say(f"Charges of pay-47: {len(self.charges('pay-47'))}")

        heading("12. A second payment is denied, and the agent is told")
        script = [{"call": "charge_card", "args": {"customer": "48", "amount": 9000}},
                  {"text": "The charge was denied, so customer 48 was not charged."}]
        self.kubectl("apply", "-n", NAMESPACE, "-f", "-",
                     input=json.dumps(run_manifest("pay-48", script, **required), indent=1))
        self.wait_status("agentrun", "pay-48", (Phase.WAITING,))
        self.kubectl("agentrun", "approve", "pay-48", "-n", NAMESPACE, "--as", APPROVER,
                     "--deny", "--note", "the amount looks wrong", check=False)
        self.wait_status("agentrun", "pay-48", (Phase.SUCCEEDED, Phase.FAILED), timeout=180)
        self.kubectl("get", "agentrun", "pay-48", "-n", NAMESPACE, "-o",
                     "jsonpath={.status.result.text}")
        self.kubectl("agentrun", "tools", "pay-48", "-n", NAMESPACE)
        say(f"Charges of pay-48: {len(self.charges('pay-48'))}")

    def story_trigger(self) -> None:
        heading("13. An event starts one run, however often it is delivered")
        say("A GitHub-style webhook trigger (samples/trigger/github-issues.yaml): GitHub signs "
            "each delivery with the hook's secret and names it (X-GitHub-Delivery).")
        self.kubectl("create", "secret", "generic", "github-hook", "-n", NAMESPACE,
                     "--from-literal=secret=change-me")
        self.kubectl("apply", "-n", NAMESPACE, "-f",
                     str(REPO / "samples" / "trigger" / "github-issues.yaml"))
        trigger: dict[str, Any] = {}

        def ready() -> bool:
            nonlocal trigger
            trigger = self.get("agentruntrigger", "github-issues")
            return any(c["type"] == "Ready" and c["status"] == "True"
                       for c in (trigger.get("status") or {}).get("conditions") or [])

        self.wait("trigger github-issues Ready", ready)
        self.kubectl("get", "agentruntrigger", "github-issues", "-n", NAMESPACE, "-o", "wide")
        url = trigger["status"]["url"]
        body = json.dumps({"action": "opened", "issue": {"number": 7}}).encode()
        signed = {"Content-Type": "application/json", "X-GitHub-Delivery": "72d3162e",
                  "X-Hub-Signature-256": "sha256=" + hmac.new(
                      b"change-me", body, hashlib.sha256).hexdigest()}
        say(f"The same delivery, sent three times to {url}:")
        runs: set[str] = set()
        for _ in range(3):
            status, answer = self.deliver(url, body, signed)
            say(f"  {status} {json.dumps(answer)}")
            runs.add(str(answer.get("run")))
        forged = {**signed, "X-GitHub-Delivery": "8e1f0a55",
                  "X-Hub-Signature-256": "sha256=" + "0" * 64}
        say("A delivery signed with the wrong secret:")
        status, answer = self.deliver(url, body, forged)
        say(f"  {status} {json.dumps(answer)}")
        if len(runs) != 1:
            raise RuntimeError(f"three deliveries of one event named {sorted(runs)}, not one run")
        (run,) = runs
        self.wait_status("agentrun", run, (Phase.SUCCEEDED, Phase.FAILED))
        self.kubectl("get", "agentruns", "-n", NAMESPACE, "-l",
                     "agentrun.dev/trigger=github-issues")
        self.wait("the trigger's counters", lambda: self.get(
            "agentruntrigger", "github-issues").get("status", {}).get("duplicates") == 2)
        self.kubectl("get", "agentruntrigger", "github-issues", "-n", NAMESPACE)
        self.kubectl("get", "agentrun", run, "-n", NAMESPACE, "-o",
                     "jsonpath={.status.result.text}")

    def deliver(self, url: str, body: bytes,
                headers: dict[str, str]) -> tuple[int, dict[str, Any]]:
        """POSTs one delivery as a sender would, over TLS checked against the receiver's
        CA; returns its status and JSON answer, whatever the status."""
        context = ssl.create_default_context(cafile=str(self.paths.receiver / "ca.crt"))
        request = urllib.request.Request(url, data=body, method="POST", headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30, context=context) as r:
                return r.status, json.loads(r.read())
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"{}")

    def charges(self, run_name: str) -> list[Any]:
        return [r for r in self.query(lambda e: store.outbox(e, run_name))
                if r.tool == "charge_card"]

    def evict(self, pod: str) -> None:
        body = json.dumps({"apiVersion": "policy/v1", "kind": "Eviction",
                           "metadata": {"name": pod, "namespace": NAMESPACE}})
        self.kubectl("create", "--raw",
                     f"/api/v1/namespaces/{NAMESPACE}/pods/{pod}/eviction", "-f", "-",
                     input=body)

    def look_around(self) -> None:
        heading("Look around (the cluster keeps running)")
        default = self.state == cluster.DEFAULT_STATE.resolve()
        for line in [
            f"export KUBECONFIG={self.paths.kubeconfig}",
            f"export PATH={self.state / 'bin'}:{VENV_BIN}:$PATH",
            f"export DATABASE_URL={self.store_url}",
            f"kubectl get agentruns,agentrunreplays,agentrunschedules,agentruntriggers -n "
            f"{NAMESPACE} -o wide",
            f"kubectl describe agentrunreplay refund-42-again -n {NAMESPACE}",
            f"kubectl describe agentrun refund-42 -n {NAMESPACE}",
            f"kubectl agentrun tools refund-42 -n {NAMESPACE}",
            f"kubectl agentrun why lookup-7-again -n {NAMESPACE}",
            f"kubectl describe agentrunschedule triage -n {NAMESPACE}",
            f"kubectl agentrun replay lookup-7 -n {NAMESPACE}     # a second replay: "
            "AlreadyReplayed",
            f"kubectl get events -n {NAMESPACE} --sort-by=.lastTimestamp",
            f"tail -f {self.paths.operator_log} {self.paths.store_api_log} "
            f"{self.paths.receiver_log}",
            "make dev-cluster-down" if default else
            f"PYTHONPATH={REPO / 'devtools'} {sys.executable} -m agentrun_devtools.cluster "
            f"down --state {self.state}",
        ]:
            say(f"  {line}")


def run_manifest(name: str, script: list[dict[str, Any]], **spec: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": RUN_KIND, "metadata": {"name": name},
            "spec": {"agent": "support-agent", "userId": "customer-42", "model": SCRIPTED_MODEL,
                     "input": {"text": "Customer 42 asks for a refund of order 42."},
                     "env": [{"name": ENV_SCRIPT, "value": json.dumps(script)}], **spec}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="the agentrun replay demo")
    parser.add_argument("--state", type=Path, default=cluster.DEFAULT_STATE,
                        help="the development cluster's state directory (default: .local)")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    demo = Demo(args.state.resolve())
    began = time.monotonic()
    try:
        demo.setup()
        demo.story_email()
        demo.story_no_tool()
        demo.story_resume()
        demo.story_schedule()
        demo.story_outcome()
        demo.story_approval()
        demo.story_trigger()
    except (RuntimeError, TimeoutError) as e:
        say(f"\ndemo failed: {e}")
        say(f"operator log: {demo.paths.operator_log}; store API log: "
            f"{demo.paths.store_api_log}")
        return 1
    demo.look_around()
    say(f"\ndemo finished in {time.monotonic() - began:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
