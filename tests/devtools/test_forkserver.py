"""Processes forked from an imported program (agentrun_devtools.forkserver), as the
development node starts runner pods: each is a process of its own that /proc, signals and
exit codes see as if it had been started afresh with the command and environment asked for."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agentrun_devtools.forkserver import ForkServer, Unavailable

PROBE = """
import json, os, sys, time
print(json.dumps({"argv": sys.argv, "cwd": os.getcwd(), "env": dict(os.environ),
                  "pgid": os.getpgid(0), "pid": os.getpid(),
                  "imported_before": "probe_imported_once" in sys.modules}), flush=True)
if "--sleep" in sys.argv:
    time.sleep(120)
sys.exit(int(os.environ.get("CODE", "0")))
"""


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ForkServer]:
    code = tmp_path / "code"
    code.mkdir()
    (code / "probe.py").write_text(PROBE)
    (code / "probe_imported_once.py").write_text("")
    started = ForkServer(Path(sys.executable), "probe", tmp_path / "work", flags=(),
                         preload=["probe_imported_once"],
                         env={"PATH": os.environ["PATH"], "PYTHONPATH": str(code)}).start()
    try:
        yield started
    finally:
        started.stop()


def _said(log: Path) -> dict[str, Any]:
    return dict(json.loads(log.read_text().splitlines()[0]))


def _until_said(log: Path, child: Any) -> None:
    """Until the child has printed its line (or ended): a signal sent before it ran its
    first line would leave nothing to read."""
    deadline = time.monotonic() + 30
    while not (log.exists() and log.read_text().strip()) and child.poll() is None:
        if time.monotonic() > deadline:
            raise AssertionError(f"the child printed nothing in 30 s: {log}")
        time.sleep(0.02)


def test_a_forked_process_is_what_was_asked_for(server: ForkServer, tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    env = {"ONLY": "this", "CODE": "3"}
    shown = ["/usr/bin/python3", "-I", "-m", "probe", "--flag"]

    child = server.spawn(["probe", "--flag", "--sleep"], env=env, cwd=tmp_path, log_path=log,
                         shown_argv=shown)
    try:
        # What /proc shows once spawn has returned: the pod's own command and environment.
        cmdline = Path(f"/proc/{child.pid}/cmdline").read_bytes().split(b"\0")[:-1]
        environ = Path(f"/proc/{child.pid}/environ").read_bytes().split(b"\0")[:-1]
        assert [a.decode() for a in cmdline] == shown
        assert [e.decode() for e in environ] == ["ONLY=this", "CODE=3"]
        assert child.poll() is None
        _until_said(log, child)
    finally:
        child.terminate()
    assert child.wait(30) == -signal.SIGTERM

    said = _said(log)
    assert said["argv"][1:] == ["--flag", "--sleep"]
    assert said["argv"][0].endswith("probe.py")  # as `python -m probe` sets it
    assert said["env"] == env
    assert said["cwd"] == str(tmp_path)
    assert said["pgid"] == said["pid"] == child.pid  # a session of its own
    assert said["imported_before"] is True  # the server's imports, not the child's


def test_the_exit_code_is_the_programs(server: ForkServer, tmp_path: Path) -> None:
    done = server.spawn(["probe"], env={"CODE": "7"}, cwd=tmp_path, log_path=tmp_path / "a.log")
    assert done.wait(30) == 7
    assert server.spawn(["probe"], env={}, cwd=tmp_path,
                        log_path=tmp_path / "b.log").wait(30) == 0


def test_children_die_with_the_server(server: ForkServer, tmp_path: Path) -> None:
    child = server.spawn(["probe", "--sleep"], env={}, cwd=tmp_path,
                         log_path=tmp_path / "c.log")
    assert server.process is not None
    server.process.kill()

    assert child.wait(30) == -signal.SIGKILL
    deadline = time.monotonic() + 10
    while Path(f"/proc/{child.pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{child.pid}").exists()
    with pytest.raises(Unavailable):
        server.spawn(["probe"], env={}, cwd=tmp_path, log_path=tmp_path / "d.log")
