"""`kubectl agentrun result|transcript|history`: a run's answer, its conversation (followed
while it is live) and the run archive, through the aggregated API store.agentrun.dev."""

from __future__ import annotations

import json
import sys
from typing import Any

from agentrun.vocabulary import (
    TRANSCRIPT_AUTHOR,
    ApprovalDecision,
    EntryKind,
    EntryState,
    Phase,
)
from agentrun_kubectl.cluster import OK, REFUSED, Cluster, Failure


def result(cluster: Cluster, run: str, output: str | None) -> int:
    """The run's whole answer (status.result has its first 4,096 bytes); with -o json, the
    object of its output schema."""
    found = cluster.transcript(run)
    answer = found.get("result")
    phase = (found.get("run") or {}).get("phase") or Phase.PENDING
    if not answer:
        raise Failure(f"AgentRun {run} has no answer{'' if phase in Phase.TERMINAL else ' yet'}"
                      f" ({phase})", REFUSED)
    if output == "json":
        if "json" not in answer:
            raise Failure(f"AgentRun {run}'s answer is not an object of an output schema (its "
                          "agent declares none, or the answer did not parse); without -o json "
                          "it is printed as text", REFUSED)
        print(json.dumps(answer["json"], indent=2, ensure_ascii=False))
        return OK
    print(answer["text"])
    return OK




def history(cluster: Cluster, *, everywhere: bool, since: str | None, phase: str | None,
            selector: str | None) -> int:
    """The runs the store has recorded, newest first, whether their AgentRuns are still in
    the API server or not (runs.store.agentrun.dev)."""
    query = [(k, v) for k, v in (("since", since), ("labelSelector", selector),
                                 ("fieldSelector", phase and f"status.phase={phase}")) if v]
    rows = [(["NAMESPACE"] if everywhere else []) + ["NAME", "UID", "PHASE", "REASON",
                                                     "TOOLS EXECUTED", "CREATED"]]
    for r in cluster.records(query, everywhere=everywhere):
        meta, status = r["metadata"], r["status"]
        tools = status.get("toolsExecuted")
        rows.append(([meta["namespace"]] if everywhere else []) + [
            meta["name"], meta["uid"], status.get("phase") or "", status.get("reason") or "",
            "<unknown>" if tools is None else ",".join(tools) or "<none>",
            meta.get("creationTimestamp") or ""])
    if len(rows) == 1:
        where = "any namespace" if everywhere else f"namespace {cluster.namespace}"
        print(f"No recorded runs in {where}.", file=sys.stderr)
        return OK
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("   ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return OK


def transcript(cluster: Cluster, run: str, *, follow: bool, uid: str | None = None) -> int:
    """The run's conversation, readable; with `follow`, as it goes, until it settles. With
    `uid`, that run of the name (the name may have been used again since)."""
    if not follow:
        found = cluster.transcript(run, uid)
        print(headline(run, found))
        shown = Conversation()
        for entry in found.get("entries") or []:
            shown.add(entry)
        print(ending(found))
        return OK
    shown = Conversation()
    print(f"AgentRun {run}: following its transcript until it settles (Ctrl-C to stop)")
    while True:
        stream = cluster.follow(run, uid)
        try:
            for line in stream.response:
                if line.strip():
                    shown.add(json.loads(line))
        except (OSError, ValueError) as e:  # cut: the API server's timeout, or the network
            print(f"  (the stream was cut: {type(e).__name__}; following again)",
                  file=sys.stderr)
        finally:
            stream.response.release_conn()
        # A stream ends when its run settles, or after a while (the API server's request
        # timeout is the bound): which, the Transcript says.
        found = cluster.transcript(run, uid)
        for entry in found.get("entries") or []:
            shown.add(entry)
        if (found.get("run") or {}).get("phase") in Phase.TERMINAL:
            print(ending(found))
            return OK


def headline(run: str, found: dict[str, Any]) -> str:
    said = found.get("run") or {}
    usage = found.get("usage") or {}
    tokens = (usage.get("inputTokens") or 0) + (usage.get("outputTokens") or 0)
    return (f"AgentRun {run}: {said.get('phase') or Phase.PENDING}, "
            f"{_count(usage.get('modelCalls', 0), 'model call')}, "
            f"{_count(usage.get('toolCalls', 0), 'tool call')}, {_count(tokens, 'token')}")


def _count(n: int, thing: str) -> str:
    return f"{n:,} {thing}{'' if n == 1 else 's'}"


def ending(found: dict[str, Any]) -> str:
    said = found.get("run") or {}
    name, phase = said.get("name"), said.get("phase") or Phase.PENDING
    if phase not in Phase.TERMINAL:
        return f"{name} is {phase}: kubectl agentrun transcript {name} -f follows it"
    if found.get("result"):
        return f"{name} {phase}; its whole answer: kubectl agentrun result {name}"
    return f"{name} {phase}, with no answer"


class Conversation:
    """Prints entries as a conversation, each once (an entry sent again with a new state
    prints only what changed), with a line for each new attempt."""

    def __init__(self) -> None:
        self.seen: dict[tuple[Any, ...], dict[str, Any]] = {}
        self.attempt = 0

    def add(self, entry: dict[str, Any]) -> None:
        # What names an entry while it changes: a call's seq and state may come later
        # (its ledger row is written after the model's call reached the session).
        key = (entry.get("attempt"), entry.get("kind"), entry.get("time"),
               entry.get("author"), entry.get("tool"))
        before = self.seen.get(key)
        if before == entry:
            return
        self.seen[key] = entry
        if before is not None:
            if entry.get("state") != before.get("state"):
                print(f"           {mark(entry) or 'state: ' + str(entry.get('state'))}")
            return
        if entry.get("attempt") != self.attempt:
            self.attempt = int(entry.get("attempt") or 0)
            print(f"--- attempt {self.attempt} ---")
        print(said(entry))


def _json(value: Any) -> str:
    # Sorted: a store keeps an object's keys in its own order (Postgres JSONB sorts them).
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(", ", ": "))


def mark(entry: dict[str, Any]) -> str:
    """What a call's state means, in words (none while it runs)."""
    state = entry.get("state")
    if state == EntryState.IN_DOUBT:
        return ("[IN DOUBT: called, its end never recorded; it may or may not have "
                "happened]")
    if state == EntryState.DENIED:
        return "[denied]"
    if state == EntryState.ANSWERED and entry.get("kind") == EntryKind.TOOL_RESULT:
        return "[answered from the journal: not run again]"
    return ""


def said(entry: dict[str, Any]) -> str:
    """One entry as a line of the conversation."""
    at = str(entry.get("time") or "")[11:19]
    who, kind, tool = entry.get("author") or "", entry.get("kind"), entry.get("tool")
    call = f" (call {entry['seq']})" if entry.get("seq") is not None else ""
    tail = f"  {mark(entry)}" if mark(entry) else ""
    if kind in (EntryKind.INPUT, EntryKind.TEXT):
        line = f"{who}: {entry.get('text', '')}"
    elif kind == EntryKind.TOOL_CALL:
        line = f"{who} calls {tool}{call} {_json(entry.get('args') or {})}"
    elif kind == EntryKind.TOOL_RESULT:
        line = f"{tool}{call} returned {_json(entry.get('result'))}"
    elif kind == EntryKind.APPROVAL and who == TRANSCRIPT_AUTHOR:
        until = (entry.get("result") or {}).get("expiresAt", "")
        line = f"{tool}{call} waits for an approval of {_json(entry.get('args'))} until {until}"
    elif kind == EntryKind.APPROVAL:
        decided = entry.get("result") or {}
        verb = "denied" if decided.get("decision") == ApprovalDecision.DENY else "approved"
        note = f": {decided['note']}" if decided.get("note") else ""
        line = f"{who} {verb} {tool}{call}{note}"
        tail = ""
    else:
        reason = (entry.get("result") or {}).get("reason")
        line = f"error{f' ({reason})' if reason else ''}: {entry.get('text', '')}"
    return f"  {at} {line}{tail}"

