"""A run only tightens: every combination of what the chart's policy, the image's code, the
Agent's effects and the run's spec.tools say of one tool, effect and approval, which source
is named, and what applies then."""

from __future__ import annotations

import itertools
import json

import pytest

from agentrun import effects, policy
from agentrun.policy import AGENT, CHART, CODE, RUN, Declared

RO, ID, EF = effects.READ_ONLY, effects.IDEMPOTENT, effects.EFFECTFUL
REQ, NONE = True, False  # approval Required / None said outright (None: nothing said)


# Two sources, effects: (more trusted, less trusted) -> loosened?
@pytest.mark.parametrize(("greater", "lesser", "loosened"), [
    (None, None, False), (None, RO, False), (None, ID, False), (None, EF, False),
    (RO, None, False), (RO, RO, False), (RO, ID, False), (RO, EF, False),
    (ID, None, False), (ID, RO, True), (ID, ID, False), (ID, EF, False),
    (EF, None, False), (EF, RO, True), (EF, ID, True), (EF, EF, False),
])
def test_an_effect_may_only_be_made_stricter(greater: str | None, lesser: str | None,
                                             loosened: bool) -> None:
    found = policy.violation("refund", [Declared(AGENT, greater), Declared(RUN, lesser)])
    assert (found is not None) == loosened
    if found is not None:
        assert (found.tool, found.source, found.contradicts) == ("refund", RUN, AGENT)
        assert f"says {lesser} (where it says {greater})" in found.message


# Two sources, approvals: (more trusted, less trusted) -> lifted?
@pytest.mark.parametrize(("greater", "lesser", "lifted"), [
    (None, None, False), (None, REQ, False), (None, NONE, False),
    (REQ, None, False), (REQ, REQ, False), (REQ, NONE, True),
    (NONE, None, False), (NONE, REQ, False), (NONE, NONE, False),
])
def test_an_approval_required_cannot_be_lifted(greater: bool | None, lesser: bool | None,
                                               lifted: bool) -> None:
    found = policy.violation("refund", [Declared(CODE, approval=greater),
                                        Declared(RUN, approval=lesser)])
    assert (found is not None) == lifted
    if found is not None:
        assert (found.source, found.contradicts) == (RUN, CODE)
        assert "says approval None for the tool refund, which the runner image's code" in (
            found.message)


EFFECTS = (None, RO, ID, EF)
APPROVALS = (None, REQ, NONE)
RANK = {None: None, RO: 0, ID: 1, EF: 2}


def _expected(said: list[Declared]) -> tuple[str, str] | None:
    """The rule in the contract's words: the first (less trusted, more trusted) pair where
    the less trusted one lifts an approval the other requires, or names a less strict
    effect; sources compared least trusted last."""
    for i, lesser in enumerate(said):
        for greater in said[:i]:
            if greater.approval is True and lesser.approval is False:
                return lesser.source, greater.source
            if RANK[greater.effect] is not None and RANK[lesser.effect] is not None and (
                    RANK[lesser.effect] < RANK[greater.effect]):  # type: ignore[operator]
                return lesser.source, greater.source
    return None


# Every combination of what the four sources say of one tool, effect and approval: the
# chart's policy x the image's code x the Agent's effects x the run's spec.tools (the code
# says no "approval None": it requires one or says nothing). 12 x 8 x 12 x 12 = 13,824,
# one test per word of the chart's policy.
SAID = list(itertools.product(EFFECTS, APPROVALS))
BELOW_THE_CHART = list(itertools.product(EFFECTS, (None, REQ), EFFECTS, APPROVALS, EFFECTS,
                                         APPROVALS))


@pytest.mark.parametrize(("chart_e", "chart_a"), SAID, ids=[f"chart {e} {a}" for e, a in SAID])
def test_every_combination_of_sources(chart_e: str | None, chart_a: bool | None) -> None:
    for code_e, code_a, agent_e, agent_a, run_e, run_a in BELOW_THE_CHART:
        said = [Declared(CHART, chart_e, chart_a), Declared(CODE, code_e, code_a),
                Declared(AGENT, agent_e, agent_a), Declared(RUN, run_e, run_a)]
        found = policy.violation("refund", said)
        expected = _expected(said)
        assert (None if found is None else (found.source, found.contradicts)) == expected, said
        if found is not None:
            continue
        # What applies is then the strictest of all that was said, and approval Required
        # from any source holds.
        applied = policy.effective(said)
        stated = [RANK[d.effect] for d in said if d.effect]
        assert (RANK[applied.effect] if applied.effect else None) == (
            max(stated) if stated else None), said  # type: ignore[type-var]
        if any(d.approval is True for d in said):
            assert applied.approval is True, said
        elif any(d.approval is False for d in said):
            assert applied.approval is False, said
        else:
            assert applied.approval is None, said
        # ...and it is what the least trusted source that spoke said: each source may
        # only tighten, so the last word on an effect is the strictest.
        last = next((d.effect for d in reversed(said) if d.effect), None)
        assert applied.effect == last, said


@pytest.mark.parametrize(("code", "agent", "run", "expected"), [
    # Named explicitly: which source is reported when several are contradicted.
    (Declared(CODE, EF), Declared(AGENT, ID), Declared(RUN, RO), (AGENT, CODE)),
    (Declared(CODE, RO), Declared(AGENT, EF), Declared(RUN, ID), (RUN, AGENT)),
    (Declared(CODE, approval=REQ), Declared(AGENT), Declared(RUN, approval=NONE),
     (RUN, CODE)),
    (Declared(CODE), Declared(AGENT, approval=REQ), Declared(RUN, approval=NONE),
     (RUN, AGENT)),
    (Declared(CODE, approval=REQ), Declared(AGENT, approval=NONE), Declared(RUN),
     (AGENT, CODE)),
    # A tool no source declared is the run's to declare, as before.
    (Declared(CODE), Declared(AGENT), Declared(RUN, RO, NONE), None),
    # Tightening is always allowed.
    (Declared(CODE, RO), Declared(AGENT, ID), Declared(RUN, EF, REQ), None),
])
def test_which_source_a_violation_names(code: Declared, agent: Declared, run: Declared,
                                        expected: tuple[str, str] | None) -> None:
    found = policy.violation("refund", [code, agent, run])
    assert (None if found is None else (found.source, found.contradicts)) == expected


def test_sources_are_read_from_spec_tools_and_agent_effects_by_name() -> None:
    snapshot = {"root": "a", "agents": {
        "a": {"effects": [{"name": "refund", "approval": "Required"}]},
        "b": {"effects": [{"name": "lookup", "effect": "ReadOnly"}]}}}
    agent = policy.of_rules(AGENT, policy.agent_rules(snapshot))
    assert agent == {"refund": Declared(AGENT, None, True), "lookup": Declared(AGENT, RO)}
    lifted = policy.first_violation([agent, policy.of_rules(
        RUN, [{"name": "lookup", "effect": "Effectful"}, {"name": "refund", "approval": "None"}])])
    assert lifted is not None and (lifted.tool, lifted.source) == ("refund", RUN)
    assert policy.first_violation([agent, policy.of_rules(
        RUN, [{"name": "other", "effect": "ReadOnly", "approval": "None"}])]) is None


@pytest.mark.parametrize(("raw", "said"), [
    ("", ""),
    ('[{"name": "charge_card", "approval": "Required", "approvalTimeoutSeconds": 600}]', ""),
    ('[{"name": "update_crm", "effect": "Idempotent"}]', ""),
    ("{}", "must be a list of {name, effect, approval}"),
    ("[1]", "entry 0 needs a name"),
    ('[{"name": "x"}]', "entry x says neither an effect nor an approval"),
    ('[{"name": "x", "effect": "Harmless"}]', "entry x: effect must be one of ReadOnly"),
    ('[{"name": "x", "approval": "Maybe"}]', "entry x: approval must be Required or None"),
    ('[{"name": "x", "approval": "Required", "approvalTimeoutSeconds": 0}]',
     "entry x: approvalTimeoutSeconds must be a whole number >= 1"),
    ('[{"name": "x", "approval": "Required", "when": "always"}]',
     "entry x has approval, when; an entry has name, effect, approval and"),
    ("not json", "not JSON"),
])
def test_the_charts_policy_is_read_as_spec_tools(raw: str, said: str) -> None:
    assert said in policy.rules_problem(raw) and bool(said) == bool(policy.rules_problem(raw))
    if not said:
        assert policy.of_rules(CHART, policy.chart_rules(raw)) == {
            r["name"]: Declared(CHART, r.get("effect"), None if r.get("approval") is None
                                else r["approval"] == "Required")
            for r in json.loads(raw or "[]")}
    else:
        with pytest.raises(ValueError, match="the chart's tool policy"):
            policy.chart_rules(raw)
