"""spec.env may set proxies (HTTPS_PROXY, ...) for the agent's model traffic; the runner's
requests to the store API never go through them, since each carries the store token."""

from __future__ import annotations

import asyncio
import http.server
import json
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from agentrun_runner.store_client import StoreClient


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[tuple[str, str | None]]

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


def _serve() -> Iterator[tuple[str, list[tuple[str, str | None]]]]:
    seen: list[tuple[str, str | None]] = []
    handler = type("Handler", (_Recorder,), {"seen": seen})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def store_api() -> Iterator[tuple[str, list[tuple[str, str | None]]]]:
    yield from _serve()


@pytest.fixture
def proxy() -> Iterator[tuple[str, list[tuple[str, str | None]]]]:
    yield from _serve()


def test_store_requests_ignore_the_proxy_variables(
        store_api: tuple[str, list[tuple[str, str | None]]],
        proxy: tuple[str, list[tuple[str, str | None]]],
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store_url, store_seen = store_api
    proxy_url, proxy_seen = proxy
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "all_proxy"):
        monkeypatch.setenv(name, proxy_url)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    token = tmp_path / "token"
    token.write_text("the-store-token\n")

    async def both() -> None:
        # A client that takes its proxy from the environment hands the proxy its request.
        async with httpx.AsyncClient() as plain:
            await plain.get(f"{store_url}/v1/attempt", headers={"Authorization": "Bearer x"})
        client = StoreClient(store_url, token)
        try:
            assert await client.request("GET", "/v1/attempt") == {"ok": True}
        finally:
            await client.close()

    asyncio.run(both())

    assert proxy_seen == [(f"{store_url}/v1/attempt", "Bearer x")]  # the plain client's
    assert store_seen == [("/v1/attempt", "Bearer the-store-token")]
