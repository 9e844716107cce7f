"""The run archive as the aggregated API shows it: `runs.store.agentrun.dev`, kind RunRecord.

A RunRecord is the store's record of one run, whether or not its AgentRun is still in the
API server: what it was asked (agent, trigger, user, replayOf), how it ended (phase,
reason, message, toolsExecuted), what it cost (usage), its answer's first words, and when.
Its labels and annotations are the AgentRun's at launch.

Pure: selectors and continue tokens are parsed here, the store reads (store/history.py),
the store API serves (agentrun_store_api/transcripts.py).
"""

from __future__ import annotations

import base64
import binascii
import datetime
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from agentrun.store.history import Field, Keyset
from agentrun.store.runs import Run
from agentrun.vocabulary import TRANSCRIPT_API_VERSION, Phase, RunStatus

RECORD_KIND = "RunRecord"
RECORD_PLURAL = "runs"
RECORD_SINGULAR = "run"
# Annotations not kept with a record: kubectl's copy of the whole manifest (the input).
_DROPPED_ANNOTATIONS = frozenset({"kubectl.kubernetes.io/last-applied-configuration"})

PHASE_OF = {RunStatus.PENDING: Phase.PENDING, RunStatus.RUNNING: Phase.RUNNING,
            RunStatus.SUCCEEDED: Phase.SUCCEEDED, RunStatus.FAILED: Phase.FAILED,
            RunStatus.CANCELLED: Phase.CANCELLED}
_STATUS_OF = {v: k for k, v in PHASE_OF.items()}
# Field selectors the archive answers, and the store column each names.
FIELDS = {"metadata.name": "name", "metadata.namespace": "namespace", "metadata.uid": "uid",
          "spec.agent": "agent", "status.phase": "status"}


class BadSelector(ValueError):
    """A selector or continue token the archive cannot read (the message says why)."""


def kept_annotations(annotations: Mapping[str, str] | None) -> dict[str, str] | None:
    """The annotations a record keeps of its AgentRun (all but kubectl's last-applied
    copy of the manifest)."""
    kept = {k: v for k, v in (annotations or {}).items() if k not in _DROPPED_ANNOTATIONS}
    return kept or None


# -- label selectors (Kubernetes' grammar: =, ==, !=, in, notin, exists, !exists) -----------


@dataclass(frozen=True)
class Requirement:
    key: str
    op: str  # "=", "!=", "in", "notin", "exists", "!"
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        value = labels.get(self.key)
        if self.op == "exists":
            return value is not None
        if self.op == "!":
            return value is None
        if self.op in ("=", "in"):
            return value is not None and value in self.values
        return value is None or value not in self.values  # "!=", "notin"


_SET = re.compile(r"^\s*(?P<key>[^\s!=(),]+)\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)\s*$")
_EQ = re.compile(r"^\s*(?P<key>[^\s!=(),]+)\s*(?P<op>==|=|!=)\s*(?P<value>[^\s!=(),]*)\s*$")
_EXISTS = re.compile(r"^\s*(?P<not>!?)\s*(?P<key>[^\s!=(),]+)\s*$")


def _split(selector: str) -> list[str]:
    """The requirements of a selector: split at commas outside parentheses."""
    parts, depth, current = [], 0, ""
    for ch in selector:
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += ch
    parts.append(current)
    return [p for p in parts if p.strip()]


def label_selector(selector: str | None) -> Callable[[Mapping[str, str]], bool]:
    """A matcher of labels for a Kubernetes label selector ("" or None: everything)."""
    requirements: list[Requirement] = []
    for part in _split(selector or ""):
        if m := _SET.match(part):
            values = frozenset(v.strip() for v in m["values"].split(",") if v.strip())
            requirements.append(Requirement(m["key"], m["op"], values))
        elif m := _EQ.match(part):
            op = "!=" if m["op"] == "!=" else "="
            requirements.append(Requirement(m["key"], op, frozenset({m["value"]})))
        elif m := _EXISTS.match(part):
            requirements.append(Requirement(m["key"], "!" if m["not"] else "exists"))
        else:
            raise BadSelector(f"unable to parse requirement: {part.strip()!r} in label "
                              f"selector {selector!r}")
    return lambda labels: all(r.matches(labels) for r in requirements)


def field_selector(selector: str | None) -> list[Field]:
    """Store conditions for a field selector over FIELDS (=, ==, !=)."""
    fields = []
    for part in _split(selector or ""):
        m = _EQ.match(part)
        if not m or m["key"] not in FIELDS:
            raise BadSelector(
                f"field label not supported: {part.strip()!r}; the archive selects on "
                f"{', '.join(sorted(FIELDS))} (=, ==, !=)")
        column, value = FIELDS[m["key"]], m["value"]
        if column == "status":
            if value not in _STATUS_OF:
                raise BadSelector(f"status.phase {value!r} is not a phase the archive "
                                  f"records: {', '.join(_STATUS_OF)}")
            value = _STATUS_OF[value]
        fields.append(Field(column, value, equal=m["op"] != "!="))
    return fields


# -- continue tokens ---------------------------------------------------------------------


def encode_continue(after: Keyset | None) -> str:
    if after is None:
        return ""
    raw = json.dumps({"t": after[0].isoformat(), "u": after[1]}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_continue(token: str | None) -> Keyset | None:
    if not token:
        return None
    try:
        raw = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        return datetime.datetime.fromisoformat(raw["t"]), str(raw["u"])
    except (ValueError, KeyError, TypeError, binascii.Error) as e:
        raise BadSelector(f"continue token not valid: {e}") from None


# -- the object ---------------------------------------------------------------------------


def _stamp(at: datetime.datetime | None) -> str | None:
    if at is None:
        return None
    return at.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def record(run: Run, summary: Any = None, *, in_api_server: bool | None = None
           ) -> dict[str, Any]:
    """The RunRecord of `run` (summary: a store.TranscriptSummary, its usage and answer)."""
    meta: dict[str, Any] = {"name": run.name, "namespace": run.namespace, "uid": run.uid,
                            "creationTimestamp": _stamp(run.created_at)}
    if run.labels:
        meta["labels"] = dict(run.labels)
    if run.annotations:
        meta["annotations"] = dict(run.annotations)
    spec = {k: v for k, v in (("agent", run.agent), ("trigger", run.trigger),
                              ("userId", run.user_id), ("replayOf", run.replay_of)) if v}
    status: dict[str, Any] = {"phase": PHASE_OF.get(run.status, run.status),
                              "attempts": run.attempts, "toolsExecuted": run.tools_executed}
    for key, value in (("reason", run.reason), ("message", run.message),
                       ("startedAt", _stamp(run.started_at)),
                       ("finishedAt", _stamp(run.finished_at))):
        if value:
            status[key] = value
    if summary is not None:
        from agentrun.transcript import preview, usage_shown

        status["usage"] = usage_shown(summary.usage)
        if summary.answer is not None:
            status["result"] = {"preview": preview(summary.answer),
                                "attempt": summary.answer_attempt}
    if in_api_server is not None:
        status["inAPIServer"] = in_api_server
    return {"apiVersion": TRANSCRIPT_API_VERSION, "kind": RECORD_KIND, "metadata": meta,
            "spec": spec, "status": status}


def as_run(run: Run) -> dict[str, Any]:
    """An AgentRun-shaped view of a record (what a transcript of a deleted run shows)."""
    meta: dict[str, Any] = {"name": run.name, "namespace": run.namespace, "uid": run.uid,
                            "creationTimestamp": _stamp(run.created_at)}
    if run.labels:
        meta["labels"] = dict(run.labels)
    return {"metadata": meta, "spec": {"agent": run.agent},
            "status": {"phase": PHASE_OF.get(run.status, run.status)}}
