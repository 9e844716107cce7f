"""The test control plane leaves nothing behind: neither when stopped, nor when its owner
is killed outright."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from agentrun_devtools.controlplane import REPO, ControlPlane
from agentrun_devtools.processes import pids_alive, wait_for


def test_stop_leaves_no_process(tmp_path: Path) -> None:
    plane = ControlPlane(tmp_path / "cp", controller_manager=False, scheduler=False).start()
    pids = plane.pids()
    assert len(pids_alive(pids)) == 2  # etcd, kube-apiserver
    assert plane.kubectl("get", "--raw", "/readyz").stdout.strip() == "ok"
    plane.stop()
    assert pids_alive(pids) == []
    assert not (tmp_path / "cp").exists()


def test_owner_killed_with_sigkill_leaves_no_process(tmp_path: Path) -> None:
    """An interrupted test run (the owner SIGKILLed, no cleanup code runs at all) still
    takes etcd and kube-apiserver down with it."""
    pid_file = tmp_path / "pids"
    owner = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import sys, time
            sys.path.insert(0, {str(REPO / 'devtools')!r})
            from pathlib import Path
            from agentrun_devtools.controlplane import ControlPlane
            # Under tmp_path: nothing of the SIGKILLed owner removes its state directory.
            plane = ControlPlane(Path({str(tmp_path / 'cp')!r}), controller_manager=False,
                                 scheduler=False).start()
            open({str(pid_file)!r}, "w").write(" ".join(map(str, plane.pids())))
            time.sleep(600)
        """)],
        env={**os.environ},
    )
    try:
        wait_for(lambda: pid_file.exists() and pid_file.read_text() != "", timeout=120,
                 what="control plane in the owner process")
        pids = [int(p) for p in pid_file.read_text().split()]
        assert len(pids_alive(pids)) == 2
        os.kill(owner.pid, signal.SIGKILL)
        owner.wait(10)
        deadline = time.monotonic() + 10
        while pids_alive(pids) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert pids_alive(pids) == []
    finally:
        if owner.poll() is None:
            owner.kill()
