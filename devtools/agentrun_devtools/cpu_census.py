"""Where a test run's CPU goes, by program: the kernel's process accounting (every process
that ended, with its own CPU time) joined with what a sampler saw of each pid's command line.

    python -m agentrun_devtools.cpu_census start DIR   # accton on, sampler in the background
    ... run the tests ...
    python -m agentrun_devtools.cpu_census report DIR  # accton off, the table

Python's processes are told apart by their command line (a runner, the store API, the
operator, pytest are all `python3`); every other program goes by its executable's name, as
does a process that ended before the sampler saw it. Only Python's: the control plane's
command lines name their directories, which are pytest's (`/tmp/pytest-of-root/...`).
Needs root (acct(2)) and Debian's `acct` package's `accton`; `.ci/run` prints the table
when AGENTRUN_CPU_CENSUS=1.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

# struct acct_v3 (include/uapi/linux/acct.h): 64 bytes.
_RECORD = struct.Struct("<BBHIIIIIIf8H16s")
_AHZ = 100  # the units of comp_t times on Linux

# (what a command line contains, the program it is), first match wins.
_PROGRAMS = (
    ("forkserver.py --module agentrun_runner", "runner (fork server)"),
    ("forkserver.py --module agentrun_store_api", "store API (fork server)"),
    ("forkserver.py --module agentrun_operator", "operator (fork server)"),
    ("agentrun_runner", "runner"), ("agentrun-runner", "runner"),
    ("agentrun_store_api", "store API"), ("agentrun-store-api", "store API"),
    ("agentrun-operator", "operator"), ("agentrun_operator", "operator"),
    ("agentrun_devtools.devnode", "development node"),
    ("agentrun-receiver", "trigger receiver"), ("agentrun_receiver", "trigger receiver"),
    ("kubectl-agentrun", "kubectl plugin"), ("agentrun_kubectl", "kubectl plugin"),
    ("pytest", "pytest"), ("exec(eval(sys.stdin.readline()))", "pytest"),  # xdist's workers
    ("crm_mcp", "MCP server (sample)"),
)


def _comp(value: int) -> float:
    """comp_t: a 13-bit mantissa and a 3-bit base-8 exponent, in ticks."""
    return float((value & 0x1FFF) << (3 * (value >> 13))) / _AHZ


def records(path: Path) -> list[tuple[int, str, float]]:
    """(pid, comm, CPU seconds) of each process accounting record in `path`."""
    data = path.read_bytes()
    out = []
    for offset in range(0, len(data) - _RECORD.size + 1, _RECORD.size):
        fields = _RECORD.unpack_from(data, offset)
        version, pid, utime, stime = fields[1], fields[6], fields[10], fields[11]
        if version & 0x7F != 3:
            continue
        comm = fields[18].split(b"\0", 1)[0].decode(errors="replace")
        out.append((pid, comm, _comp(utime) + _comp(stime)))
    return out


def program_of(cmdline: str, comm: str) -> str:
    """The program a process is: for Python's (its first argument names the interpreter,
    also when a script's #! line started it), by what its command line runs; for any other,
    its executable's name (`comm`)."""
    if not Path(cmdline.split(" ", 1)[0]).name.startswith("python"):
        return comm
    for needle, program in _PROGRAMS:
        if needle in cmdline:
            return program
    return comm


def sample(directory: Path, interval: float = 0.5) -> None:
    """Writes pid -> program for every process seen, until SIGTERM."""
    seen: dict[int, str] = {}
    stop = False

    def stopping(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, stopping)
    while not stop:
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) in seen:
                continue
            try:
                raw = Path(entry.path, "cmdline").read_bytes()
                comm = Path(entry.path, "comm").read_text().strip()
            except OSError:
                continue
            program = program_of(raw.replace(b"\0", b" ").decode(errors="replace"), comm)
            if program != comm:
                seen[int(entry.name)] = program
        time.sleep(interval)
    (directory / "programs.json").write_text(json.dumps(seen))


def start(directory: Path) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    accounting = directory / "pacct"
    accounting.touch()
    subprocess.run(["accton", str(accounting)], check=True, capture_output=True)
    sampler = subprocess.Popen([sys.executable, "-m", "agentrun_devtools.cpu_census",
                                "sample", str(directory)], start_new_session=True)
    (directory / "sampler.pid").write_text(str(sampler.pid))


def report(directory: Path) -> str:
    subprocess.run(["accton", "off"], check=False, capture_output=True)
    pid = int((directory / "sampler.pid").read_text())
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 10
    while not (directory / "programs.json").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    programs = {int(k): v for k, v in json.loads(
        (directory / "programs.json").read_text()).items()}
    cpu: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    for pid, comm, seconds in records(directory / "pacct"):
        program = programs.get(pid, comm)
        cpu[program] += seconds
        count[program] += 1
    total = sum(cpu.values())
    lines = [f"{'program':<28} {'processes':>9} {'CPU s':>9} {'share':>6}"]
    for program, seconds in sorted(cpu.items(), key=lambda kv: -kv[1])[:25]:
        lines.append(f"{program:<28} {count[program]:>9} {seconds:>9.0f} "
                     f"{100 * seconds / total:>5.1f}%")
    lines.append(f"{'all':<28} {sum(count.values()):>9} {total:>9.0f}")
    return "\n".join(lines)


def main() -> int:
    command, directory = sys.argv[1], Path(sys.argv[2])
    if command == "start":
        start(directory)
    elif command == "sample":
        sample(directory)
    elif command == "report":
        print(report(directory))
    else:
        print(__doc__, file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
