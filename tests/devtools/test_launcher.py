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
from agentrun_devtools.processes import Child, pids_alive, wait_for


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


def test_stopping_a_child_that_ended_kills_what_is_left_of_its_group(tmp_path: Path) -> None:
    """The leader gone, a descendant it left in its group is still stopped with it."""
    left = tmp_path / "left.pid"
    child = Child("leaves", ["sh", "-c", f"sleep 60 & echo $! > {left}; exit 0"],
                  tmp_path / "leaves.log")
    assert child.process.wait(10) == 0
    wait_for(lambda: left.exists() and left.read_text().strip() != "", timeout=10,
             what="the descendant's pid")
    descendant = int(left.read_text())
    assert pids_alive([descendant]) == [descendant]
    child.stop()
    wait_for(lambda: pids_alive([descendant]) == [], timeout=10, what="the descendant gone")


def test_stopping_a_child_that_ended_leaves_a_group_that_took_its_number_alone(
        tmp_path: Path) -> None:
    """Once nothing of a group lives, Linux may give its number to a new process, which
    may make a group of its own (pids wrap at 32,768 on these machines). Stopping the
    Child that ended long ago must not kill that group: here the number is made to name
    another process's group, as a wrap would."""
    child = Child("short", ["sh", "-c", "exit 0"], tmp_path / "short.log")
    assert child.process.wait(10) == 0
    # A start time is counted in clock ticks (10 ms): a number given again after a wrap
    # goes to a process started ticks later, never in the same one. Started in the same
    # tick, the two could not be told apart (the test failed so, once, on a loaded machine).
    time.sleep(3 / os.sysconf("SC_CLK_TCK"))
    other = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        child.process.pid = other.pid  # the number, given again to another group's leader
        child.stop()
        time.sleep(0.5)
        assert other.poll() is None, "another process's group was killed"
    finally:
        other.kill()
        other.wait(10)
