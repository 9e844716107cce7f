"""Processes forked from a Python that has already imported their program.

A runner process spends about 1.6 s of CPU importing google-adk before it does anything,
and a test suite starts hundreds of them on two cores. On the development node, a runner
pod's process is instead forked from a server that imported the runner once: the child
is still a process of its own (its own pid, session, environment, working directory,
standard streams and exit code, all as the pod says), running the same program
(`python -m agentrun_runner`), only without paying for the imports again.

What the pod's process looks like from outside is what it would be if started afresh:
`/proc/<pid>/environ` and `/proc/<pid>/cmdline` show the pod's environment and command
(set with prctl(PR_SET_MM_MAP), which needs CAP_CHECKPOINT_RESTORE: root has it). Where
that cannot be done, or the server cannot fork safely (a thread already running after
the imports), `ForkServer.start` raises `Unavailable` and the caller starts processes the
ordinary way.

Isolation is the runner launcher's (runner-image/launcher/agentrun-runner.c): the server
runs Python isolated (`-I`: no PYTHON* variable, no user site, no script directory on
sys.path), started with an environment of its own, so nothing a pod's environment says
can change how code is loaded; the child then takes the pod's environment less the
variables the launcher removes (`vocabulary.LOADER_ENV*`, handed over by the caller), so
the processes it starts see what they would see under the launcher.

This file is also the server's program, run as a script by the Python it serves: its
server half imports nothing but the standard library and the program's modules.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import runpy
import selectors
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO

# -- the client half ------------------------------------------------------------------------


class Unavailable(RuntimeError):
    """Processes cannot be forked here; start them the ordinary way."""


class Forked:
    """A process the server forked: what the callers of subprocess.Popen use of one."""

    def __init__(self, connection: socket.socket, reader: BinaryIO, pid: int) -> None:
        """`reader`: the connection's reader that read the pid. The server's next line may
        already be in its buffer (a process that ended at once): a second reader of the
        connection would not see it, and a plain exit would read as the server's death."""
        self.pid = pid
        self.returncode: int | None = None
        self._connection = connection
        self._reader = reader
        self._ended = threading.Event()
        threading.Thread(target=self._await_exit, name=f"forked-{pid}", daemon=True).start()

    def _await_exit(self) -> None:
        reader = self._reader
        try:
            line = reader.readline()
            # The server's word; a server that died took its children with it (they die
            # with their parent), as SIGKILL would.
            self.returncode = int(json.loads(line)["exit"]) if line else -signal.SIGKILL
        finally:
            reader.close()
            self._connection.close()
            self._ended.set()

    def poll(self) -> int | None:
        return self.returncode if self._ended.is_set() else None

    def wait(self, timeout: float | None = None) -> int:
        if not self._ended.wait(timeout):
            raise subprocess.TimeoutExpired(f"forked process {self.pid}", timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if not self._ended.is_set():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class ForkServer:
    """A server that has imported what `module` imports (`preload`) and forks a process
    running `python -m <module>` for each `spawn`."""

    def __init__(self, python: Path, module: str, work: Path, *,
                 preload: Sequence[str] = (), flags: Sequence[str] = ("-I",),
                 env: Mapping[str, str] | None = None) -> None:
        self.python, self.module, self.work = python, module, work
        self.preload, self.flags = tuple(preload), tuple(flags)
        self.env = dict(env or {"PATH": os.environ.get("PATH", ""), "LANG": "C.UTF-8",
                                "HOME": os.environ.get("HOME", "/tmp")})
        self.socket_path = Path(tempfile.mkdtemp(prefix="agentrun-fork-")) / "server.sock"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 120) -> ForkServer:
        """Starts the server and waits until it has imported the program; raises
        Unavailable when it cannot serve (its log says why)."""
        self.work.mkdir(parents=True, exist_ok=True)
        log = open(self.work / f"forkserver-{self.module}.log", "ab")  # noqa: SIM115
        argv = [str(self.python), *self.flags, __file__, "--module", self.module,
                "--socket", str(self.socket_path), *(f"--preload={m}" for m in self.preload)]
        self.process = subprocess.Popen(
            argv, env=self.env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            preexec_fn=_die_with_parent)
        log.close()
        deadline = time.monotonic() + timeout
        while not self.socket_path.exists():
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise Unavailable(f"the fork server of {self.module} did not start: "
                                  f"{self._log_tail()}")
            time.sleep(0.05)
        return self

    def _log_tail(self) -> str:
        path = self.work / f"forkserver-{self.module}.log"
        return path.read_text(errors="replace")[-2000:] if path.exists() else ""

    def spawn(self, argv: Sequence[str], *, env: Mapping[str, str], cwd: Path | str,
              log_path: Path | str, shown_argv: Sequence[str] | None = None) -> Forked:
        """A new process running the module with `argv` as sys.argv (argv[0] becomes the
        module's path, as with -m), `env` as its whole environment, in `cwd`, its output
        appended to `log_path`, in a session of its own, killed when the server dies;
        /proc shows `shown_argv` (default `argv`) as its command line. Raises Unavailable
        when the server is gone."""
        request = {"argv": list(argv), "env": dict(env), "cwd": str(cwd),
                   "log": str(log_path), "shown": list(shown_argv or argv)}
        connection = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            connection.connect(str(self.socket_path))
            connection.sendall(json.dumps(request).encode() + b"\n")
            reader = connection.makefile("rb")
            answer = json.loads(reader.readline() or b"{}")
        except (OSError, ValueError) as e:
            connection.close()
            raise Unavailable(f"the fork server of {self.module} is gone: {e}") from e
        if "pid" not in answer:
            reader.close()
            connection.close()
            raise Unavailable(f"the fork server of {self.module} refused: "
                              f"{answer.get('error', 'no answer')}")
        return Forked(connection, reader, int(answer["pid"]))

    def stop(self) -> None:
        """Stops the server; its children die with it."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)
        with contextlib.suppress(OSError):
            self.socket_path.unlink()
        with contextlib.suppress(OSError):
            self.socket_path.parent.rmdir()


class Forks:
    """Fork servers of one program, started on first use: one per value of the variables
    its imports read (a module keeps what it read of the environment when it was imported:
    kubernetes.config its default KUBECONFIG), so that a child is forked only from a
    server that imported what a fresh process would have. Where a server cannot start,
    `for_env` answers None for good and the caller starts processes the ordinary way."""

    def __init__(self, python: Path, module: str, work: Path, *,
                 preload: Sequence[str] = (), flags: Sequence[str] = ("-I",),
                 read_at_import: Sequence[str] = ("KUBECONFIG",)) -> None:
        self.python, self.module, self.work = python, module, work
        self.preload, self.flags, self.read_at_import = preload, flags, tuple(read_at_import)
        self.servers: dict[tuple[str | None, ...], ForkServer] = {}
        self.unavailable = False
        self.lock = threading.Lock()

    def for_env(self, env: Mapping[str, str]) -> ForkServer | None:
        """The server for a process whose whole environment is `env`, or None."""
        key = tuple(env.get(name) for name in self.read_at_import)
        with self.lock:
            if self.unavailable:
                return None
            found = self.servers.get(key)
            if found is None or (found.process is not None and found.process.poll() is not None):
                try:
                    found = self.servers[key] = ForkServer(
                        self.python, self.module, self.work, preload=self.preload,
                        flags=self.flags, env=env).start()
                except Unavailable:
                    self.unavailable = True
                    return None
            return found

    def stop(self) -> None:
        for server in self.servers.values():
            server.stop()


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    os.setsid()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


# -- the server half ------------------------------------------------------------------------

_PR_SET_MM, _PR_SET_MM_MAP = 35, 14


class _MMMap(ctypes.Structure):
    """struct prctl_mm_map (include/uapi/linux/prctl.h)."""

    _fields_ = [*((name, ctypes.c_uint64) for name in (
        "start_code", "end_code", "start_data", "end_data", "start_brk", "brk",
        "start_stack", "arg_start", "arg_end", "env_start", "env_end")),
        ("auxv", ctypes.c_void_p), ("auxv_size", ctypes.c_uint32), ("exe_fd", ctypes.c_uint32)]


# The blocks /proc shows must outlive the call: the kernel keeps only their addresses.
_shown: list[Any] = []


def show_as(argv: Sequence[str], env: Mapping[str, str]) -> None:
    """Makes /proc/self/cmdline and /proc/self/environ show `argv` and `env`, as for a
    process that was started with them. Raises OSError when the kernel refuses."""
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.sbrk.restype = ctypes.c_void_p
    fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()

    def field(number: int) -> int:  # proc(5) numbers the fields from 1; these start at 3
        return int(fields[number - 3])

    blocks = []
    for items in (argv, [f"{k}={v}" for k, v in env.items()]):
        data = b"".join(item.encode("utf-8", "surrogateescape") + b"\0" for item in items)
        block = ctypes.create_string_buffer(data or b"\0", len(data) or 1)
        _shown.append(block)
        blocks.append((ctypes.addressof(block), ctypes.addressof(block) + len(data)))
    (arg_start, arg_end), (env_start, env_end) = blocks
    mm = _MMMap(start_code=field(26), end_code=field(27), start_data=field(45),
                end_data=field(46), start_brk=field(47), brk=libc.sbrk(0) or field(47),
                start_stack=field(28), arg_start=arg_start, arg_end=arg_end,
                env_start=env_start, env_end=env_end, auxv=None, auxv_size=0,
                exe_fd=0xFFFFFFFF)
    if libc.prctl(_PR_SET_MM, _PR_SET_MM_MAP, ctypes.byref(mm), ctypes.sizeof(mm), 0) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"prctl(PR_SET_MM_MAP): {os.strerror(errno)}")


def _child(module: str, request: dict[str, Any], ready: int) -> None:
    """In the forked child: become the pod's process, say so on `ready`, run the program,
    exit with its code."""
    code = 1
    try:
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        os.setsid()
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log, 1)
        os.dup2(log, 2)
        # Nothing of the server's stays open (its socket, its other children's connections)
        # but the pipe that says when this process is what it will be seen as.
        os.closerange(3, ready)
        os.closerange(ready + 1, os.sysconf("SC_OPEN_MAX"))
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        show_as(request["shown"], request["env"])
        os.write(ready, b"+")
        os.close(ready)
        sys.argv = list(request["argv"])
        try:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
            if not isinstance(e.code, int) and e.code is not None:
                print(e.code, file=sys.stderr)
        except KeyboardInterrupt:
            code = 128 + signal.SIGINT
        except BaseException:
            import traceback

            traceback.print_exc()
            code = 1
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def serve(module: str, socket_path: str, preload: Sequence[str]) -> None:
    """Imports what the program imports (`preload`), then forks one child per request; the
    request's connection gets {"pid": N} once the child shows as asked, and {"exit": code}
    when it ends (a negative code: the signal that ended it, as subprocess reports it)."""
    # The program itself runs in each child (`-m module`); what it imports comes first.
    for name in preload:
        importlib.import_module(name)
    if threading.active_count() > 1:
        raise SystemExit(f"cannot fork: {threading.active_count() - 1} threads run after the "
                         f"imports of {module}")
    # Can this process show a child as the pod's own? Try it on a throwaway child.
    probe = os.fork()
    if probe == 0:
        try:
            show_as(["probe"], {"PROBE": "1"})
            os._exit(0)
        except OSError as e:
            print(f"cannot show a forked process as started afresh: {e}", flush=True)
            os._exit(1)
    _, status = os.waitpid(probe, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(1)

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    staging = socket_path + ".new"
    listener.bind(staging)
    listener.listen(64)
    os.rename(staging, socket_path)  # the client waits for the name: bound and listening
    reaped_r, reaped_w = os.pipe()
    os.set_blocking(reaped_w, False)
    signal.set_wakeup_fd(reaped_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(reaped_r, selectors.EVENT_READ, "reap")
    children: dict[int, socket.socket] = {}
    print(f"event=fork-server-ready module={module} pid={os.getpid()}", flush=True)
    while True:
        for key, _ in selector.select():
            if key.data == "accept":
                connection, _ = listener.accept()
                connection.setblocking(True)
                reader = connection.makefile("rb")
                line = reader.readline()
                reader.close()
                try:
                    request = json.loads(line)
                except ValueError:
                    connection.close()
                    continue
                ready_r, ready_w = os.pipe()
                pid = os.fork()
                if pid == 0:
                    _child(module, request, ready_w)
                os.close(ready_w)
                # The pid is given once /proc shows the process as the caller asked (or the
                # child has failed before: its exit says how).
                with contextlib.suppress(OSError):
                    os.read(ready_r, 1)
                os.close(ready_r)
                children[pid] = connection
                connection.sendall(json.dumps({"pid": pid}).encode() + b"\n")
            else:
                with contextlib.suppress(BlockingIOError):
                    os.read(reaped_r, 4096)
                while children:
                    try:
                        pid, status = os.waitpid(-1, os.WNOHANG)
                    except ChildProcessError:
                        break
                    if pid == 0:
                        break
                    ended = children.pop(pid, None)
                    if ended is not None:
                        with contextlib.suppress(OSError):
                            ended.sendall(json.dumps(
                                {"exit": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
                        ended.close()


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--module", required=True)
    parser.add_argument("--socket", required=True)
    parser.add_argument("--preload", action="append", default=[])
    options = parser.parse_args()
    serve(options.module, options.socket, options.preload)
