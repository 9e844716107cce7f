"""`make demo`'s script, run the way the Makefile runs it, against a throwaway state
directory (its own development cluster, operator and SQLite store; the repository's
.local is never touched), then stopped with the development cluster's `down`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from agentrun_devtools.controlplane import REPO
from agentrun_devtools.processes import pids_alive, wait_for


def devtools(*args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "devtools")}
    return subprocess.run([sys.executable, "-m", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout)


def test_demo_tells_the_story_and_leaves_the_cluster_up(
        tmp_path: Path, the_machines_dev_cluster: None) -> None:
    state = tmp_path / "state"
    local = REPO / ".local"
    before = sorted(p.name for p in local.iterdir()) if local.exists() else None
    pid = receiver = 0
    try:
        done = devtools("agentrun_devtools.demo", "--state", str(state), timeout=600)
        out = done.stdout
        assert done.returncode == 0, out[-6000:] + done.stderr[-3000:]

        # 1. the run, the eviction after send_email
        assert "$ kubectl create --raw /api/v1/namespaces/demo/pods/refund-42-1/eviction" in out
        assert "1        1  send_email" in out and "no (called, never answered)" in out
        # (the ADMITTED and QUEUE columns between REASON and TOOLS are blank: no queue)
        assert re.search(r'refund-42   support-agent   Failed   Evicted +\["send_email"\]',
                         out), out[-6000:]
        # 2. the refusal, with its message
        assert "refund-42-again   refund-42   Refused   ToolsExecuted" in out
        assert ("This run already called send_email before failing: a replay would "
                "call them again. Annotate agentrun.dev/force-replay=true to run it again "
                "anyway.") in out
        # 3. the unprivileged user, denied by the API server
        assert "$ kubectl --as sam annotate agentrunreplay refund-42-again" in out
        assert ("denied request: Only principals allowed verb 'force' on agentrunreplays may "
                "set agentrun.dev/force-replay") in out
        assert "(sam may not add it in namespace demo)" in out
        # 4. the admin forces; the replay runs and emails the customer again
        assert "Approved (Forced)" in out
        assert "Emails sent to customer-42@example.com: 2" in out
        # 5. evicted before any tool: approved at once
        assert re.search(r"lookup-7   support-agent   Failed   Evicted +\[\]", out)
        assert "lookup-7-again   lookup-7   Approved   NoToolsExecuted" in out
        # 6. resumed by itself after send_email answered: one email
        assert "Emails sent by refund-43: 1" in out
        assert "[2] [\"send_email\",\"update_crm\"]" in out
        # 7. charge_card in doubt: not resumed, with the model sentence
        assert "AgentRun charge-44 called charge_card (call 1, at " in out
        assert ("it may or may not have happened, and charge_card is Effectful. Check "
                "whether it happened; annotate agentrun.dev/force-replay=true to resume and "
                "call it again.") in out
        # 8. a schedule under Forbid skips a slot while its run is live
        assert "== 8. A schedule under Forbid skips a slot while its run is live ==" in out
        assert "Skipped the slot of " in out
        assert "is still live and concurrencyPolicy is Forbid." in out
        assert "triage   @every 10s   false" in out and "triage   @every 10s   true" in out
        assert "skipped: 1, missed: 0" in out or "skipped: 2, missed: 0" in out
        # 9. the answer and the usage on the run
        assert "Refunded customer 45 and told them." in out
        assert ('{"inputTokens":1200,"modelCalls":2,"outputTokens":50,"toolCalls":1}' in out)
        # 10. the budget: two model calls, the third step never ran
        assert ("maxModelCalls 2 reached after 2 model calls (220 tokens); no further call "
                "was made.") in out
        assert "Emails sent by chatty-46: 1; CRM updates: 0" in out
        # 11. the payment waits with no pod; sam is refused; ann approves; charged once
        assert "pay-47   support-agent   Waiting   AwaitingApproval" in out
        assert "No resources found in demo namespace." in out
        assert "agentrunapprovals.agentrun.dev is forbidden: User \"sam\"" in out \
            or 'agentrunapprovals.agentrun.dev is forbidden: User "sam"' in out
        assert "Accepted (Decided): Call 1 (charge_card) of AgentRun pay-47 is approved by ann" \
            in out
        assert "Charges of pay-47: 1" in out
        # 12. denied: never charged, the agent says so
        assert "The charge was denied, so customer 48 was not charged." in out
        assert "denied by its approver (never run)" in out
        assert "Charges of pay-48: 0" in out
        # 13. one signed delivery sent three times: one run, each answer names it; a wrong
        # signature is refused and makes nothing
        created = re.search(r'  201 \{"result": "created", "message": "Started AgentRun '
                            r'(github-issues-[0-9a-f]{10}) for this event.", "run": "\1"\}',
                            out)
        assert created, out[-6000:]
        run = created.group(1)
        assert out.count(f'  200 {{"result": "duplicate", "message": "This event already '
                         f'started AgentRun {run}; no other run was started.", "run": '
                         f'"{run}"}}') == 2
        assert ('  401 {"result": "unauthorized", "message": "The X-Hub-Signature-256 '
                'signature does not match the body') in out
        assert re.search(rf"\n  {run} +support-agent +Succeeded", out), out[-6000:]
        assert len(re.findall(r"\n  github-issues-[0-9a-f]{10} ", out)) == 1
        assert re.search(r"\n  github-issues +True +(false +)?\d+ +2 ", out), out[-6000:]
        assert "Triaged the new issue." in out
        # the way to look around, and the cluster still up
        assert f"export KUBECONFIG={state / 'kubeconfig'}" in out
        assert "kubectl agentrun why lookup-7-again -n demo" in out
        assert "kubectl describe agentrunreplay refund-42-again -n demo" in out
        pid = int((state / "operator.pid").read_text())
        assert pids_alive([pid]), "the demo's operator should keep running"
        receiver = int((state / "receiver.pid").read_text())
        assert pids_alive([receiver]), "the demo's receiver should keep running"
        status = devtools("agentrun_devtools.cluster", "status", "--state", str(state),
                          timeout=60)
        assert status.stdout.strip() == "running"
    finally:
        down = devtools("agentrun_devtools.cluster", "down", "--state", str(state), timeout=180)
    assert down.returncode == 0, down.stdout + down.stderr
    if pid:
        wait_for(lambda: not pids_alive([p for p in (pid, receiver) if p]), timeout=30,
                 what="the demo's operator and receiver stopped")
    assert not (state / "operator.pid").exists()
    assert not (state / "receiver.pid").exists()
    assert not (state / "kubeconfig").exists()
    assert not (state / "agentrun.db").exists()
    after = sorted(p.name for p in local.iterdir()) if local.exists() else None
    assert after == before, "the demo touched the repository's .local"
