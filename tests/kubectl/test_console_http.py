"""The console's door, tried with plain HTTP requests against `kubectl agentrun console`
itself: nothing without its token; the token is exchanged once for a cookie named after
the port; a foreign Host is refused (DNS rebinding); a state change needs the cookie AND a
same-origin header. No cluster is needed to be refused: the kubeconfig here points at a
port where nothing listens, so whatever got past the door says it cannot reach it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from agentrun_kubectl.console import guard

from tests.kubectl.console import Console, console, http

NOWHERE = """apiVersion: v1
kind: Config
clusters: [{name: nowhere, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: someone, user: {token: nothing}}]
contexts: [{name: nowhere, context: {cluster: nowhere, user: someone, namespace: team-a}}]
current-context: nowhere
"""


@pytest.fixture(scope="module")
def door(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    kubeconfig = Path(tmp_path_factory.mktemp("console")) / "kubeconfig"
    kubeconfig.write_text(NOWHERE)
    with console(kubeconfig) as served:
        yield served


def cookie(door: Console, value: str | None = None) -> dict[str, str]:
    return {"Cookie": f"{guard.cookie_name(door.port)}={value or door.token}"}


def test_without_the_token_every_path_answers_401(door: Console) -> None:
    for path in ("/", "/runs", "/runs/team-a/x", "/approvals", "/cost", "/api/runs",
                 "/api/session", "/assets/anything.js", "/nothing-here"):
        answer = http(door.base + path)
        assert answer.status == 401, (path, answer)
        assert "kubectl agentrun console" in json.loads(answer.body)["error"]
    assert http(f"{door.base}/runs?token=not-it").status == 401
    # Another console's cookie (another port's name) is no key to this one.
    other = {"Cookie": f"{guard.cookie_name(door.port + 1)}={door.token}"}
    assert http(f"{door.base}/runs", headers=other).status == 401
    assert http(f"{door.base}/runs", headers=cookie(door, "guess")).status == 401


def test_the_printed_url_sets_the_cookie_and_leaves_the_token_out_of_the_address(
        door: Console) -> None:
    assert door.url.startswith(f"http://127.0.0.1:{door.port}/runs?token=")
    answer = http(door.url)
    assert answer.status == 303
    assert answer.headers["Location"] == "/runs"
    set_cookie = answer.headers["Set-Cookie"]
    assert set_cookie.startswith(f"{guard.cookie_name(door.port)}={door.token};")
    assert "HttpOnly" in set_cookie and "SameSite=Strict" in set_cookie
    page = http(f"{door.base}/runs", headers=cookie(door))
    assert page.status == 200 and '<div id="app">' in page.body
    assert "default-src 'self'" in page.headers["Content-Security-Policy"]
    assert page.headers["X-Frame-Options"] == "DENY"
    # Its assets are the package's own files, no CDN.
    script = page.body.split('src="', 1)[1].split('"', 1)[0]
    assert script.startswith("/assets/")
    assert http(door.base + script, headers=cookie(door)).status == 200
    assert "http" not in page.body.replace('charset="utf-8"', "")


def test_a_foreign_host_is_refused_even_with_the_cookie(door: Console) -> None:
    for host in ("evil.example", f"evil.example:{door.port}", f"127.0.0.1:{door.port + 1}",
                 f"rebound.example:{door.port}"):
        answer = http(f"{door.base}/runs", headers={**cookie(door), "Host": host})
        assert answer.status == 403, (host, answer)
        assert "answers only to" in json.loads(answer.body)["error"]
        exchanged = http(door.url, headers={"Host": host})
        assert exchanged.status == 403 and "Set-Cookie" not in exchanged.headers
    assert http(f"{door.base}/runs", headers={**cookie(door),
                                              "Host": f"localhost:{door.port}"}).status == 200


def test_a_state_change_needs_the_cookie_and_the_same_origin(door: Console) -> None:
    cancel = f"{door.base}/api/runs/team-a/triage-42/cancel"
    body = json.dumps({"note": "stop"}).encode()
    json_type = {"Content-Type": "application/json"}
    for headers in ({}, {"Origin": "http://evil.example"},
                    {"Origin": f"http://127.0.0.1:{door.port + 1}"},
                    {"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-site"}):
        answer = http(cancel, method="POST", body=body,
                      headers={**cookie(door), **json_type, **headers})
        assert answer.status == 403, (headers, answer)
        assert "same origin" in json.loads(answer.body)["error"]
    # Same origin but no cookie: 401.
    answer = http(cancel, method="POST", body=body,
                  headers={**json_type, "Origin": f"http://127.0.0.1:{door.port}"})
    assert answer.status == 401
    # Past the door, the request goes to the cluster as the user: here, nowhere.
    for headers in ({"Origin": f"http://127.0.0.1:{door.port}"},
                    {"Sec-Fetch-Site": "same-origin"}):
        answer = http(cancel, method="POST", body=body,
                      headers={**cookie(door), **json_type, **headers})
        assert answer.status == 502, answer
        assert "cannot reach the Kubernetes API server" in json.loads(answer.body)["error"]


def test_ctrl_c_stops_it_also_when_started_with_sigint_ignored(tmp_path: Path) -> None:
    """A background job of a script inherits SIGINT ignored, and Python then raises no
    KeyboardInterrupt: the console's own handler stops it (console() raises if not)."""
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(NOWHERE)
    with console(kubeconfig, sigint_ignored=True) as served:
        assert http(served.base + "/runs").status == 401
    assert served.process.returncode == 0
