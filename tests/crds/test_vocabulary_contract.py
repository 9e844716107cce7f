"""crds/ spells the shared vocabulary (agentrun/vocabulary.py) the same way the operator and
the runner do. The YAML cannot import the module, so this reads both and compares them; a
rename on one side without the other fails here instead of in a cluster."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

from agentrun import vocabulary as v

CRDS = Path(__file__).resolve().parents[2] / "crds"


def _docs() -> list[dict[str, Any]]:
    return [d for p in sorted(CRDS.glob("*.yaml")) for d in yaml.safe_load_all(p.read_text()) if d]


def _one(kind: str, name: str) -> dict[str, Any]:
    (found,) = [d for d in _docs() if d["kind"] == kind and d["metadata"]["name"] == name]
    return found


def _run_spec() -> dict[str, Any]:
    crd = _one("CustomResourceDefinition", f"{v.RUN_PLURAL}.{v.GROUP}")
    spec: dict[str, Any] = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"][
        "spec"
    ]
    return spec


def test_crd_names_match_the_vocabulary() -> None:
    for kind, plural in [(v.RUN_KIND, v.RUN_PLURAL), (v.REPLAY_KIND, v.REPLAY_PLURAL),
                         (v.AGENT_KIND, v.AGENT_PLURAL)]:
        crd = _one("CustomResourceDefinition", f"{plural}.{v.GROUP}")
        assert crd["spec"]["group"] == v.GROUP
        assert crd["spec"]["names"]["kind"] == kind
        assert crd["spec"]["names"]["plural"] == plural
        assert [ver["name"] for ver in crd["spec"]["versions"]] == [v.VERSION]


def test_trigger_enum_and_defaults_match_the_vocabulary() -> None:
    props = _run_spec()["properties"]
    assert tuple(props["trigger"]["enum"]) == v.Trigger.ALL
    assert props["trigger"]["default"] == v.Trigger.MANUAL
    assert props["userId"]["default"] == v.DEFAULT_USER_ID


def test_env_names_refused_are_exactly_those_the_operator_sets() -> None:
    name_rules = _run_spec()["properties"]["env"]["items"]["properties"]["name"][
        "x-kubernetes-validations"
    ]
    (reserved_rule,) = [r["rule"] for r in name_rules if "AGENTRUN_RUN_NAME" in r["rule"]]
    reserved = set(re.findall(r"'([A-Z_]+)'", reserved_rule))
    operator_sets = {
        value for key, value in vars(v.RunnerEnv).items() if key.isupper() and key == key.strip("_")
    }
    assert reserved == operator_sets | {v.ENV_DATABASE_URL}
    # The script of the scripted model is the user's to set.
    assert v.ENV_SCRIPT not in reserved


def test_env_names_that_load_code_are_refused_as_the_vocabulary_lists_them() -> None:
    """The CRD spells LoaderEnv three times: the names and the families in the rule, each
    reason in the message's map, and the families again where the message finds a name's
    family. All must be the vocabulary's, in its order."""
    name_rules = _run_spec()["properties"]["env"]["items"]["properties"]["name"][
        "x-kubernetes-validations"
    ]
    (loader,) = [r for r in name_rules if "'LD_'" in r["rule"]]
    quoted = re.compile(r"'([^']*)'")
    found = re.fullmatch(r"!\(self in \[(.*)\]\) && !\[(.*)\]\.exists\(p, self\.startsWith\(p\)\)",
                         loader["rule"])
    assert found, loader["rule"]
    assert quoted.findall(found.group(1)) == list(v.LoaderEnv.NAMES)
    assert quoted.findall(found.group(2)) == list(v.LoaderEnv.PREFIXES)

    message = loader["messageExpression"]
    reasons = dict(re.findall(r"'([^']+)': '([^']*)'", message))
    assert reasons == {**{f"{p}*": r for p, r in v.LoaderEnv.PREFIXES.items()},
                       **v.LoaderEnv.NAMES}
    assert list(reasons) == [*(f"{p}*" for p in v.LoaderEnv.PREFIXES), *v.LoaderEnv.NAMES]
    (families,) = re.findall(r"\}\[\(\[(.*?)\]\.filter", message)
    assert quoted.findall(families) == list(v.LoaderEnv.PREFIXES)
    # The message takes a name that starts with no family for a name of the list.
    assert not [n for n in v.LoaderEnv.NAMES if n.startswith(tuple(v.LoaderEnv.PREFIXES))]
    # Decided the other way: refused by neither.
    for kept in v.LoaderEnv.KEPT:
        assert kept not in v.LoaderEnv.NAMES
        assert not kept.startswith(tuple(v.LoaderEnv.PREFIXES))


def test_security_docs_list_each_refused_and_kept_name_with_its_reason() -> None:
    docs = (CRDS.parent / "docs" / "security.md").read_text()
    rows = {**{f"{p}*": r for p, r in v.LoaderEnv.PREFIXES.items()}, **v.LoaderEnv.NAMES,
            **v.LoaderEnv.KEPT}
    missing = [name for name, reason in rows.items() if f"| `{name}` | {reason} |" not in docs]
    assert missing == [], "docs/security.md, What spec.env may not set"


def test_force_policy_guards_the_vocabulary_annotation_and_verb() -> None:
    policy = _one("ValidatingAdmissionPolicy", "agentrun-force-replay")
    text = yaml.safe_dump(policy["spec"])
    assert text.count(v.ANNOTATION_FORCE_REPLAY) >= 2  # read on the new and the old object
    assert f"check('{v.VERB_FORCE}')" in " ".join(
        e["expression"] for e in policy["spec"]["validations"]
    )
    assert f"ClusterRole {v.FORCER_CLUSTER_ROLE}" in policy["spec"]["validations"][0]["message"]

    forcer = _one("ClusterRole", v.FORCER_CLUSTER_ROLE)
    assert any(
        v.REPLAY_PLURAL in rule["resources"] and v.VERB_FORCE in rule["verbs"]
        for rule in forcer["rules"]
    )
    # No aggregated role hands out `force` by the back door.
    for role in [d for d in _docs() if d["kind"] == "ClusterRole"]:
        if role["metadata"]["name"] != v.FORCER_CLUSTER_ROLE:
            assert all(v.VERB_FORCE not in rule["verbs"] for rule in role["rules"])


def test_every_policy_is_bound() -> None:
    policies = {d["metadata"]["name"] for d in _docs() if d["kind"] == "ValidatingAdmissionPolicy"}
    bindings = {
        d["spec"]["policyName"]: d["spec"]["validationActions"]
        for d in _docs()
        if d["kind"] == "ValidatingAdmissionPolicyBinding"
    }
    assert policies == {"agentrun-force-replay", "agentrun-replay-of", "agentrun-run-references",
                        "agentrun-replay-requester", "agentrun-approver",
                        "agentrun-agent-references", "agentrun-run-creator",
                        "agentrun-schedule-template-by", "agentrun-trigger-identity"}
    assert bindings == {p: ["Deny"] for p in policies}
    mutating = {d["metadata"]["name"] for d in _docs() if d["kind"] == "MutatingAdmissionPolicy"}
    mutating_bound = {d["spec"]["policyName"] for d in _docs()
                      if d["kind"] == "MutatingAdmissionPolicyBinding"}
    assert mutating == mutating_bound == {"agentrun-replay-requester", "agentrun-run-creator",
                                          "agentrun-schedule-template-by",
                                          "agentrun-run-finalizer"}


def test_the_schedule_crd_speaks_the_vocabulary() -> None:
    crd = _one("CustomResourceDefinition", f"{v.SCHEDULE_PLURAL}.{v.GROUP}")
    assert (crd["spec"]["names"]["kind"], crd["spec"]["names"]["plural"]) == (
        v.SCHEDULE_KIND, v.SCHEDULE_PLURAL)
    assert [ver["name"] for ver in crd["spec"]["versions"]] == [v.VERSION]
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    policy = spec["properties"]["concurrencyPolicy"]
    assert tuple(policy["enum"]) == v.ConcurrencyPolicy.ALL
    assert policy["default"] == v.ConcurrencyPolicy.FORBID
    # The template is the AgentRun spec, but for what makes a run's spec a record.
    template = spec["properties"]["runTemplate"]["properties"]["spec"]
    assert template["properties"].keys() == _run_spec()["properties"].keys()
    assert "self == oldSelf" not in yaml.safe_dump(template)
    rules = yaml.safe_dump(spec["properties"]["runTemplate"]["x-kubernetes-validations"])
    assert f"'{v.Trigger.SCHEDULE}'" in rules


def test_the_trigger_crd_speaks_the_vocabulary() -> None:
    crd = _one("CustomResourceDefinition", f"{v.TRIGGER_PLURAL}.{v.GROUP}")
    assert (crd["spec"]["names"]["kind"], crd["spec"]["names"]["plural"]) == (
        v.TRIGGER_KIND, v.TRIGGER_PLURAL)
    assert [ver["name"] for ver in crd["spec"]["versions"]] == [v.VERSION]
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    template = spec["properties"]["runTemplate"]["properties"]["spec"]
    assert template["properties"].keys() == _run_spec()["properties"].keys()
    assert "self == oldSelf" not in yaml.safe_dump(template)
    rules = yaml.safe_dump(spec["properties"]["runTemplate"]["x-kubernetes-validations"])
    assert f"'{v.Trigger.EVENT}'" in rules and f"'{v.EVENT_FILE}'" in rules
    identity = yaml.safe_dump(_one("ValidatingAdmissionPolicy", "agentrun-trigger-identity"))
    assert f"'{v.TriggerIdentity.CLOUDEVENTS}'" in identity
    assert all(f"variables.identity.{form}" in identity for form in (
        v.TriggerIdentity.HEADER, v.TriggerIdentity.JSON_POINTER))
