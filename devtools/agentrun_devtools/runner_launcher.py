"""The runner's launcher (runner-image/launcher/agentrun-runner.c) for the development node.

In the runner image `agentrun-runner` is that launcher: it removes the variables that change
how a process loads or runs code and starts Python isolated (`-I`). The development node
runs a pod's command as a local process, so that the operator's default command resolves to
the same launcher there, it is compiled here, static, for this checkout's Python, into a
cache outside the checkout:

    ${AGENTRUN_CACHE:-~/.cache/agentrun}/launcher/<key>/agentrun-runner

keyed by the source, the Python it starts, the PATH it gives, and the compiler flags. The
node puts that directory first on each pod's PATH.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

from agentrun.vocabulary import LoaderEnv
from agentrun_devtools import cache

REPO = Path(__file__).resolve().parents[2]
SOURCE = REPO / "runner-image" / "launcher" / "agentrun-runner.c"
PROGRAM = "agentrun-runner"
# Static: a dynamically linked launcher would have the loader honour LD_PRELOAD before it
# could remove it.
CFLAGS = ("-static", "-O2", "-Wall", "-Wextra", "-Wwrite-strings")
# How the launcher starts the runner: `python -I -B -u -m agentrun_runner ARGS...`.
PYTHON_FLAGS = ("-I", "-B", "-u")
MODULE = "agentrun_runner"
# What the runner's processes find programs on, besides the Python's own directory.
SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
INSTALL_HINT = "install gcc and the static C library (Debian: apt-get install gcc libc6-dev)"


class LauncherUnavailable(RuntimeError):
    """The launcher cannot be compiled here (no C compiler, no static C library)."""


def cache_root() -> Path:
    return cache.root()


def runner_path(python: Path) -> str:
    """The PATH the launcher gives the runner: the Python's directory (its console scripts),
    then the system's, as the image's PATH puts /opt/agentrun/bin first."""
    return f"{python.parent}:{SYSTEM_PATH}"


def c_string(value: str) -> str:
    """`value` as a C string literal, for a -D definition."""
    if any(c in value for c in '\n\r\0'):
        raise ValueError(f"cannot be a C string literal: {value!r}")
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def launcher_key(python: Path, path: str, compiler: str) -> str:
    digest = hashlib.sha256()
    for part in (SOURCE.read_bytes(), str(python).encode(), path.encode(), compiler.encode(),
                 " ".join(CFLAGS).encode()):
        digest.update(len(part).to_bytes(8, "big") + part)
    return digest.hexdigest()[:16]


def build(python: Path | None = None, *, path: str | None = None, compiler: str = "gcc",
          cache: Path | None = None) -> Path:
    """The launcher for `python` (default: the one running this), compiled on first use;
    returns its path. Raises LauncherUnavailable, saying what to install, when it cannot
    be compiled here.

    `python` is kept as given, not resolved: a virtual environment's Python finds its
    environment by the path it was started as."""
    python = Path(python or sys.executable)
    path = path if path is not None else runner_path(python)
    directory = (cache or cache_root()) / "launcher" / launcher_key(python, path, compiler)
    program = directory / PROGRAM
    if program.is_file():
        return program
    found = shutil.which(compiler)
    if found is None:
        raise LauncherUnavailable(
            f"the runner's launcher ({SOURCE.relative_to(REPO)}) needs a C compiler and "
            f"{compiler} is not on PATH: {INSTALL_HINT}")
    libc = subprocess.run([found, "-print-file-name=libc.a"], capture_output=True, text=True)
    if not os.path.isabs(libc.stdout.strip()):
        raise LauncherUnavailable(
            f"the runner's launcher is linked static and {compiler} finds no libc.a: "
            f"{INSTALL_HINT}")
    directory.mkdir(parents=True, exist_ok=True)
    # Compiled beside its place and renamed into it: another node may build the same key.
    with tempfile.TemporaryDirectory(dir=directory) as scratch:
        partial = Path(scratch) / PROGRAM
        done = subprocess.run(
            [found, *CFLAGS, f"-DRUNNER_PYTHON={c_string(str(python))}",
             f"-DRUNNER_PATH={c_string(path)}", "-o", str(partial), str(SOURCE)],
            capture_output=True, text=True)
        if done.returncode != 0:
            raise LauncherUnavailable(
                f"compiling the runner's launcher failed ({INSTALL_HINT} if it is missing):\n"
                f"{done.stderr.strip()}")
        os.replace(partial, program)
    return program


def refused(name: str) -> bool:
    """Whether the launcher removes the variable `name` (vocabulary.LoaderEnv, which the
    launcher's C lists spell again: tests/devtools/test_runner_launcher.py)."""
    return name in LoaderEnv.NAMES or any(name.startswith(p) for p in LoaderEnv.PREFIXES)


def launched_env(env: Mapping[str, str], path: str) -> dict[str, str]:
    """The environment a launcher built with `path` gives the runner out of `env`: every
    refused variable gone, PATH its own, last."""
    return {**{k: v for k, v in env.items() if not refused(k) and k != "PATH"}, "PATH": path}


def launched_argv(python: Path, args: Sequence[str]) -> list[str]:
    """The command line of the runner the launcher starts for `python` with `args`."""
    return [str(python), *PYTHON_FLAGS, "-m", MODULE, *args]


def main() -> int:
    """`python -m agentrun_devtools.runner_launcher [PYTHON]`: build it, print its path."""
    try:
        print(build(Path(sys.argv[1]) if len(sys.argv) > 1 else None))
    except LauncherUnavailable as e:
        print(e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
