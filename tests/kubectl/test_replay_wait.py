"""`kubectl agentrun replay --force` on a refused replay waits for the decision the force
brought, not the refusal it found: decidedAt has whole seconds (and another machine's
clock), so a refusal made in the same second as the force cannot be told from a new one
by its time."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from agentrun_kubectl import replay as plugin
from agentrun_kubectl.cluster import OK, REFUSED

from agentrun.vocabulary import ANNOTATION_FORCE_REPLAY, REPLAY_PLURAL, RUN_PLURAL


def _stamp(at: datetime) -> str:
    return at.strftime("%Y-%m-%dT%H:%M:%SZ")


# The operator's clock two seconds ahead of this machine's.
SOON = _stamp(datetime.now(UTC) + timedelta(seconds=2))
REFUSAL = {"phase": "Refused", "reason": "ToolsExecuted", "decidedAt": SOON,
           "message": "This run already called send_email before failing."}


class Replays:
    """A cluster whose replay `again` shows `statuses` one read after another (the last one
    from then on)."""

    namespace = "shop"

    def __init__(self, statuses: list[dict[str, Any]], annotations: dict[str, str]) -> None:
        self.statuses = statuses
        self.annotations = dict(annotations)
        self.reads = 0

    def _replay(self, status: dict[str, Any]) -> dict[str, Any]:
        return {"metadata": {"name": "again", "namespace": self.namespace,
                             "annotations": dict(self.annotations)},
                "spec": {"runName": "plugged"}, "status": status}

    def get(self, plural: str, name: str) -> dict[str, Any] | None:
        if plural == RUN_PLURAL:
            return {"metadata": {"name": name}}
        assert plural == REPLAY_PLURAL and name == "again"
        status = self.statuses[min(self.reads, len(self.statuses) - 1)]
        self.reads += 1
        return self._replay(status)

    def annotate_replay(self, name: str, annotations: dict[str, str]) -> None:
        self.annotations.update(annotations)


def test_a_forced_refusal_waits_past_the_refusal_it_found() -> None:
    approved = {"phase": "Approved", "reason": "Forced", "decidedAt": SOON,
                "message": "Forced by an admin."}
    # Read for the look before, then twice as it was, then approved.
    cluster = Replays([REFUSAL, REFUSAL, REFUSAL, approved], {})
    code = plugin.replay(cluster, "plugged", force=True, note=None,  # type: ignore[arg-type]
                         name="again", timeout=30)
    assert code == OK and cluster.reads == 4
    assert cluster.annotations == {ANNOTATION_FORCE_REPLAY: "true"}


def test_a_refusal_the_force_did_not_change_is_told_once_it_is_looked_at_again() -> None:
    examined = {**REFUSAL, "message": REFUSAL["message"] + " The force annotation was "
                "examined: it does not change this refusal."}
    cluster = Replays([REFUSAL, REFUSAL, examined], {})
    code = plugin.replay(cluster, "plugged", force=True, note=None,  # type: ignore[arg-type]
                         name="again", timeout=30)
    assert code == REFUSED and cluster.reads == 3


def test_forcing_again_what_was_forced_tells_its_decision_at_once() -> None:
    examined = {**REFUSAL, "message": "Refused, the annotation examined."}
    cluster = Replays([examined], {ANNOTATION_FORCE_REPLAY: "true"})
    code = plugin.replay(cluster, "plugged", force=True, note=None,  # type: ignore[arg-type]
                         name="again", timeout=30)
    assert code == REFUSED and cluster.reads == 2
