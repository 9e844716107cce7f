"""`kubectl agentrun cancel`: stop a run and keep it (Cancelled, CancelRequested)."""

from __future__ import annotations

from agentrun.vocabulary import (
    ANNOTATION_CANCEL,
    ANNOTATION_CANCEL_NOTE,
    RUN_PLURAL,
    Phase,
)
from agentrun_kubectl.cluster import OK, Cluster, Failure


def cancel(cluster: Cluster, run: str, note: str | None) -> int:
    """Cancels `run` in place: the annotation agentrun.dev/cancel (and the note beside it,
    agentrun.dev/cancel-note, which the operator puts in the run's message). The operator
    stops the run and keeps it, Cancelled (CancelRequested), with its tools counted."""
    found = cluster.get(RUN_PLURAL, run)
    if found is None:
        raise Failure(f"AgentRun {run} does not exist in namespace {cluster.namespace}")
    phase = (found.get("status") or {}).get("phase")
    if phase in Phase.TERMINAL:
        print(f"AgentRun {run} is already {phase}; nothing to cancel")
        return OK
    annotations = {ANNOTATION_CANCEL: "true"}
    if note:
        annotations[ANNOTATION_CANCEL_NOTE] = note
    cluster.annotate(RUN_PLURAL, run, annotations)
    print(f"agentrun/{run} annotated {ANNOTATION_CANCEL}=true"
          + (f" ({ANNOTATION_CANCEL_NOTE}: {note})" if note else "")
          + "; the operator stops it and keeps it (Cancelled)")
    return OK

