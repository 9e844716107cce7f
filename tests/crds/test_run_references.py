"""agentrun-run-references (crds/run-references-policy.yaml), exercised as real users.

The operator copies a run's input files out of Secrets and ConfigMaps and creates its pod
(env from Secrets and ConfigMaps, spec.image, spec.serviceAccountName) with its own rights.
The policy makes a run ask for nothing its creator may not have: `get` on each Secret and
ConfigMap it names, `create` on pods when it chooses the image or the ServiceAccount.

Two people, both bound to agentrun-edit: rita was also given, by name, `get` on Secret `s`
and ConfigMap `c`, and `create` on pods; ned was given nothing more.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.crds.kube import (
    PROBE_NAMESPACE,
    PROBE_USER,
    Kubectl,
    apply,
    get,
    refused,
    run_manifest,
    schedule_manifest,
    stored,
)
from tests.harness import delete_namespace

pytestmark = pytest.mark.cluster

POLICY = "agentrun-run-references"
DENIED = f"ValidatingAdmissionPolicy '{POLICY}' with binding '{POLICY}' denied request: "
RITA = "rita"
NED = "ned"
OPERATOR_SA = "system:serviceaccount:agentrun-system:agentrun-operator"


@pytest.fixture(scope="module")
def enforced(policies: Kubectl) -> Kubectl:
    """The control plane once agentrun-run-references refuses what it should.

    A policy is not enforced the moment it is created (see `policies`); probe with a
    server dry-run of a run choosing its image, by a user who may not create pods.
    """
    deadline = time.monotonic() + 120
    while True:
        done = apply(policies, PROBE_NAMESPACE, run_manifest("probe", image="probe:1"),
                     as_user=PROBE_USER, extra=("--dry-run=server",))
        if done.returncode != 0 and f"ValidatingAdmissionPolicy '{POLICY}'" in done.stderr:
            return policies
        assert time.monotonic() < deadline, (
            f"policy {POLICY} still not enforced after 120s: {done.stdout}{done.stderr}")
        time.sleep(0.5)


def _grant(plane: Kubectl, namespace: str, name: str, user: str, verb: str, resource: str,
           *names: str) -> None:
    """A Role with one rule (by resource name when `names` are given), bound to `user`."""
    plane.kubectl("create", "role", name, "-n", namespace, f"--verb={verb}",
                  f"--resource={resource}", *[f"--resource-name={n}" for n in names])
    plane.kubectl("create", "rolebinding", name, "-n", namespace, f"--role={name}",
                  f"--user={user}")


def _may_edit(plane: Kubectl, namespace: str, *subjects: str) -> None:
    """Binds agentrun-edit to `subjects` (kubectl's --user=, --group=, --serviceaccount=)."""
    name = subjects[0].split("=", 1)[1].replace(":", "-") + "-edits"
    plane.kubectl("create", "rolebinding", name, "-n", namespace,
                  "--clusterrole=agentrun-edit", *subjects)


@pytest.fixture
def team(enforced: Kubectl, namespace: str) -> str:
    """`namespace` with rita's and ned's rights (see the module docstring)."""
    _may_edit(enforced, namespace, f"--user={RITA}", f"--user={NED}")
    _grant(enforced, namespace, "read-s", RITA, "get", "secrets", "s")
    _grant(enforced, namespace, "read-c", RITA, "get", "configmaps", "c")
    _grant(enforced, namespace, "make-pods", RITA, "create", "pods")
    return namespace


def _file_from(source: str, name: str) -> dict[str, Any]:
    return {"input": {"files": [{"name": "invoice.pdf", source: {"name": name, "key": "k"}}]}}


def _env_from(source: str, name: str) -> dict[str, Any]:
    return {"env": [{"name": "API_KEY", "valueFrom": {source: {"name": name, "key": "k"}}}]}


REFERENCES = [
    pytest.param(_file_from("secretKeyRef", "s"),
                 "AgentRun input file 'invoice.pdf' names Secret s: ned may not get secrets/s in"
                 " namespace {ns}; only principals who may read a Secret may have a run copy it",
                 id="input-file-from-secret"),
    pytest.param(_file_from("configMapKeyRef", "c"),
                 "AgentRun input file 'invoice.pdf' names ConfigMap c: ned may not get"
                 " configmaps/c in namespace {ns}; only principals who may read a ConfigMap may"
                 " have a run copy it",
                 id="input-file-from-configmap"),
    pytest.param(_env_from("secretKeyRef", "s"),
                 "AgentRun env var API_KEY names Secret s: ned may not get secrets/s in namespace"
                 " {ns}; only principals who may read a Secret may have a run's pod read it",
                 id="env-from-secret"),
    pytest.param(_env_from("configMapKeyRef", "c"),
                 "AgentRun env var API_KEY names ConfigMap c: ned may not get configmaps/c in"
                 " namespace {ns}; only principals who may read a ConfigMap may have a run's pod"
                 " read it",
                 id="env-from-configmap"),
]


def _run(name: str, **spec: Any) -> dict[str, Any]:
    manifest = run_manifest(name)
    for key, value in spec.items():
        if key == "input":
            manifest["spec"]["input"] = {**manifest["spec"]["input"], **value}
        else:
            manifest["spec"][key] = value
    return manifest


@pytest.mark.parametrize(("spec", "message"), REFERENCES)
def test_a_run_may_name_only_what_its_creator_may_read(
        enforced: Kubectl, team: str, spec: dict[str, Any], message: str) -> None:
    done = apply(enforced, team, _run("triage-42", **spec), as_user=NED)

    assert DENIED + message.format(ns=team) in refused(done)
    assert get(enforced, team, "agentrun/triage-42") is None
    apply(enforced, team, _run("triage-42", **spec), as_user=RITA, check=True)
    assert stored(enforced, team, "agentrun/triage-42")["spec"]["input"]["text"]


@pytest.mark.parametrize(("field", "value", "message"), [
    ("image", "registry.example.com/agents/runner:2",
     "AgentRun sets spec.image: ned may not create pods in namespace {ns}; only principals who"
     " may create pods may choose the image a run runs"),
    ("serviceAccountName", "billing-bot",
     "AgentRun sets spec.serviceAccountName: ned may not create pods in namespace {ns}; only"
     " principals who may create pods may choose the ServiceAccount a run's pod runs as"),
])
def test_choosing_the_image_or_service_account_needs_create_pods(
        enforced: Kubectl, team: str, field: str, value: str, message: str) -> None:
    done = apply(enforced, team, _run("triage-42", **{field: value}), as_user=NED)

    assert DENIED + message.format(ns=team) in refused(done)
    apply(enforced, team, _run("triage-42", **{field: value}), as_user=RITA, check=True)
    assert stored(enforced, team, "agentrun/triage-42")["spec"][field] == value


@pytest.mark.parametrize("user", [RITA, NED])
def test_a_run_naming_nothing_is_anyones_to_create(
        enforced: Kubectl, team: str, user: str) -> None:
    apply(enforced, team, _run("plain", model="gemini-2.5-flash",
                               env=[{"name": "TONE", "value": "friendly"},
                                    {"name": "POD", "valueFrom": {"fieldRef": {
                                        "fieldPath": "metadata.name"}}}]),
          as_user=user, check=True)


def test_the_refusal_names_the_first_reference_its_creator_may_not_read(
        enforced: Kubectl, team: str) -> None:
    """rita may read s and c but not t: the run is refused for t alone."""
    spec = {"input": {"files": [
        {"name": "a.txt", "secretKeyRef": {"name": "s", "key": "a"}},
        {"name": "b.txt", "configMapKeyRef": {"name": "c", "key": "b"}},
    ]}, "env": [
        {"name": "A", "valueFrom": {"secretKeyRef": {"name": "s", "key": "a"}}},
        {"name": "T", "valueFrom": {"secretKeyRef": {"name": "t", "key": "t"}}},
    ]}
    message = refused(apply(enforced, team, _run("mixed", **spec), as_user=RITA))

    assert DENIED + (
        f"AgentRun env var T names Secret t: rita may not get secrets/t in namespace {team};"
        " only principals who may read a Secret may have a run's pod read it") in message


def test_a_right_to_every_secret_of_the_namespace_covers_them_all(
        enforced: Kubectl, team: str) -> None:
    """Who may get every Secret (the built-in edit and admin roles) needs no check by name,
    however many the run names."""
    _may_edit(enforced, team, "--user=sam")
    _grant(enforced, team, "read-all", "sam", "get", "secrets")
    env = [{"name": f"K{i}", "valueFrom": {"secretKeyRef": {"name": f"s{i}", "key": "k"}}}
           for i in range(40)]

    apply(enforced, team, _run("many", env=env), as_user="sam", check=True)


# -- the cost limits of CEL ------------------------------------------------------------------

def _spread(secrets: list[str], configmaps: list[str]) -> dict[str, Any]:
    """The largest spec the CRD allows (16 files, 64 env entries), naming these in turn."""
    sources = [("secretKeyRef", n) for n in secrets] + [("configMapKeyRef", n) for n in configmaps]

    def ref(i: int) -> dict[str, Any]:
        source, name = sources[i % len(sources)]
        return {source: {"name": name, "key": "k"}}

    return {"input": {"files": [{"name": f"f{i}", **ref(i)} for i in range(16)]},
            "env": [{"name": f"E{i}", "valueFrom": ref(i)} for i in range(64)]}


def test_sixteen_different_references_checked_by_name_fit_the_budget(
        enforced: Kubectl, team: str) -> None:
    """The worst case the policy checks one by one: 16 Secrets and ConfigMaps readable by
    name only, named 80 times, and the image and ServiceAccount chosen too."""
    secrets = [f"s{i}" for i in range(8)]
    configmaps = [f"c{i}" for i in range(8)]
    _grant(enforced, team, "read-eight-s", "tess", "get", "secrets", *secrets)
    _grant(enforced, team, "read-eight-c", "tess", "get", "configmaps", *configmaps)
    _grant(enforced, team, "tess-pods", "tess", "create", "pods")
    _may_edit(enforced, team, "--user=tess")
    spec = {**_spread(secrets, configmaps), "image": "runner:2", "serviceAccountName": "bot"}

    apply(enforced, team, _run("widest", **spec), as_user="tess", check=True)

    # The last one checked is checked, not waved through: without it, the same run is refused.
    enforced.kubectl("delete", "rolebinding", "read-eight-c", "-n", team)
    _grant(enforced, team, "read-seven-c", "tess", "get", "configmaps", *configmaps[:7])
    message = refused(apply(enforced, team, _run("widest-2", **spec), as_user="tess"))
    assert "names ConfigMap c7: tess may not get configmaps/c7" in message


def test_more_than_sixteen_checked_by_name_are_refused_with_what_to_do(
        enforced: Kubectl, team: str) -> None:
    secrets = [f"s{i}" for i in range(17)]
    _grant(enforced, team, "read-17", "tess", "get", "secrets", *secrets)
    _may_edit(enforced, team, "--user=tess")

    message = refused(apply(enforced, team, _run("wide", **_spread(secrets, [])), as_user="tess"))

    assert DENIED + (
        "AgentRun names 17 different Secrets and ConfigMaps and admission checks at most 16 of"
        f" them by name: tess may not get every Secret and ConfigMap in namespace {team}, so"
        " secrets/s16 cannot be checked; name at most 16 different ones, or ask for get on all"
        " of that kind in the namespace") in message


# -- who is exempt, and where a right holds ----------------------------------------------------

def test_the_operator_copies_an_original_it_may_not_have_checked(
        enforced: Kubectl, team: str) -> None:
    """Replay runs copy an original's spec; the operator is exempt as for spec.replayOf."""
    _may_edit(enforced, team, "--group=agentrun:operators",
              "--serviceaccount=agentrun-system:agentrun-operator")
    spec = {**_file_from("secretKeyRef", "s"), "image": "runner:2"}

    apply(enforced, team, _run("by-sa", **spec), as_user=OPERATOR_SA, check=True)
    apply(enforced, team, _run("by-group", **spec), as_user="dev-operator",
          as_groups=("agentrun:operators",), check=True)


@pytest.fixture
def elsewhere(enforced: Kubectl, team: str) -> Iterator[str]:
    """A second namespace where rita may edit runs and create pods, but not read `s`."""
    name = f"{team}-b"
    enforced.kubectl("create", "namespace", name)
    _may_edit(enforced, name, f"--user={RITA}")
    _grant(enforced, name, "make-pods", RITA, "create", "pods")
    try:
        yield name
    finally:
        delete_namespace(enforced, name)


def test_a_right_to_read_a_secret_holds_in_its_namespace_only(
        enforced: Kubectl, team: str, elsewhere: str) -> None:
    done = apply(enforced, elsewhere, _run("triage-42", **_file_from("secretKeyRef", "s")),
                 as_user=RITA)

    assert DENIED + (
        f"AgentRun input file 'invoice.pdf' names Secret s: rita may not get secrets/s in"
        f" namespace {elsewhere}; only principals who may read a Secret may have a run copy"
        " it") in refused(done)
    # The same run in the namespace where the Role is.
    apply(enforced, team, _run("triage-42", **_file_from("secretKeyRef", "s")), as_user=RITA,
          check=True)


# -- a schedule's runTemplate: checked for the schedule's creator ----------------------------
#
# The operator creates a schedule's runs (and is exempt), so the check is made when the
# schedule is created, or its template changed, as its creator.

SCHEDULE_DENIED = DENIED + "AgentRunSchedule runTemplate "


def _schedule(name: str, **spec: Any) -> dict[str, Any]:
    manifest = schedule_manifest(name)
    template = manifest["spec"]["runTemplate"]["spec"]
    for key, value in spec.items():
        if key == "input":
            template["input"] = {**template["input"], **value}
        else:
            template[key] = value
    return manifest


@pytest.mark.parametrize(("spec", "message"), REFERENCES)
def test_a_schedule_may_name_only_what_its_creator_may_read(
        enforced: Kubectl, team: str, spec: dict[str, Any], message: str) -> None:
    done = apply(enforced, team, _schedule("nightly", **spec), as_user=NED)

    said = message.format(ns=team).removeprefix("AgentRun ")
    assert SCHEDULE_DENIED + said in refused(done)
    assert get(enforced, team, "agentrunschedule/nightly") is None
    apply(enforced, team, _schedule("nightly", **spec), as_user=RITA, check=True)


def test_a_schedule_choosing_the_image_needs_create_pods(enforced: Kubectl, team: str) -> None:
    done = apply(enforced, team, _schedule("nightly", image="runner:2"), as_user=NED)
    assert DENIED + (
        f"AgentRunSchedule sets spec.runTemplate.spec.image: ned may not create pods in"
        f" namespace {team}; only principals who may create pods may choose the image a run"
        " runs") in refused(done)
    done = apply(enforced, team, _schedule("nightly", serviceAccountName="bot"), as_user=NED)
    assert "AgentRunSchedule sets spec.runTemplate.spec.serviceAccountName: ned may not" in \
        refused(done)


def test_a_change_of_the_template_is_checked_for_whoever_makes_it(
        enforced: Kubectl, team: str) -> None:
    """rita's schedule names Secret s: ned (agentrun-edit, nothing more) may suspend it,
    which leaves the template as it was, and may not change what the template names."""
    apply(enforced, team, _schedule("nightly", **_file_from("secretKeyRef", "s")),
          as_user=RITA, check=True)
    enforced.kubectl("patch", "agentrunschedule", "nightly", "-n", team, "--type=merge",
                     "-p", '{"spec": {"suspend": true}}', as_user=NED)
    assert stored(enforced, team, "agentrunschedule/nightly")["spec"]["suspend"] is True
    done = enforced.kubectl(
        "patch", "agentrunschedule", "nightly", "-n", team, "--type=merge", "-p",
        '{"spec": {"runTemplate": {"spec": {"input": {"text": "the weekend queue"}}}}}',
        as_user=NED, check=False)
    assert SCHEDULE_DENIED + (
        f"input file 'invoice.pdf' names Secret s: ned may not get secrets/s in namespace "
        f"{team}") in refused(done)


def test_the_widest_template_fits_the_budget(enforced: Kubectl, team: str) -> None:
    secrets = [f"s{i}" for i in range(8)]
    configmaps = [f"c{i}" for i in range(8)]
    _grant(enforced, team, "read-eight-s", "tess", "get", "secrets", *secrets)
    _grant(enforced, team, "read-eight-c", "tess", "get", "configmaps", *configmaps)
    _grant(enforced, team, "tess-pods", "tess", "create", "pods")
    _may_edit(enforced, team, "--user=tess")
    spec = {**_spread(secrets, configmaps), "image": "runner:2", "serviceAccountName": "bot"}

    apply(enforced, team, _schedule("widest", **spec), as_user="tess", check=True)
