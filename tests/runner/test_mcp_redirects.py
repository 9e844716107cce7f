"""MCP requests that carry a Secret header never follow a redirect to another origin
(api.md, "Tenant policy"): httpx itself drops only Authorization there. A real local
server redirects; the runner's own client (declarative.direct_client) asks."""

from __future__ import annotations

import asyncio
import http.server
import threading
from collections.abc import Iterator

import httpx
import pytest
from agentrun_runner.declarative import (
    SecretRedirectRefused,
    cross_origin_redirect,
    direct_client,
)

CASES = [
    ("a path on the same origin", "http://crm:8080/mcp", "/other", None),
    ("the same origin, absolute", "http://crm:8080/mcp", "http://crm:8080/x", None),
    ("the default port written out", "https://crm/mcp", "https://crm:443/x", None),
    ("another host", "http://crm:8080/mcp", "http://evil:8080/mcp", "http://evil:8080"),
    ("another port", "http://crm:8080/mcp", "http://crm:9090/mcp", "http://crm:9090"),
    ("https to http", "https://crm/mcp", "http://crm/mcp", "http://crm"),
    ("scheme-relative to another host", "https://crm/mcp", "//evil/mcp", "https://evil"),
]


@pytest.mark.parametrize(("url", "location", "elsewhere"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])
def test_cross_origin_redirect(url: str, location: str, elsewhere: str | None) -> None:
    assert cross_origin_redirect(url, location) == elsewhere


@pytest.fixture
def servers() -> Iterator[tuple[str, str, list[dict[str, str]]]]:
    """A server that redirects every request to a second one (another origin: another
    port), and what the second one received."""
    seen: list[dict[str, str]] = []

    class Target(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            seen.append(dict(self.headers))
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *_: object) -> None:
            pass

    target = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Target)
    there = f"http://127.0.0.1:{target.server_port}"

    class Redirecting(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.send_response(307)
            self.send_header("Location", f"{there}{self.path}")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_: object) -> None:
            pass

    first = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Redirecting)
    for server in (target, first):
        threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{first.server_port}", there, seen
    finally:
        for server in (target, first):
            server.shutdown()
            server.server_close()


def _post(client: httpx.AsyncClient, url: str) -> httpx.Response:
    async def go() -> httpx.Response:
        async with client:
            return await client.post(f"{url}/mcp", json={})
    return asyncio.run(go())


def test_a_secret_header_is_never_sent_to_another_origin(
        servers: tuple[str, str, list[dict[str, str]]]) -> None:
    url, there, seen = servers
    client = direct_client({"X-Api-Key": "s3cret", "Authorization": "Bearer s3cret"},
                           secret_headers=frozenset({"X-Api-Key", "Authorization"}))
    with pytest.raises(SecretRedirectRefused) as refused:
        _post(client, url)
    assert str(refused.value) == (
        "the MCP server at 127.0.0.1 redirected a request carrying a Secret header "
        f"(Authorization, X-Api-Key) to {there}: not followed")
    assert seen == []


def test_a_server_without_secret_headers_is_followed_as_before(
        servers: tuple[str, str, list[dict[str, str]]]) -> None:
    url, _, seen = servers
    response = _post(direct_client({"X-Team": "support"}), url)
    assert response.status_code == 200
    assert [h.get("X-Team") for h in seen] == ["support"]
