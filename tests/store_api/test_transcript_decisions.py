"""The transcript's decisions, row by row: the state of a tool call (call_state) and of
the result an attempt gave (result_state), which attempt an event belongs to, what a
follower sends again; and the transcript API's door: when a client certificate is the
API server's front proxy (proxy_refusal), and who the front proxy says the user is."""

from __future__ import annotations

import datetime
from dataclasses import dataclass, replace

import pytest
from agentrun_store_api.access import Access
from agentrun_store_api.frontproxy import FrontProxyTrust, proxy_refusal, user_of
from agentrun_store_api.transcripts import forbidden
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from multidict import CIMultiDict

from agentrun.ledger import LedgerEntry
from agentrun.store import Approval, Usage
from agentrun.transcript import (
    AttemptFacts,
    Entry,
    Follower,
    TranscriptFacts,
    _Call,
    call_state,
    entries_of,
    owned_events,
    result_state,
)
from agentrun.vocabulary import EntryKind, EntryState, LedgerOutcome, RunStatus

AT = datetime.datetime(2026, 3, 2, 10, 41, 5, tzinfo=datetime.UTC)


def row(attempt: int, *, finished: bool = True, outcome: str | None = LedgerOutcome.OK,
        seq: int = 1) -> LedgerEntry:
    return LedgerEntry(attempt=attempt, seq=seq, tool="charge_card", call_id="c1",
                       args_digest="sha256:x", started_at=AT,
                       finished_at=AT if finished else None,
                       outcome=outcome if finished else None)


HELD = Approval(run_uid="u", call_id="c1", attempt=1, seq=2, tool="charge_card",
                args='{"amount":120}', args_digest="sha256:x", requested_at=AT,
                expires_at=AT + datetime.timedelta(days=1), decision=None, approver=None,
                note=None, decided_at=None, approval_name=None)


@dataclass(frozen=True)
class CallRow:
    name: str
    rows: tuple[LedgerEntry, ...]
    waited: Approval | None
    settled: frozenset[int]
    state: str | None


CALLS = [
    CallRow("its approval was denied", (), replace(HELD, decision="Deny", decided_at=AT),
            frozenset({1}), EntryState.DENIED),
    CallRow("a row says denied", (row(2, outcome=LedgerOutcome.DENIED),), HELD,
            frozenset({1, 2}), EntryState.DENIED),
    CallRow("it ran and its end is recorded", (row(1),), None, frozenset(),
            EntryState.FINISHED),
    CallRow("in doubt once, run again by a resume to its end", (row(1, finished=False),
                                                               row(2)), None,
            frozenset({1, 2}), EntryState.FINISHED),
    CallRow("only answered from the journal", (row(2, outcome=LedgerOutcome.JOURNAL),),
            None, frozenset({2}), EntryState.ANSWERED),
    CallRow("started, its attempt settled, no end", (row(1, finished=False),), None,
            frozenset({1}), EntryState.IN_DOUBT),
    CallRow("started, its attempt still live", (row(1, finished=False),), None,
            frozenset(), None),
    CallRow("waiting for a decision", (), HELD, frozenset({1}), None),
    CallRow("approved, not run yet", (), replace(HELD, decision="Approve", decided_at=AT),
            frozenset({1}), None),
]


@pytest.mark.parametrize("case", CALLS, ids=[c.name for c in CALLS])
def test_call_state(case: CallRow) -> None:
    assert call_state(_Call(case.rows, case.waited), case.settled) == case.state


@pytest.mark.parametrize(("rows", "attempt", "state"), [
    ((row(1),), 1, EntryState.FINISHED),
    ((row(1), row(2, outcome=LedgerOutcome.JOURNAL)), 2, EntryState.ANSWERED),
    ((row(2, outcome=LedgerOutcome.DENIED),), 2, EntryState.DENIED),
    ((row(1, finished=False),), 1, None),
], ids=["ran", "answered from the journal", "denied", "no end yet"])
def test_result_state(rows: tuple[LedgerEntry, ...], attempt: int, state: str | None) -> None:
    assert result_state(_Call(rows, None), attempt) == state


def attempt(n: int, started: float | None, *, resumes_run: str | None = None,
            status: str = RunStatus.SUCCEEDED) -> AttemptFacts:
    return AttemptFacts(
        attempt=n, app_name="ns/agent", user_id="u", session_id="s", invocation_id="e-1",
        resumes_attempt=n - 1 if n > 1 or resumes_run else None, resumes_run_uid=resumes_run,
        runner_started_at=None if started is None else datetime.datetime.fromtimestamp(
            started, datetime.UTC), status=status, reason=None, message=None,
        finished_at=None)


def event(at: float, text: str) -> dict[str, object]:
    return {"timestamp": at, "author": "agent", "content": {"parts": [{"text": text}]}}


def test_an_event_belongs_to_the_attempt_whose_runner_had_started() -> None:
    facts = TranscriptFacts(
        attempts=[attempt(1, 100.0), attempt(2, 200.0)],
        events={("ns/agent", "u", "s", "e-1"): [event(150.0, "one"), event(250.0, "two")]},
        ledger=[], approvals=[], result=None, usage=Usage())
    assert [(a, e["content"]["parts"][0]["text"]) for a, e in owned_events(facts)] == [
        (1, "one"), (2, "two")]


def test_a_resumed_copy_shows_only_what_this_run_added() -> None:
    facts = TranscriptFacts(
        attempts=[attempt(1, 200.0, resumes_run="original")],
        events={("ns/agent", "u", "s", "e-1"): [event(150.0, "the original's"),
                                                event(250.0, "ours")]},
        ledger=[], approvals=[], result=None, usage=Usage())
    assert [e["content"]["parts"][0]["text"] for _, e in owned_events(facts)] == ["ours"]


def test_partial_events_and_thoughts_are_not_entries() -> None:
    events = [{"timestamp": 1.0, "author": "agent", "partial": True,
               "content": {"parts": [{"text": "Ref"}]}},
              {"timestamp": 2.0, "author": "agent",
               "content": {"parts": [{"text": "thinking...", "thought": True},
                                     {"text": "Refunded."}]}},
              {"timestamp": 3.0, "author": "agent", "error_code": "MALFORMED",
               "error_message": "the model said nothing"}]
    facts = TranscriptFacts(attempts=[attempt(1, 0.5)],
                            events={("ns/agent", "u", "s", "e-1"): events}, ledger=[],
                            approvals=[], result=None, usage=Usage())
    assert [(e.kind, e.text) for e in entries_of(facts)] == [
        (EntryKind.TEXT, "Refunded."), (EntryKind.ERROR, "the model said nothing")]


def test_a_follower_sends_an_entry_again_when_its_state_changes() -> None:
    call = Entry(1, AT, "agent", EntryKind.TOOL_CALL, tool="send_email", args={}, seq=1,
                 call_id="c1")
    said = Entry(1, AT, "user", EntryKind.INPUT, text="hi")
    follower = Follower()
    assert [e["kind"] for e in follower.news([said, call])] == ["input", "toolCall"]
    assert follower.news([said, call]) == []
    again = follower.news([said, replace(call, state=EntryState.IN_DOUBT)])
    assert [(e["kind"], e.get("state")) for e in again] == [("toolCall", "inDoubt")]


# -- the front proxy ---------------------------------------------------------------------------


def _ca(name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = (x509.CertificateBuilder().subject_name(subject).issuer_name(subject)
            .public_key(key.public_key()).serial_number(1)
            .not_valid_before(AT - datetime.timedelta(days=1))
            .not_valid_after(AT + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    return cert, key


def _leaf(ca: tuple[x509.Certificate, ec.EllipticCurvePrivateKey], name: str, *,
          usage: x509.ObjectIdentifier = ExtendedKeyUsageOID.CLIENT_AUTH,
          days: int = 1) -> x509.Certificate:
    key = ec.generate_private_key(ec.SECP256R1())
    return (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(ca[0].subject).public_key(key.public_key()).serial_number(2)
            .not_valid_before(AT - datetime.timedelta(days=days))
            .not_valid_after(AT - datetime.timedelta(days=days) + datetime.timedelta(days=2))
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .sign(ca[1], hashes.SHA256()))


FRONT = _ca("front-proxy-ca")
OTHER = _ca("front-proxy-ca")  # the same name, another key: a CA dropped from the ConfigMap
TRUST = FrontProxyTrust(client_cas=(FRONT[0],), ca_pem="", allowed_names=(
    "front-proxy-client",), username_headers=("X-Remote-User",),
    group_headers=("X-Remote-Group",), extra_prefixes=("X-Remote-Extra-",))


@pytest.mark.parametrize(("leaf", "trust", "says"), [
    (None, TRUST, "no client certificate"),
    (_leaf(OTHER, "front-proxy-client"), TRUST, "not issued by the API server's front-proxy"),
    (_leaf(FRONT, "front-proxy-client", days=5), TRUST, "not valid now"),
    (_leaf(FRONT, "front-proxy-client", usage=ExtendedKeyUsageOID.SERVER_AUTH), TRUST,
     "not for client authentication"),
    (_leaf(FRONT, "someone-else"), TRUST, "'someone-else' is not among the front proxy's"),
    (_leaf(FRONT, "someone-else"), replace(TRUST, allowed_names=()), ""),
    (_leaf(FRONT, "front-proxy-client"), TRUST, ""),
], ids=["none", "another CA", "expired", "a server certificate", "a name not allowed",
        "any name when none is published", "the front proxy"])
def test_proxy_refusal(leaf: x509.Certificate | None, trust: FrontProxyTrust,
                       says: str) -> None:
    refused = proxy_refusal(leaf, trust, AT)
    assert (says in refused) if says else refused == ""


def test_the_user_is_what_the_published_headers_say() -> None:
    headers = CIMultiDict([("x-remote-user", "alice"), ("X-Remote-Group", "devs"),
                           ("X-Remote-Group", "system:authenticated"),
                           ("X-Remote-Extra-Scopes", "a"), ("X-Remote-Extra-Scopes", "b"),
                           ("X-Remote-Extra-Acme.com%2Fteam", "x"), ("X-Other", "no")])
    user = user_of(headers, TRUST)
    assert user is not None
    assert (user.name, user.groups) == ("alice", ("devs", "system:authenticated"))
    assert dict(user.extra) == {"scopes": ("a", "b"), "acme.com/team": ("x",)}
    # The aggregator's own discovery requests name no group: authenticated all the same.
    bare = user_of(CIMultiDict([("X-Remote-User", "system:kube-aggregator")]), TRUST)
    assert bare is not None and bare.groups == ("system:authenticated",)
    assert user_of(CIMultiDict([("X-Remote-Group", "devs")]), TRUST) is None


def test_a_refusal_reads_as_the_api_servers() -> None:
    user = user_of(CIMultiDict([("X-Remote-User", "bob")]), TRUST)
    assert user is not None
    said = forbidden(user, Access("get", "store.agentrun.dev", "v1alpha1", "transcripts",
                                  "shop", "refund-42"), "").message
    assert said == ('transcripts.store.agentrun.dev "refund-42" is forbidden: User "bob" '
                    'cannot get resource "transcripts" in API group "store.agentrun.dev" in '
                    'the namespace "shop"')
