"""A store API whose process ends while a runner's request is in it (a restart, a crash):
the runner sends again only a request that means the same however often it arrives (a
read, the attempt's begin), and fails saying so on one that may have been acted on."""

from __future__ import annotations

import asyncio
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
    pki = PKI(tmp_path / "pki", name="store-api-test-ca")
    cert, key = pki.issue("store", "store", server=True, hosts=("127.0.0.1",))
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(str(cert), str(key))
    arrived: list[str] = []
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), type("Handler", (_DropsFirst,), {"arrived": arrived}))
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
