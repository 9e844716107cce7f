"""Pure parts of the store: input digests and the ledger/session union."""

from __future__ import annotations

from agentrun.store.inputs import input_digest
from agentrun.store.ledger import _Call, function_calls_of, union_in_call_order

KEY = b"k" * 32


def test_input_digest_covers_text_and_files_deterministically() -> None:
    a = input_digest("hi", {"a.txt": b"1", "b.txt": b"2"}, key=KEY)
    assert a == input_digest("hi", {"b.txt": b"2", "a.txt": b"1"}, key=KEY)
    assert a != input_digest("hi", {"a.txt": b"12", "b.txt": b""}, key=KEY)  # framing
    assert a != input_digest("hi", key=KEY)
    assert input_digest("", key=KEY) != input_digest("", {"": b""}, key=KEY)


def test_input_digest_is_keyed_so_a_reader_cannot_confirm_a_guess() -> None:
    """Whoever reads status.inputDigest and guesses a Secret's bytes cannot check the guess
    without the installation's key: another key gives another digest, and the digest is
    no plain sha256 of what the framing would hash."""
    import hashlib

    guess = input_digest("hunter2", key=KEY)
    assert guess.startswith("hmac-sha256:")
    assert guess != input_digest("hunter2", key=b"x" * 32)
    plain = hashlib.sha256(b"agentrun-input-v2\n" + (7).to_bytes(8, "big") + b"hunter2")
    assert guess.removeprefix("hmac-sha256:") != plain.hexdigest()


def test_union_keeps_call_order_and_repeats_and_counts_each_call_once() -> None:
    session = [_Call("send_email", "c1", 10.0, 0), _Call("update_crm", "c2", 12.0, 1),
               _Call("send_email", "c3", 14.0, 2)]
    ledger = [_Call("send_email", "c1", 10.5, 1), _Call("update_crm", "c2", 12.5, 2)]
    assert union_in_call_order(session, ledger) == ["send_email", "update_crm", "send_email"]
    # A call only one record holds still counts.
    assert union_in_call_order(session[:1], ledger) == ["send_email", "update_crm"]
    assert union_in_call_order([], []) == []


def test_function_calls_are_read_from_stored_events() -> None:
    event = {"content": {"role": "model", "parts": [
        {"text": "let me"}, {"function_call": {"name": "a", "id": "1"}},
        {"function_call": {"name": "b", "id": "2"}}]}}
    assert function_calls_of(event) == [("a", "1"), ("b", "2")]
    assert function_calls_of({"content": {"parts": [{"function_response": {"name": "a"}}]}}) == []
    assert function_calls_of({}) == []
