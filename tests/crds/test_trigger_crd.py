"""AgentRunTrigger on the real API server: what its schema and CEL refuse (with what they
say), the defaults and columns, and the admission policies as two real users see them.

Two users of one namespace, both bound to agentrun-edit: tess was also given, by name, `get`
on the trigger's Secret; ned was given nothing more. A third, bea, edits another namespace
only. A trigger's template and its auth Secret are checked for whoever writes them, as a
schedule's template is (run-references-policy.yaml): its runs are the receiver's, so
nothing is checked when they are created.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from agentrun.vocabulary import ANNOTATION_TEMPLATE_BY
from tests.cluster_fixtures import fresh_namespace
from tests.crds.kube import Kubectl, apply, refused, run_manifest, stored, table
from tests.triggers import SECRET, trigger_manifest

pytestmark = pytest.mark.cluster

POLICY = "agentrun-run-references"
TESS, NED, BEA = "tess", "ned", "bea"


def with_template(**spec: Any) -> dict[str, Any]:
    manifest = trigger_manifest()
    manifest["spec"]["runTemplate"]["spec"].update(spec)
    return manifest


def _files(*names: str) -> dict[str, Any]:
    return with_template(input={"text": "t", "files": [
        {"name": n, "configMapKeyRef": {"name": "c", "key": n}} for n in names]})


def _labelled(labels: dict[str, str]) -> dict[str, Any]:
    manifest = trigger_manifest()
    manifest["spec"]["runTemplate"]["metadata"] = {"labels": labels}
    return manifest


HMAC = {"secretKeyRef": {"name": SECRET, "key": "secret"}}

REFUSED = [
    pytest.param(trigger_manifest("n" * 53), "AgentRunTrigger names must be at most 52 "
                 "characters: each event's run is named <trigger>-<first 10 hex digits",
                 id="name-longer-than-52"),
    pytest.param(trigger_manifest(auth={"hmac": HMAC, "bearer": HMAC}),
                 "spec.auth needs exactly one of hmac (a signature of the body) or bearer",
                 id="two-auths"),
    pytest.param(trigger_manifest(auth={}), "spec.auth needs exactly one of hmac",
                 id="no-auth"),
    pytest.param(trigger_manifest(maxBodyBytes=1048577),
                 "spec.maxBodyBytes: Invalid value: 1048577: spec.maxBodyBytes in body should "
                 "be less than or equal to 1048576", id="body-over-1-mib"),
    pytest.param(trigger_manifest(maxRunsPerMinute=0), "spec.maxRunsPerMinute: Invalid value",
                 id="no-runs-per-minute"),
    pytest.param(trigger_manifest(identity="id"), 'spec.identity must be "cloudevents", '
                 "{header: NAME} with an HTTP header name, or {jsonPointer: /PATH}",
                 id="identity-unknown-word"),
    pytest.param(trigger_manifest(identity={"header": "X Delivery"}),
                 'spec.identity must be "cloudevents"', id="identity-not-a-header-name"),
    pytest.param(trigger_manifest(identity={"jsonPointer": "message/id"}),
                 'spec.identity must be "cloudevents"', id="identity-not-a-pointer"),
    pytest.param(trigger_manifest(identity={"header": "X-Id", "jsonPointer": "/id"}),
                 'spec.identity must be "cloudevents"', id="identity-two-forms"),
    pytest.param(trigger_manifest(auth={"hmac": {**HMAC, "header": "X Sig"}}),
                 "spec.auth.hmac.header must be an HTTP header name", id="hmac-header"),
    # The AgentRun spec's own rules, on the template.
    pytest.param(with_template(agent="Support_Agent"), "spec.agent must be a non-empty name "
                 "of lower-case letters", id="template-agent-not-a-name"),
    # The template's own.
    pytest.param(with_template(replayOf="triage-42"), "spec.runTemplate.spec.replayOf is set "
                 "only by the operator, on a replay run", id="template-replay-of"),
    pytest.param(with_template(trigger="manual"), "spec.runTemplate.spec.trigger is event "
                 "for every run a trigger starts; leave it out", id="template-trigger"),
    pytest.param(_files("event.json"), "spec.runTemplate.spec.input.files may name at most 15 "
                 "files, none of them event.json", id="template-event-json"),
    pytest.param(_files(*(f"f{i}" for i in range(16))), "may name at most 15 files",
                 id="template-16-files"),
    pytest.param(_labelled({"agentrun.dev/trigger": "other"}),
                 "labels under agentrun.dev/ are agentrun's", id="template-our-labels"),
]


@pytest.fixture(scope="module")
def enforced(crds: Kubectl) -> Kubectl:
    """The control plane once agentrun-trigger-identity refuses what it should: a policy
    matching a new kind is enforced a little after it is created."""
    deadline = time.monotonic() + 120
    while True:
        done = apply(crds, "default", trigger_manifest(identity="id"),
                     extra=("--dry-run=server",))
        if done.returncode != 0 and "agentrun-trigger-identity" in done.stderr:
            return crds
        assert time.monotonic() < deadline, f"identity policy not enforced: {done.stdout}"
        time.sleep(0.5)


@pytest.mark.parametrize(("manifest", "message"), REFUSED)
def test_admission_refuses_with_what_is_wrong(enforced: Kubectl, solo_namespace: str,
                                              manifest: dict[str, Any], message: str) -> None:
    assert message in refused(apply(enforced, solo_namespace, manifest))


@pytest.mark.parametrize("identity", ["cloudevents", {"header": "X-GitHub-Delivery"},
                                      {"jsonPointer": "/message/id"}, {"jsonPointer": "/"}])
def test_every_identity_form_is_accepted_as_written(crds: Kubectl, solo_namespace: str,
                                                    identity: Any) -> None:
    apply(crds, solo_namespace, trigger_manifest(identity=identity), check=True)
    assert stored(crds, solo_namespace, "art/new-ticket")["spec"]["identity"] == identity


def test_the_defaults_and_the_columns(crds: Kubectl, solo_namespace: str) -> None:
    apply(crds, solo_namespace, trigger_manifest(auth={"hmac": HMAC}), check=True)
    spec = stored(crds, solo_namespace, "agentruntrigger/new-ticket")["spec"]
    assert (spec["maxBodyBytes"], spec["maxRunsPerMinute"], spec["dedupeWindowSeconds"],
            spec["suspend"]) == (262144, 60, 259200, False)
    assert spec["auth"]["hmac"]["header"] == "X-Signature-256"
    # A template takes the AgentRun spec's defaults, except trigger (event, always).
    assert "trigger" not in spec["runTemplate"]["spec"]
    [row] = table(crds, "art", "-n", solo_namespace)
    assert list(row) == ["NAME", "READY", "SUSPEND", "RECEIVED", "DUPLICATES", "LAST-EVENT",
                         "AGE"]
    assert (row["NAME"], row["SUSPEND"]) == ("new-ticket", "false")
    [wide] = table(crds, "agentruntriggers", "-n", solo_namespace, "-o", "wide")
    assert "URL" in wide and "REASON" in wide


def test_a_run_may_say_an_event_started_it(crds: Kubectl, solo_namespace: str) -> None:
    apply(crds, solo_namespace, run_manifest("from-event", trigger="event"), check=True)
    assert stored(crds, solo_namespace, "agentrun/from-event")["spec"]["trigger"] == "event"


def test_the_template_may_change(crds: Kubectl, solo_namespace: str) -> None:
    apply(crds, solo_namespace, trigger_manifest(), check=True)
    changed = copy.deepcopy(trigger_manifest(suspend=True))
    changed["spec"]["runTemplate"]["spec"]["input"]["text"] = "Triage it twice"
    apply(crds, solo_namespace, changed, check=True)
    spec = stored(crds, solo_namespace, "agentruntrigger/new-ticket")["spec"]
    assert (spec["runTemplate"]["spec"]["input"]["text"], spec["suspend"]) == (
        "Triage it twice", True)


# -- the admission policies, as real users ----------------------------------------------------


def _grant(plane: Kubectl, namespace: str, name: str, user: str, verb: str, resource: str,
           *names: str) -> None:
    plane.kubectl("create", "role", name, "-n", namespace, f"--verb={verb}",
                  f"--resource={resource}", *[f"--resource-name={n}" for n in names])
    plane.kubectl("create", "rolebinding", name, "-n", namespace, f"--role={name}",
                  f"--user={user}")


@pytest.fixture
def team(crds: Kubectl, solo_namespace: str, enforced: Kubectl) -> Iterator[tuple[str, str]]:
    """(namespace, other namespace): tess and ned edit the first, bea the other; tess may
    get the trigger's Secret. Once the policy refuses ned's trigger (a policy matching a
    new kind is enforced a little after it is created)."""
    crds.kubectl("create", "rolebinding", "editors", "-n", solo_namespace,
                 "--clusterrole=agentrun-edit", f"--user={TESS}", f"--user={NED}")
    _grant(crds, solo_namespace, "read-hook", TESS, "get", "secrets", SECRET)
    for other in fresh_namespace(crds, "solo-b"):
        crds.kubectl("create", "rolebinding", "editors", "-n", other,
                     "--clusterrole=agentrun-edit", f"--user={BEA}")
        deadline = time.monotonic() + 120
        while True:
            done = apply(crds, solo_namespace, trigger_manifest(), as_user=NED,
                         extra=("--dry-run=server",))
            if done.returncode != 0 and f"ValidatingAdmissionPolicy '{POLICY}'" in done.stderr:
                break
            assert time.monotonic() < deadline, f"{POLICY} not enforced: {done.stderr}"
            time.sleep(0.5)
        yield solo_namespace, other


def test_a_trigger_names_only_a_secret_its_author_may_get(crds: Kubectl,
                                                          team: tuple[str, str]) -> None:
    namespace, _ = team
    said = refused(apply(crds, namespace, trigger_manifest(), as_user=NED))
    assert (f"AgentRunTrigger spec.auth names Secret {SECRET}: {NED} may not get "
            f"secrets/{SECRET} in namespace {namespace}; only principals who may read a "
            "Secret may have the receiver check deliveries with it") in said
    apply(crds, namespace, trigger_manifest(), as_user=TESS, check=True)
    stored_trigger = stored(crds, namespace, "art/new-ticket")
    # Whoever wrote the template is recorded: the trigger's runs carry that user.
    assert stored_trigger["metadata"]["annotations"][ANNOTATION_TEMPLATE_BY] == TESS
    # Ned may suspend it (the template and auth stay as tess wrote them)...
    suspended = trigger_manifest(suspend=True)
    apply(crds, namespace, suspended, as_user=NED, check=True, extra=("--force-conflicts",))
    assert stored(crds, namespace, "art/new-ticket")["metadata"]["annotations"][
        ANNOTATION_TEMPLATE_BY] == TESS
    # ...but not point it at the Secret again under another key, nor change its template
    # to name one.
    other_key = trigger_manifest(suspend=True, auth={"bearer": {"secretKeyRef": {
        "name": SECRET, "key": "token"}}})
    assert f"{NED} may not get secrets/{SECRET}" in refused(apply(
        crds, namespace, other_key, as_user=NED, extra=("--force-conflicts",)))


def test_a_trigger_template_is_checked_for_its_author(crds: Kubectl,
                                                      team: tuple[str, str]) -> None:
    namespace, _ = team
    env = [{"name": "KEY", "valueFrom": {"secretKeyRef": {"name": "payroll", "key": "k"}}}]
    said = refused(apply(crds, namespace, with_template(env=env), as_user=TESS))
    assert (f"AgentRunTrigger runTemplate env var KEY names Secret payroll: {TESS} may not "
            "get secrets/payroll") in said
    said = refused(apply(crds, namespace, with_template(image="evil:1"), as_user=TESS))
    assert (f"AgentRunTrigger sets spec.runTemplate.spec.image: {TESS} may not create pods "
            f"in namespace {namespace}") in said


def test_nobody_writes_template_by_but_admission(crds: Kubectl, team: tuple[str, str]) -> None:
    namespace, _ = team
    forged = trigger_manifest()
    forged["metadata"]["annotations"] = {ANNOTATION_TEMPLATE_BY: "someone-else"}
    apply(crds, namespace, forged, as_user=TESS, check=True)
    # The mutating policy wrote the truth over it.
    assert stored(crds, namespace, "art/new-ticket")["metadata"]["annotations"][
        ANNOTATION_TEMPLATE_BY] == TESS


def test_another_namespace_cannot_see_or_write_a_trigger(crds: Kubectl,
                                                         team: tuple[str, str]) -> None:
    namespace, other = team
    apply(crds, namespace, trigger_manifest(), as_user=TESS, check=True)
    for verb in (("get", "art", "new-ticket"), ("get", "agentruns"),
                 ("get", "agentruntriggers.agentrun.dev/new-ticket", "-o",
                  "jsonpath={.status}")):
        done = crds.kubectl(*verb, "-n", namespace, as_user=BEA, check=False)
        assert done.returncode != 0 and "Forbidden" in done.stderr, done
    assert "Forbidden" in refused(apply(crds, namespace, trigger_manifest("mine"), as_user=BEA))
    # In bea's own namespace, naming a Secret of that name gets her nothing: she may not get
    # it there either, and a Secret of another namespace cannot be named at all.
    assert f"{BEA} may not get secrets/{SECRET} in namespace {other}" in refused(
        apply(crds, other, trigger_manifest(), as_user=BEA))


SAMPLES = sorted((Path(__file__).resolve().parents[2] / "samples" / "trigger").glob("*.yaml"))


@pytest.mark.parametrize("path", SAMPLES, ids=[p.name for p in SAMPLES])
def test_the_samples_are_accepted_as_written(enforced: Kubectl, solo_namespace: str,
                                             path: Path) -> None:
    enforced.kubectl("apply", "--server-side", "-n", solo_namespace, "-f", str(path))
    [doc] = [d for d in yaml.safe_load_all(path.read_text()) if d]
    stored_spec = stored(enforced, solo_namespace, f"art/{doc['metadata']['name']}")["spec"]
    assert stored_spec["identity"] == doc["spec"]["identity"]
    assert stored_spec["runTemplate"]["spec"]["model"] == "scripted"
