"""`kubectl agentrun console` as a user starts it: a process of its own on a free port,
the URL it prints (with its token), and Ctrl-C to stop it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from agentrun_devtools.processes import free_port

BIN = Path(sys.executable).parent  # the console script kubectl-agentrun
URL = re.compile(r"(http://127\.0\.0\.1:\d+/\S*token=\S+)")
# The flags the machine's Chromium needs here (no sandbox as root, no calls home).
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--no-first-run",
                  "--disable-quic"]


@dataclass
class Console:
    url: str  # as printed: with ?token=
    port: int
    process: subprocess.Popen[str]

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def token(self) -> str:
        return self.url.split("token=", 1)[1]


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextmanager
def console(kubeconfig: Path, *args: str, kubectl: Path | None = None,
            sigint_ignored: bool = False) -> Iterator[Console]:
    """`kubectl agentrun console --port P ARGS` (through `kubectl` when given, else the
    console script itself), until the URL is printed; stopped with Ctrl-C after (raises
    when it is still there 10 s later). `sigint_ignored`: started as a script's
    background job is, with SIGINT ignored."""
    port = free_port()
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
           "KUBECONFIG": str(kubeconfig)}
    env.pop("DATABASE_URL", None)
    argv = [str(kubectl), "agentrun"] if kubectl else [str(BIN / "kubectl-agentrun")]
    process = subprocess.Popen([*argv, "console", "--port", str(port), *args], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               preexec_fn=_ignore_sigint if sigint_ignored else None)
    said: list[str] = []
    found = threading.Event()

    def read() -> None:
        assert process.stdout is not None
        for line in process.stdout:
            said.append(line)
            if URL.search(line):
                found.set()

    threading.Thread(target=read, daemon=True).start()
    try:
        if not found.wait(30):
            raise AssertionError(f"the console printed no URL in 30 s: {''.join(said)}")
        match = next(m for m in map(URL.search, said) if m)
        yield Console(match.group(1), port, process)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            raise AssertionError("the console did not stop on Ctrl-C") from None


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: str


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: object, **kw: object) -> None:
        return None


def http(url: str, *, method: str = "GET", headers: dict[str, str] | None = None,
         body: bytes | None = None) -> Answer:
    """One plain HTTP request, redirects not followed."""
    opener = urllib.request.build_opener(_NoRedirect)
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with opener.open(request, timeout=30) as response:
            return Answer(response.status, dict(response.headers), response.read().decode())
    except urllib.error.HTTPError as e:
        return Answer(e.code, dict(e.headers), e.read().decode())
