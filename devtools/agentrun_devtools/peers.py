"""The peers' own code, for the tests where a peer's behaviour is the contract.

devtools/peers/build.sh builds two small Go commands from the module proxy (cached
outside the checkout, like the control plane): `argocd-health`, over Argo CD's health-check
code (how Argo CD runs the chart's health.lua scripts), and `kstatus`, over cli-utils'
kstatus (how Flux and cli-utils read our conditions). Both read objects as JSON on stdin
and answer one JSON line per object; this module starts them and reads the answers. A
third, `kubelet-expansion`, over the kubelet's own `$(VAR)` expansion
(k8s.io/kubernetes/third_party/forked/golang/expansion, at the control plane's release),
expands a container's env, command and args for the development node (`expand`).
"""

from __future__ import annotations

import atexit
import datetime
import functools
import json
import os
import subprocess
import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrun_devtools.controlplane import REPO, built

BUILD_SCRIPT = REPO / "devtools" / "peers" / "build.sh"


@functools.cache
def binaries() -> Path:
    """The directory holding argocd-health and kstatus, building them on first use (once
    per process: the tests call the commands thousands of times)."""
    return built(BUILD_SCRIPT, "AGENTRUN_PEERS_BIN")


@functools.cache
def expansion_binary() -> Path:
    """The kubelet-expansion command, building it on first use. It has a cache key of its
    own (`build.sh kubelet-expansion`): the development node needs it, Argo CD not."""
    given = os.environ.get("AGENTRUN_KUBELET_EXPANSION")
    if given:
        return Path(given)
    done = subprocess.run(["bash", str(BUILD_SCRIPT), "kubelet-expansion"], check=True,
                          stdout=subprocess.PIPE, text=True)
    return Path(done.stdout.strip().splitlines()[-1]) / "kubelet-expansion"


@dataclass(frozen=True)
class Expanded:
    """A container's env (in its order, duplicates kept), command and args as the kubelet
    hands them to the container runtime."""

    env: list[tuple[str, str]]
    command: list[str]
    args: list[str]


def expand(env: Sequence[tuple[str, str, bool]], command: Sequence[str] = (),
           args: Sequence[str] = (), timeout: float = 30) -> Expanded:
    """`env` (name, value, resolved) expanded as the kubelet does: a value is expanded
    against the variables before it, a `resolved` one (a valueFrom the caller looked up)
    is taken as it is; command and args against the whole resolved env."""
    document = {"env": [{"name": n, "resolved": v} if resolved else {"name": n, "value": v}
                        for n, v, resolved in env],
                "command": list(command), "args": list(args)}
    done = subprocess.run([str(expansion_binary())], input=json.dumps(document),
                          capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"kubelet-expansion exited {done.returncode}: {done.stderr.strip()}")
    out = json.loads(done.stdout)
    return Expanded(env=[(e["name"], e["value"]) for e in out["env"]],
                    command=list(out["command"]), args=list(out["args"]))


def _jsonable(value: Any) -> Any:
    # YAML read by PyYAML turns timestamps into datetimes; the API server would have sent
    # them as RFC 3339 strings, which is what the peers must see.
    if isinstance(value, datetime.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=datetime.UTC)
        return value.isoformat().replace("+00:00", "Z")
    if isinstance(value, datetime.date):
        return value.isoformat()
    raise TypeError(f"{type(value).__name__} is not JSON")


def run(command: str, args: Sequence[str] = (), objects: Iterable[Any] = (),
        timeout: float = 60) -> list[dict[str, Any]]:
    """What `command` (argocd-health or kstatus) answers, one decoded JSON value per line
    of its output, for `objects` sent one per line on its stdin."""
    lines = "".join(json.dumps(o, default=_jsonable) + "\n" for o in objects)
    done = subprocess.run([str(binaries() / command), *args], input=lines,
                          capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{command} {' '.join(args)} exited {done.returncode}: "
                           f"{done.stderr.strip()}")
    decoder = json.JSONDecoder()
    out: list[dict[str, Any]] = []
    text, at = done.stdout, 0
    # argocd-health --tests prints one indented document, the stdin mode one line each.
    while at < len(text.rstrip()):
        value, at = decoder.raw_decode(text, at)
        out.append(value)
        while at < len(text) and text[at].isspace():
            at += 1
    return out


class Session:
    """One long-lived `command` answering objects one at a time on its stdin (the stdin
    mode of argocd-health, whose start-up is most of a second), for callers that ask
    about one object at a time, many times over."""

    def __init__(self, command: str, args: Sequence[str] = ()) -> None:
        self.what = f"{command} {' '.join(args)}"
        self._lock = threading.Lock()
        self._process = subprocess.Popen(
            [str(binaries() / command), *args], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, bufsize=1)
        atexit.register(self.close)

    def ask(self, obj: Any) -> dict[str, Any]:
        """The command's answer about `obj`."""
        process = self._process
        assert process.stdin is not None and process.stdout is not None
        with self._lock:
            process.stdin.write(json.dumps(obj, default=_jsonable) + "\n")
            process.stdin.flush()
            line = process.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.what} exited {process.wait(timeout=10)} without answering")
        answer: dict[str, Any] = json.loads(line)
        return answer

    def close(self) -> None:
        """End the command by closing its stdin, as it ends when its input does."""
        if self._process.stdin is not None and not self._process.stdin.closed:
            self._process.stdin.close()
        self._process.wait(timeout=30)
