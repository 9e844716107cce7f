"""The admission policies in crds/, exercised as real users through impersonation.

- agentrun-force-replay: only principals allowed verb `force` on agentrunreplays (ClusterRole
  agentrun-replay-forcer) may add, change or remove agentrun.dev/force-replay; every other
  annotation (kopf's progress included), label and the note stay free for all writers.
- agentrun-replay-of: only the operator (its ServiceAccount, or a member of the group
  agentrun:operators) may create an AgentRun with spec.replayOf.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

from agentrun.vocabulary import ANNOTATION_FORCE_REPLAY, FORCER_CLUSTER_ROLE
from tests.crds.kube import Kubectl, apply, get, refused, replay_manifest, run_manifest, stored
from tests.harness import delete_namespace

pytestmark = pytest.mark.cluster

FORCE_REFUSAL = (
    "Only principals allowed verb 'force' on agentrunreplays may set agentrun.dev/force-replay;"
    " ask a cluster admin to bind ClusterRole agentrun-replay-forcer"
)
OPERATOR_SA = "system:serviceaccount:agentrun-system:agentrun-operator"
OPERATORS_GROUP = "agentrun:operators"


@dataclass(frozen=True)
class Person:
    """Someone the tests impersonate: `kubectl --as=user --as-group=...`."""

    user: str
    groups: tuple[str, ...] = ()

    def kubectl(self, plane: Kubectl, *args: str) -> subprocess.CompletedProcess[str]:
        return plane.kubectl(*args, as_user=self.user, as_groups=self.groups, check=False)


# May create, update and patch agentruns and agentrunreplays (ClusterRole agentrun-edit).
ALICE = Person("alice")
# The same, and bound to agentrun-replay-forcer in the namespace.
BOB = Person("bob")
# Gets agentrun-replay-forcer through her group.
CAROL = Person("carol", ("sre",))
OPERATOR = Person(OPERATOR_SA)
LOCAL_OPERATOR = Person("dev-operator", (OPERATORS_GROUP,))


def _bind(plane: Kubectl, namespace: str, name: str, role: str, *subjects: str) -> None:
    plane.kubectl(
        "create", "rolebinding", name, "-n", namespace, f"--clusterrole={role}", *subjects
    )


@pytest.fixture
def people(policies: Kubectl, namespace: str) -> str:
    """Binds the roles the people above have in `namespace`; returns the namespace."""
    _bind(
        policies,
        namespace,
        "editors",
        "agentrun-edit",
        "--user=alice",
        "--user=bob",
        "--group=sre",
        f"--serviceaccount={OPERATOR_SA.rsplit(':', 2)[1]}:agentrun-operator",
        f"--group={OPERATORS_GROUP}",
    )
    _bind(policies, namespace, "forcers", FORCER_CLUSTER_ROLE, "--user=bob", "--group=sre")
    return namespace


# Written on every AgentRunReplay at admission (replay-requester-policy.yaml): who asked.
REQUESTER = ("agentrun.dev/requested-by", "agentrun.dev/requested-by-groups")


def _annotations(plane: Kubectl, namespace: str, resource: str) -> dict[str, str]:
    """A replay's annotations but the requester's, which admission writes on each."""
    annotations: dict[str, str] = stored(plane, namespace, resource)["metadata"].get(
        "annotations", {}
    )
    return {k: v for k, v in annotations.items() if k not in REQUESTER}


# -- the force annotation ------------------------------------------------------------------


def test_user_without_force_cannot_create_a_forced_replay(crds: Kubectl, people: str) -> None:
    done = apply(crds, people, replay_manifest("again", force="true"), as_user=ALICE.user)

    message = refused(done)
    assert FORCE_REFUSAL in message
    assert f"(alice may not add it in namespace {people})" in message
    assert get(crds, people, "agentrunreplay/again") is None
    # The refusal is about the annotation only: the same replay without it is welcome.
    apply(crds, people, replay_manifest("again"), as_user=ALICE.user, check=True)


@pytest.mark.parametrize(
    ("verb", "first", "annotate"),
    [
        ("add", None, f"{ANNOTATION_FORCE_REPLAY}=true"),
        ("change", "true", f"{ANNOTATION_FORCE_REPLAY}=yes"),
        ("remove", "true", f"{ANNOTATION_FORCE_REPLAY}-"),
    ],
)
def test_user_without_force_cannot_add_change_or_remove_it(
    crds: Kubectl, people: str, verb: str, first: str | None, annotate: str
) -> None:
    apply(crds, people, replay_manifest("again", force=first), as_user=BOB.user, check=True)
    before = _annotations(crds, people, "agentrunreplay/again")

    done = ALICE.kubectl(
        crds, "annotate", "--overwrite", "-n", people, "agentrunreplay/again", annotate
    )

    message = refused(done)
    assert FORCE_REFUSAL in message
    assert f"(alice may not {verb} it in namespace {people})" in message
    assert _annotations(crds, people, "agentrunreplay/again") == before


@pytest.mark.parametrize("forcer", [BOB, CAROL], ids=["bound-user", "bound-group"])
def test_forcer_can_create_add_change_and_remove_it(
    crds: Kubectl, people: str, forcer: Person
) -> None:
    apply(
        crds,
        people,
        replay_manifest("forced", force="true"),
        as_user=forcer.user,
        as_groups=forcer.groups,
        check=True,
    )
    assert _annotations(crds, people, "agentrunreplay/forced") == {ANNOTATION_FORCE_REPLAY: "true"}

    apply(crds, people, replay_manifest("later"), as_user=ALICE.user, check=True)
    steps = [
        (f"{ANNOTATION_FORCE_REPLAY}=true", "true"),  # add
        (f"{ANNOTATION_FORCE_REPLAY}=yes", "yes"),  # change
        (f"{ANNOTATION_FORCE_REPLAY}-", None),  # remove
    ]
    for annotate, expected in steps:
        done = forcer.kubectl(
            crds, "annotate", "--overwrite", "-n", people, "agentrunreplay/later", annotate
        )
        assert done.returncode == 0, done.stderr
        assert (
            _annotations(crds, people, "agentrunreplay/later").get(ANNOTATION_FORCE_REPLAY)
            == expected
        )


@pytest.mark.parametrize("writer", [ALICE, BOB], ids=["without-force", "with-force"])
def test_other_annotations_labels_and_the_note_stay_free(
    crds: Kubectl, people: str, writer: Person
) -> None:
    apply(
        crds,
        people,
        replay_manifest("forced", force="true", note="first"),
        as_user=BOB.user,
        check=True,
    )

    for args in [
        # kopf keeps its progress in annotations like these.
        (
            "annotate",
            "agentrunreplay/forced",
            "kopf.zalando.org/last-handled-configuration={}",
            "kopf.zalando.org/touch-dummy=2026-01-01T00:00:00Z",
        ),
        ("annotate", "--overwrite", "agentrunreplay/forced", "team=support"),
        ("annotate", "agentrunreplay/forced", "team-"),
        ("label", "agentrunreplay/forced", "ticket=42"),
        ("patch", "agentrunreplay/forced", "--type=merge", "-p", '{"spec":{"note":"second"}}'),
    ]:
        done = writer.kubectl(crds, *args, "-n", people)
        assert done.returncode == 0, done.stderr

    replay = stored(crds, people, "agentrunreplay/forced")
    assert replay["metadata"]["annotations"][ANNOTATION_FORCE_REPLAY] == "true"
    assert "kopf.zalando.org/touch-dummy" in replay["metadata"]["annotations"]
    assert replay["metadata"]["labels"] == {"ticket": "42"}
    assert replay["spec"]["note"] == "second"


def test_reapplying_a_forced_manifest_unchanged_is_allowed(crds: Kubectl, people: str) -> None:
    """GitOps: a pipeline without `force` re-applies a manifest a forcer already applied."""
    apply(crds, people, replay_manifest("forced", force="true"), as_user=BOB.user, check=True)
    again = replay_manifest("forced", force="true", note="re-applied by the pipeline")
    apply(crds, people, again, as_user=ALICE.user, check=True)
    assert stored(crds, people, "agentrunreplay/forced")["spec"]["note"] == (
        "re-applied by the pipeline"
    )


@pytest.fixture
def other_namespace(crds: Kubectl, people: str) -> Iterator[str]:
    """A second namespace where bob may edit but was not given `force`."""
    name = f"{people}-other"
    crds.kubectl("create", "namespace", name)
    _bind(crds, name, "editors", "agentrun-edit", "--user=bob")
    try:
        yield name
    finally:
        delete_namespace(crds, name)


def test_force_is_granted_per_namespace(crds: Kubectl, other_namespace: str) -> None:
    done = apply(crds, other_namespace, replay_manifest("again", force="true"), as_user=BOB.user)

    message = refused(done)
    assert f"(bob may not add it in namespace {other_namespace})" in message


# -- spec.replayOf -------------------------------------------------------------------------


@pytest.mark.parametrize("person", [ALICE, BOB], ids=["alice", "bob-the-forcer"])
def test_user_cannot_create_a_replay_run(crds: Kubectl, people: str, person: Person) -> None:
    done = apply(
        crds, people, run_manifest("triage-42-replay", replayOf="triage-42"), as_user=person.user
    )

    message = refused(done)
    assert (
        "spec.replayOf is set only by the agentrun operator"
        f" ({person.user} is not it); to run triage-42 again, create an AgentRunReplay"
        " with spec.runName: triage-42"
    ) in message
    assert get(crds, people, "agentrun/triage-42-replay") is None
    # The same run without replayOf is an ordinary run anyone with `create` may start.
    apply(crds, people, run_manifest("triage-42-replay"), as_user=person.user, check=True)


@pytest.mark.parametrize(
    "operator", [OPERATOR, LOCAL_OPERATOR], ids=["service-account", "agentrun-operators-group"]
)
def test_operator_creates_replay_runs_and_users_may_still_touch_them(
    crds: Kubectl, people: str, operator: Person
) -> None:
    manifest = run_manifest("triage-42-replay", replayOf="triage-42")
    manifest["metadata"]["labels"] = {"agentrun.dev/replay-of": "triage-42"}
    apply(crds, people, manifest, as_user=operator.user, as_groups=operator.groups, check=True)
    assert stored(crds, people, "agentrun/triage-42-replay")["spec"]["replayOf"] == "triage-42"

    # Metadata writes by users leave replayOf as it was, so they pass.
    for args in [
        ("annotate", "agentrun/triage-42-replay", "seen-by=alice"),
        ("label", "agentrun/triage-42-replay", "ticket=42"),
    ]:
        done = ALICE.kubectl(crds, *args, "-n", people)
        assert done.returncode == 0, done.stderr
    # No operator runs here to release the run's finalizer: the deletion is accepted, and
    # the run waits for it.
    done = ALICE.kubectl(crds, "delete", "agentrun/triage-42-replay", "-n", people,
                         "--wait=false")
    assert done.returncode == 0, done.stderr
    assert stored(crds, people, "agentrun/triage-42-replay")["metadata"]["deletionTimestamp"]


# -- the run's finalizer (run-finalizer-policy.yaml) ----------------------------------------


@pytest.mark.parametrize(
    "creator", [ALICE, OPERATOR, LOCAL_OPERATOR], ids=["user", "operator", "operators-group"]
)
def test_every_run_is_created_with_its_finalizer_and_keeps_its_own(
    crds: Kubectl, people: str, creator: Person
) -> None:
    apply(crds, people, run_manifest("plain"), as_user=creator.user,
          as_groups=creator.groups, check=True)
    assert stored(crds, people, "agentrun/plain")["metadata"]["finalizers"] == [
        "agentrun.dev/finalizer"]
    # Applied again, server-side by the same field manager, as GitOps tools do: it stays.
    apply(crds, people, run_manifest("plain"), as_user=creator.user,
          as_groups=creator.groups, check=True)
    assert stored(crds, people, "agentrun/plain")["metadata"]["finalizers"] == [
        "agentrun.dev/finalizer"]

    manifest = run_manifest("with-its-own")
    manifest["metadata"]["finalizers"] = ["example.com/keep"]
    apply(crds, people, manifest, as_user=creator.user, as_groups=creator.groups, check=True)
    assert sorted(stored(crds, people, "agentrun/with-its-own")["metadata"]["finalizers"]) == [
        "agentrun.dev/finalizer", "example.com/keep"]
    # Only runs: a replay is not held.
    apply(crds, people, replay_manifest("again", "plain"), as_user=ALICE.user, check=True)
    assert "finalizers" not in stored(crds, people, "agentrunreplay/again")["metadata"]


# -- the built-in roles ---------------------------------------------------------------------


def _can(plane: Kubectl, namespace: str, user: str, verb: str, resource: str) -> bool:
    done = plane.kubectl(
        "auth",
        "can-i",
        verb,
        f"{resource}.agentrun.dev",
        "-n",
        namespace,
        f"--as={user}",
        check=False,
    )
    return done.stdout.strip() == "yes"


def test_namespace_editors_and_viewers_get_the_kinds_but_not_force(
    crds: Kubectl, people: str
) -> None:
    """agentrun-edit/-view aggregate into the built-in edit/view roles; force never does."""
    _bind(crds, people, "dana-edit", "edit", "--user=dana")
    _bind(crds, people, "erin-view", "view", "--user=erin")
    # The aggregation controller (kube-controller-manager) copies the rules over shortly.
    deadline = time.monotonic() + 60
    while not (
        _can(crds, people, "dana", "create", "agentruns")
        and _can(crds, people, "erin", "list", "agentrunreplays")
    ):
        assert time.monotonic() < deadline, "agentrun-edit/-view were not aggregated in 60s"
        time.sleep(0.5)

    assert _can(crds, people, "dana", "create", "agentrunreplays")
    assert not _can(crds, people, "dana", "force", "agentrunreplays")
    assert not _can(crds, people, "erin", "create", "agentruns")
    assert _can(crds, people, "bob", "force", "agentrunreplays")

    apply(crds, people, replay_manifest("again"), as_user="dana", check=True)
    message = refused(apply(crds, people, replay_manifest("forced", force="true"), as_user="dana"))
    assert f"{FORCE_REFUSAL} (dana may not add it in namespace {people})" in message
