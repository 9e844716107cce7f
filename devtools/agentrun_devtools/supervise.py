"""Programs in the foreground as one: `make run`'s operator and store API.

    python -m agentrun_devtools.supervise 'NAME: COMMAND' ['NAME: COMMAND' ...]

Starts each COMMAND (split into words as a shell would, with no shell), each in its own
process group and dying with this process (processes.child_setup), and prints their
output line by line, each line behind its program's name. It stops them all (SIGTERM to
each group, SIGKILL to what is left after a grace) on SIGINT (Ctrl-C) or SIGTERM, or as
soon as one of them exits, and then exits itself: with the code of the program that ended
first, or 128 + the signal's number.

A program is one argument: the Makefile lists `make run`'s one a line (RUN_PROGRAMS), so
another program is another line there. Python rather than the shell's `wait -n` and
`trap`: process groups, the grace before SIGKILL and the labelled lines are a few lines
here, and tests/devtools/test_supervise.py runs them.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import BinaryIO

from agentrun_devtools.processes import child_setup

GRACE_SECONDS = 10.0


@dataclass(frozen=True)
class Program:
    name: str
    argv: tuple[str, ...]


def program(spec: str) -> Program:
    """`NAME: COMMAND` as a Program; ValueError saying the form when it is not one."""
    name, colon, command = spec.partition(":")
    try:
        argv = tuple(shlex.split(command))
    except ValueError as e:
        raise ValueError(f"{spec!r}: {e}") from None
    if not colon or not name.strip() or not argv or " " in name.strip():
        raise ValueError(f"{spec!r}: a program is 'NAME: COMMAND'")
    return Program(name.strip(), argv)


async def _relay(prefix: bytes, stream: asyncio.StreamReader, out: BinaryIO) -> None:
    """The program's output, a whole line at a time, each behind `prefix`."""
    pending = b""
    while chunk := await stream.read(65536):
        *lines, pending = (pending + chunk).split(b"\n")
        out.write(b"".join(prefix + line + b"\n" for line in lines))
        out.flush()
    if pending:
        out.write(prefix + pending + b"\n")
        out.flush()


async def _stop(processes: Sequence[asyncio.subprocess.Process], grace: float) -> None:
    """SIGTERM to every group still there; SIGKILL to those left after `grace`."""
    for process in processes:
        if process.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
    waits = [asyncio.create_task(p.wait()) for p in processes]
    if waits:
        await asyncio.wait(waits, timeout=grace)
    for process in processes:
        # The group may hold grandchildren even after its leader exited.
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
    if waits:
        await asyncio.wait(waits)


async def supervise(programs: Sequence[Program], *, grace: float = GRACE_SECONDS,
                    out: BinaryIO | None = None) -> int:
    """Runs `programs` until a signal or until one of them exits; see the module."""
    output = out if out is not None else sys.stdout.buffer
    width = max(len(p.name) for p in programs)

    def say(text: str) -> None:
        output.write(f"{'':<{width}} | {text}\n".encode())
        output.flush()

    loop = asyncio.get_running_loop()
    signalled: list[int] = []
    stopping = asyncio.Event()

    def on_signal(signum: int) -> None:
        signalled.append(signum)
        stopping.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, on_signal, signum)
    started: list[tuple[Program, asyncio.subprocess.Process]] = []
    relays: list[asyncio.Task[None]] = []
    code = 0
    try:
        for p in programs:
            try:
                process = await asyncio.create_subprocess_exec(
                    *p.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT, preexec_fn=child_setup())
            except OSError as e:
                say(f"{p.name} did not start ({shlex.join(p.argv)}): {e}")
                return 127
            assert process.stdout is not None
            started.append((p, process))
            relays.append(asyncio.create_task(
                _relay(f"{p.name:<{width}} | ".encode(), process.stdout, output)))
        ended = {asyncio.create_task(process.wait()): p for p, process in started}
        signal_seen = asyncio.create_task(stopping.wait())
        done, _ = await asyncio.wait([*ended, signal_seen], return_when=asyncio.FIRST_COMPLETED)
        first = next((t for t in ended if t in done), None)
        if first is not None:
            code = first.result()
            others = ", ".join(p.name for p in programs if p is not ended[first])
            say(f"{ended[first].name} exited with code {code}" +
                (f"; stopping {others}" if others else ""))
            code = code if code >= 0 else 128 - code
        else:
            code = 128 + signalled[0]
            say(f"{signal.Signals(signalled[0]).name}: stopping "
                + ", ".join(p.name for p, _ in started))
        for task in [*ended, signal_seen]:
            task.cancel()
    finally:
        await _stop([process for _, process in started], grace)
        if relays:
            await asyncio.gather(*relays, return_exceptions=True)
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
    return code


def main(argv: list[str] | None = None) -> int:
    specs = sys.argv[1:] if argv is None else argv
    try:
        programs = [program(spec) for spec in specs]
    except ValueError as e:
        print(f"agentrun_devtools.supervise: {e}", file=sys.stderr)
        return 2
    if not programs:
        print("usage: python -m agentrun_devtools.supervise 'NAME: COMMAND' ...",
              file=sys.stderr)
        return 2
    names = [p.name for p in programs]
    if len(set(names)) != len(names):
        print(f"agentrun_devtools.supervise: two programs of one name: {names}",
              file=sys.stderr)
        return 2
    return asyncio.run(supervise(programs))


if __name__ == "__main__":
    sys.exit(main())
