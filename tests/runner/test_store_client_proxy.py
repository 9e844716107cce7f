"""spec.env may set proxies (HTTPS_PROXY, ...) for the agent's model traffic; the runner's
requests to the store API never go through them, since each carries the store token."""

from __future__ import annotations

import asyncio
import http.server
import json
import ssl
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from agentrun_devtools.certs import PKI
from agentrun_runner.store_client import StoreClient


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[tuple[str, str | None]]

    def do_CONNECT(self) -> None:
        # A proxy asked to tunnel to an https server: noted, and refused (no tunnel here).
        self.seen.append((f"CONNECT {self.path}", self.headers.get("Authorization")))
        self.send_response(403)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        self.seen.append((self.path, self.headers.get("Authorization")))
        body = json.dumps({"ok": True}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def _serve(tls: ssl.SSLContext | None = None) -> Iterator[tuple[str, list[tuple[str, str | None]]]]:
    seen: list[tuple[str, str | None]] = []
    handler = type("Handler", (_Recorder,), {"seen": seen})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        scheme = "https" if tls is not None else "http"
        yield f"{scheme}://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def pki(tmp_path: Path) -> PKI:
    return PKI(tmp_path / "pki", name="store-api-test-ca")


@pytest.fixture
def store_api(pki: PKI) -> Iterator[tuple[str, list[tuple[str, str | None]]]]:
    """A stand-in of the store API over TLS (the runner speaks nothing else to it)."""
    cert, key = pki.issue("store", "store", server=True, hosts=("127.0.0.1",))
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(str(cert), str(key))
    yield from _serve(tls)


@pytest.fixture
def proxy() -> Iterator[tuple[str, list[tuple[str, str | None]]]]:
    yield from _serve()


def test_store_requests_ignore_the_proxy_variables(
        store_api: tuple[str, list[tuple[str, str | None]]],
        proxy: tuple[str, list[tuple[str, str | None]]], pki: PKI,
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store_url, store_seen = store_api
    proxy_url, proxy_seen = proxy
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "all_proxy"):
        monkeypatch.setenv(name, proxy_url)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    token = tmp_path / "token"
    token.write_text("the-store-token\n")

    ca = pki.ca_cert.read_text()

    async def both() -> None:
        # A client that takes its proxy from the environment goes through the proxy.
        async with httpx.AsyncClient(verify=ssl.create_default_context(cadata=ca)) as plain:
            with pytest.raises(httpx.ProxyError):
                await plain.get(f"{store_url}/v1/attempt",
                                headers={"Authorization": "Bearer x"})
        client = StoreClient(store_url, token, ca)
        try:
            assert await client.request("GET", "/v1/attempt") == {"ok": True}
        finally:
            await client.close()

    asyncio.run(both())

    # The plain client's tunnel request: the proxy learns where it goes.
    assert proxy_seen == [(f"CONNECT {store_url.removeprefix('https://')}", None)]
    assert store_seen == [("/v1/attempt", "Bearer the-store-token")]
