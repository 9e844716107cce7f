"""Child processes that never outlive their owner.

Every server the test suite or the development cluster starts (etcd, kube-apiserver, ...,
Postgres, runner processes) goes through here: each child runs in its own process group,
and the group is killed when it is stopped, when the owner exits, or when the owner is
interrupted. On Linux the child also gets PR_SET_PDEATHSIG, so that even a SIGKILLed
owner leaves nothing behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import pwd
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from agentrun_devtools.forkserver import Forked, ForkServer

_PR_SET_PDEATHSIG = 1


def child_setup(user: str | None = None, die_with_parent: bool = True) -> Callable[[], None]:
    """What runs in the child between fork and exec: a process group of its own, an
    optional change of user, and death with the parent."""
    entry = pwd.getpwnam(user) if user else None

    def setup() -> None:
        os.setsid()
        if entry is not None:
            os.setgroups([])
            os.setgid(entry.pw_gid)
            os.setuid(entry.pw_uid)
        if die_with_parent:
            # After setuid: a credential change clears the parent-death signal.
            with contextlib.suppress(OSError, AttributeError):
                ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)

    return setup


def free_port() -> int:
    """A loopback TCP port that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class ProcessDied(RuntimeError):
    """A server exited while we waited for it: waiting longer is pointless."""


def wait_for(
    check: Callable[[], bool], *, timeout: float, what: str, interval: float = 0.1
) -> None:
    """Polls `check` until it is true; raises TimeoutError naming `what` otherwise.
    Errors raised by `check` count as "not yet", except ProcessDied."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except ProcessDied:
            raise
        except Exception:
            pass
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not ready after {timeout:.0f}s")
        time.sleep(interval)


def start_ticks(pid: int) -> int | None:
    """When process `pid` started (clock ticks since boot: field 22 of /proc/<pid>/stat),
    or None when no process has that number."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def signal_group(leader: int, started: int | None, sig: int) -> None:
    """Sends `sig` to the process group that `leader` (started at `started`, start_ticks)
    made, and never to another group of the same number.

    The leader may be gone and its group left with its descendants. While a member lives,
    Linux gives the number to no new process; once none does, a new process may get it
    and make a group of its own (the runner processes and fork servers here each do). So:
    when a process holds the number and is not the leader (it started at another time, or
    the leader's start was never seen), the group is someone else's and is left alone.
    Without this, stopping a process that ended minutes ago killed whichever group had
    been given its number since (pids wrap at 32,768 here)."""
    holder = start_ticks(leader)
    if holder is not None and holder != started:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(leader, sig)


class Child:
    """One started server process with its log file."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        log_path: Path,
        *,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        user: str | None = None,
        die_with_parent: bool = True,
        forks: ForkServer | None = None,
    ) -> None:
        """`forks`: a fork server that has imported this program (argv[0] names the
        program's command, argv[1:] are its arguments): the process is forked from it
        instead of started afresh (not with `user`)."""
        self.name = name
        self.log_path = log_path
        log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log = open(log_path, "ab")  # noqa: SIM115 - owned by the Child
        self.process: subprocess.Popen[bytes] | Forked
        if forks is not None and user is None:
            self.process = forks.spawn([forks.module, *argv[1:]], shown_argv=list(argv),
                                       env=dict(os.environ if env is None else env),
                                       cwd=cwd or Path.cwd(), log_path=log_path)
            self._started = start_ticks(self.process.pid)
            return
        self.process = subprocess.Popen(
            list(argv),
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            cwd=cwd,
            preexec_fn=child_setup(user, die_with_parent),
        )
        self._started = start_ticks(self.process.pid)

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def stop(self, grace: float = 5.0) -> None:
        """SIGTERM the whole process group, then SIGKILL what is left after `grace`."""
        if self.process.poll() is None:
            signal_group(self.process.pid, self._started, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(grace)
        # The group may hold grandchildren even after the leader exited.
        signal_group(self.process.pid, self._started, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(5)
        self._log.close()


def pids_alive(pids: Sequence[int]) -> list[int]:
    """The pids among `pids` that still exist and are not zombies."""
    alive = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            continue
        if state != "Z":
            alive.append(pid)
    return alive


def running_pid(pid_file: Path) -> int | None:
    """The pid a supervisor wrote to `pid_file`, if that process still runs."""
    try:
        pid = int(pid_file.read_text())
    except (OSError, ValueError):
        return None
    return pid if pids_alive([pid]) else None


def stop_pid(pid: int, *, timeout: float, what: str, group: bool = False) -> None:
    """SIGTERM, then SIGKILL (the process group with `group`) if it outlives `timeout`."""
    if not pids_alive([pid]):
        return
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    try:
        wait_for(lambda: not pids_alive([pid]), timeout=timeout, what=what)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            (os.killpg if group else os.kill)(pid, signal.SIGKILL)
