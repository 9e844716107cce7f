"""A store API whose process ends while a runner's request is in it (a restart, a crash):
the runner sends again only a request that means the same however often it arrives (a
read, the attempt's begin), and fails saying so on one that may have been acted on."""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import ssl
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
from agentrun_devtools.certs import PKI
from agentrun_runner import store_client
from agentrun_runner.store_client import StoreClient, StoreUnreachable

T = TypeVar("T")
BEGUN = {"namespace": "team-a", "runName": "r", "runUid": "u", "attempt": 1,
         "agent": "a", "userId": "me", "sessionId": "u-1"}


class _DropsFirst(http.server.BaseHTTPRequestHandler):
    """Reads each request; the first one to a path is dropped unanswered (the connection
    closed, as when the process ends), the next ones are answered."""

    arrived: list[str]

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        first = self.path not in self.arrived
        self.arrived.append(self.path)
        if first:
            self.close_connection = True
            return
        body = json.dumps(BEGUN if self.path == "/v1/attempt/begin" else {"ok": True}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _handle

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def served(tmp_path: Path,
           monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[StoreClient, list[str]]]:
    monkeypatch.setattr(store_client, "CONNECT_BACKOFF_SECONDS", 0.01)
    with _serving(tmp_path, _DropsFirst) as (client, arrived):
        yield client, arrived


@contextlib.contextmanager
def _serving(tmp_path: Path, handler: type[http.server.BaseHTTPRequestHandler],
             **fields: object) -> Iterator[tuple[StoreClient, list[str]]]:
    """A TLS server of `handler` (with `fields` set on it), a client of it, and the paths
    its requests arrived at, in order."""
    pki = PKI(tmp_path / "pki", name="store-api-test-ca")
    cert, key = pki.issue("store", "store", server=True, hosts=("127.0.0.1",))
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(str(cert), str(key))
    arrived: list[str] = []
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), type("Handler", (handler,), {"arrived": arrived, **fields}))
    server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    token = tmp_path / "token"
    token.write_text("t\n")
    try:
        yield (StoreClient(f"https://127.0.0.1:{server.server_address[1]}", token,
                           pki.ca_cert.read_text()), arrived)
    finally:
        server.shutdown()
        server.server_close()


def _with(client: StoreClient, go: Coroutine[Any, Any, T]) -> T:
    async def run() -> T:
        try:
            return await go
        finally:
            await client.close()
    return asyncio.run(run())


def test_the_attempts_begin_is_sent_again(served: tuple[StoreClient, list[str]]) -> None:
    client, arrived = served
    me = _with(client, client.begin())
    assert me.identity.run_uid == "u"
    assert arrived == ["/v1/attempt/begin", "/v1/attempt/begin"]


def test_a_read_is_sent_again(served: tuple[StoreClient, list[str]]) -> None:
    client, arrived = served
    assert _with(client, client.request("GET", "/v1/journal")) == {"ok": True}
    assert arrived == ["/v1/journal", "/v1/journal"]


def test_a_call_that_may_have_been_opened_is_not(served: tuple[StoreClient, list[str]]) -> None:
    client, arrived = served
    with pytest.raises(StoreUnreachable, match="ServerDisconnectedError"):
        _with(client, client.request("POST", "/v1/ledger", {"seq": 1}))
    assert arrived == ["/v1/ledger"]


# -- a store API whose store is not ready yet (503 with Retry-After) ----------------------


class _NotReadyFirst(http.server.BaseHTTPRequestHandler):
    """Answers the first `refusals` requests 503, with Retry-After when `retry_after` is
    set (as the store API does while the store is not at its schema), then 200."""

    arrived: list[str]
    refusals = 2
    retry_after: str | None = "0.05"

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        self.rfile.read(length)
        self.arrived.append(self.path)
        if len(self.arrived) <= self.refusals:
            body = json.dumps({"error": "the run store has not been checked yet"}).encode()
            self.send_response(503)
            if self.retry_after is not None:
                self.send_header("Retry-After", self.retry_after)
        else:
            body = json.dumps({"ok": True}).encode()
            self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _handle

    def log_message(self, *args: object) -> None:
        pass


@pytest.mark.parametrize("method", ["POST", "GET"])
def test_a_store_not_ready_yet_is_asked_again_after_what_it_says(
        tmp_path: Path, method: str) -> None:
    """Any request, one that may not be sent twice too: a 503 with Retry-After did none of
    it."""
    with _serving(tmp_path, _NotReadyFirst) as (client, arrived):
        assert _with(client, client.request(method, "/v1/ledger", {"seq": 1})) == {"ok": True}
        assert arrived == ["/v1/ledger"] * 3


def test_a_503_without_retry_after_fails_at_once(tmp_path: Path) -> None:
    with _serving(tmp_path, _NotReadyFirst, retry_after=None) as (client, arrived):
        with pytest.raises(store_client.StoreRefused, match="503"):
            _with(client, client.request("GET", "/v1/journal"))
        assert arrived == ["/v1/journal"]


def test_a_store_that_stays_not_ready_fails_the_request_saying_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(store_client, "NOT_READY_SECONDS", 0.3)
    with _serving(tmp_path, _NotReadyFirst, refusals=1000) as (client, arrived):
        with pytest.raises(store_client.StoreRefused, match="has not been checked yet"):
            _with(client, client.begin())
        assert 2 <= len(arrived) <= 7, arrived
