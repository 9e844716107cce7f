"""`kubectl agentrun approve`: show the call a run waits for, whole, and decide it as the
current user."""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from agentrun.effects import args_digest
from agentrun.vocabulary import (
    API_VERSION,
    APPROVAL_KIND,
    APPROVAL_PLURAL,
    APPROVER_CLUSTER_ROLE,
    RUN_PLURAL,
    TRANSCRIPT_AUTHOR,
    TRANSCRIPT_GROUP,
    TRANSCRIPT_PLURAL,
    ApprovalDecision,
    ApprovalPhase,
    EntryKind,
    Phase,
)
from agentrun_kubectl.cluster import OK, REFUSED, Cluster, Failure


def whole_arguments(cluster: Cluster, run: str, pending: dict[str, Any]) -> dict[str, Any]:
    """The whole arguments of the call `run` waits for, read from its transcript as the
    current user (status.pendingApproval.args is their first 1,024 bytes only), and
    checked against the digest an approval will name. Anything less refuses: nobody
    approves arguments they were not shown in full."""
    call = f"call {pending['seq']} ({pending['tool']}) of AgentRun {run}"
    try:
        transcript = cluster.transcript(run)
    except Failure as e:
        raise Failure(f"Not deciding {call}: its whole arguments cannot be read from its "
                      f"transcript ({e}), and nothing is approved unseen. Reading them needs "
                      f"get on {TRANSCRIPT_PLURAL}.{TRANSCRIPT_GROUP} (ClusterRole "
                      f"{APPROVER_CLUSTER_ROLE} grants it).", REFUSED) from e
    asked = next((e for e in reversed(transcript.get("entries") or [])
                  if e.get("kind") == EntryKind.APPROVAL
                  and e.get("author") == TRANSCRIPT_AUTHOR
                  and e.get("attempt") == pending.get("attempt")
                  and e.get("seq") == pending.get("seq")
                  and e.get("tool") == pending.get("tool")), None)
    args = (asked or {}).get("args")
    if not isinstance(args, dict):
        raise Failure(f"Not deciding {call}: its transcript does not hold its arguments, and "
                      "nothing is approved unseen.", REFUSED)
    if args_digest(args) != pending.get("argsDigest"):
        raise Failure(f"Not deciding {call}: the arguments its transcript holds have digest "
                      f"{args_digest(args)}, not {pending.get('argsDigest')} (what an approval "
                      "would approve), and nothing is approved unseen.", REFUSED)
    return args


def _show_long(text: str, call: str) -> None:
    """Prints `text`, through the user's pager ($PAGER, else `less`) when it is longer than
    the terminal; as it is when the output is not a terminal. A pager that could not show
    it (it does not start, or exits with an error) or an interrupt while it shows refuses:
    the decision is made only on what was shown."""
    import shutil
    import subprocess

    if not (sys.stdout.isatty() and text.count("\n") + 1 >
            shutil.get_terminal_size().lines - 4):
        print(text)
        return
    pager = os.environ.get("PAGER") or "less"
    sys.stdout.flush()
    try:
        # pydoc.pager would do, but it carries on whatever the pager did (a PAGER that
        # does not start shows nothing), and swallows the interrupt.
        shown = subprocess.run(pager, shell=True, input=text + "\n", text=True, check=False)
    except KeyboardInterrupt:
        raise Failure(f"Not deciding {call}: interrupted while its arguments were shown, "
                      "and nothing is approved unseen.", REFUSED) from None
    if shown.returncode != 0:
        raise Failure(f"Not deciding {call}: the pager {pager!r} exited "
                      f"{shown.returncode} before its arguments were shown, and nothing is "
                      "approved unseen. Set PAGER to a pager that works, or pipe the "
                      "output (| cat) to print them whole.", REFUSED)


def approve(cluster: Cluster, run: str, *, deny: bool, note: str | None,
            timeout: float) -> int:
    """Shows the call `run` waits for, with its arguments, and decides it as the current
    user: an AgentRunApproval of exactly those arguments (their digest)."""
    found = cluster.get(RUN_PLURAL, run)
    if found is None:
        raise Failure(f"AgentRun {run} does not exist in namespace {cluster.namespace}")
    status = found.get("status") or {}
    pending = status.get("pendingApproval")
    if status.get("phase") != Phase.WAITING or not pending:
        raise Failure(f"AgentRun {run} waits for no approval: it is "
                      f"{status.get('phase') or Phase.PENDING}"
                      + (f" ({status['reason']})" if status.get("reason") else ""),
                      REFUSED)
    print(f"AgentRun {run} waits for an approval of {pending['tool']} (call "
          f"{pending['seq']}, attempt {pending['attempt']}), asked at "
          f"{pending.get('requestedAt')}, until {pending.get('expiresAt')}:")
    args = whole_arguments(cluster, run, pending)
    shown = json.dumps(args, indent=2, sort_keys=True, ensure_ascii=False)
    _show_long(f"  arguments (whole, {len(shown.encode()):,} bytes as shown):\n"
               + "\n".join(f"    {line}" for line in shown.splitlines()),
               f"call {pending['seq']} ({pending['tool']}) of AgentRun {run}")
    print(f"  digest:    {pending['argsDigest']}")
    decision = ApprovalDecision.DENY if deny else ApprovalDecision.APPROVE
    user = cluster.whoami()
    spec: dict[str, Any] = {"runName": run, "seq": int(pending["seq"]),
                            "argsDigest": pending["argsDigest"], "decision": decision,
                            "approver": user}
    if note:
        spec["note"] = note
    name = f"{run}-call-{pending['seq']}"
    meta: dict[str, Any] = {"name": name} if cluster.get(APPROVAL_PLURAL, name) is None \
        else {"generateName": f"{name}-"}
    made = cluster.create(APPROVAL_PLURAL, {"apiVersion": API_VERSION, "kind": APPROVAL_KIND,
                                            "metadata": meta, "spec": spec})
    made_name = made["metadata"]["name"]
    print(f"agentrunapproval/{made_name} created ({decision} by {user})")
    began = time.monotonic()
    while True:
        judged = cluster.get(APPROVAL_PLURAL, made_name) or {}
        verdict = judged.get("status") or {}
        if verdict.get("phase"):
            print(f"{verdict['phase']} ({verdict.get('reason')}): {verdict.get('message')}")
            return OK if verdict["phase"] == ApprovalPhase.ACCEPTED else REFUSED
        if time.monotonic() - began > timeout:
            raise Failure(f"AgentRunApproval {made_name} was not judged within {timeout:.0f}s; "
                          "is the agentrun operator running?")
        time.sleep(0.5)

