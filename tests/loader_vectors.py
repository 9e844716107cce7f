"""Code a run's creator would plant through the runner's environment, one way per known
vector, each leaving a marker file when it runs.

The tests that use it show both sides: the markers appear when Python is started with the
variables as they are (`BYPASS`: the vectors are live here), and none appears when the
runner is started as it is everywhere, through its launcher (`elf_interpreter` shows that
it is static: no loader runs before it).
"""

from __future__ import annotations

import os
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

# Python started without the launcher: interactive (stdin stays /dev/null), so that the
# startup file is read too; the other vectors run at any start.
BYPASS = ("-i",)

# What the runner needs to reach its first refusal, which it says and exits 3 with: it
# got past Python's start-up and into its own code.
RUNNER_ENV = {
    "AGENTRUN_NAMESPACE": "default", "AGENTRUN_RUN_NAME": "loader-check",
    "AGENTRUN_RUN_UID": "00000000-0000-0000-0000-000000000001", "AGENTRUN_ATTEMPT": "1",
    "AGENTRUN_AGENT": "noop-agent", "AGENTRUN_INPUT_DIGEST": "sha256:0",
}
RUNNER_REFUSAL = "no durable session store is configured"
RUNNER_REFUSAL_EXIT = 3

_PRELOAD = r"""
#include <fcntl.h>
#include <unistd.h>
/* Runs in every dynamically linked program the loader preloads this into. */
__attribute__((constructor)) static void planted(void) {
    int fd = open(MARKER, O_WRONLY | O_CREAT, 0644);
    if (fd >= 0)
        close(fd);
}
"""


@dataclass(frozen=True)
class Vectors:
    env: dict[str, str]  # the variables, with paths as the program sees them
    markers: dict[str, Path]  # by vector: the file its code creates, as the test sees it

    def created(self) -> list[str]:
        return sorted(name for name, marker in self.markers.items() if marker.exists())

    def clear(self) -> None:
        for marker in self.markers.values():
            marker.unlink(missing_ok=True)


def plant(directory: Path, seen_as: Path | None = None) -> Vectors:
    """Writes the planted code into `directory` (seen by the program at `seen_as`, e.g.
    where a container mounts it; default: the same path). Builds the preload library with
    gcc."""
    seen = seen_as or directory
    (directory / "markers").mkdir(parents=True)
    # A container's user writes its markers here; the files must be readable to it.
    (directory / "markers").chmod(0o777)
    directory.chmod(0o755)

    def marker(name: str) -> str:
        return str(seen / "markers" / name)

    source = directory / "preload.c"
    source.write_text(_PRELOAD)
    subprocess.run(["gcc", "-shared", "-fPIC", f'-DMARKER="{marker("preload")}"',
                    "-o", str(directory / "preload.so"), str(source)], check=True)
    browser = directory / "browser"
    browser.write_text(f"#!/bin/sh\n: > {marker('browser')}\n")
    browser.chmod(0o755)
    (directory / "startup.py").write_text(f"open({marker('startup')!r}, 'w').close()\n")
    (directory / "site").mkdir()
    (directory / "site" / "sitecustomize.py").write_text(
        f"open({marker('sitecustomize')!r}, 'w').close()\n")
    for path in directory.rglob("*"):
        if path.is_file() and not os.access(path, os.X_OK):
            path.chmod(0o644)
        elif path.is_dir() and path.name != "markers":
            path.chmod(0o755)
    env = {
        "LD_PRELOAD": str(seen / "preload.so"),
        # A warnings filter names its category by module: Python imports antigravity to
        # find it, antigravity opens a web page, and webbrowser runs BROWSER.
        "PYTHONWARNINGS": "ignore::antigravity.x",
        "BROWSER": str(seen / "browser"),
        "PYTHONSTARTUP": str(seen / "startup.py"),
        "PYTHONINSPECT": "1",
        "PYTHONPATH": str(seen / "site"),
    }
    names = ("preload", "browser", "startup", "sitecustomize")
    return Vectors(env, {name: directory / "markers" / name for name in names})


def elf_interpreter(program: Path) -> bytes | None:
    """The ELF program interpreter (the dynamic loader) `program` asks for, if any."""
    data = program.read_bytes()
    assert data[:4] == b"\x7fELF" and data[4] == 2, "a 64-bit ELF file"
    e_phoff, = struct.unpack_from("<Q", data, 0x20)
    e_phentsize, e_phnum = struct.unpack_from("<HH", data, 0x36)
    for i in range(e_phnum):
        p_type, _, p_offset, _, _, p_filesz = struct.unpack_from(
            "<IIQQQQ", data, e_phoff + i * e_phentsize)
        if p_type == 3:  # PT_INTERP
            return data[p_offset:p_offset + p_filesz].rstrip(b"\0")
    return None
