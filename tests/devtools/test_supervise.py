"""`make run`'s supervisor (agentrun_devtools.supervise): its programs run side by side,
each line behind its name; one that ends stops the others, and so does Ctrl-C or SIGTERM;
nothing is left behind."""

from __future__ import annotations

import asyncio
import io
import re
import shlex
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from agentrun_devtools.cluster import devtools_env
from agentrun_devtools.processes import pids_alive, wait_for
from agentrun_devtools.supervise import Program, program, supervise

PY = sys.executable


def waiting(pid_file: Path, *, ignore_term: bool = False) -> tuple[str, ...]:
    """A program that writes its pid, says it is ready, and waits to be stopped."""
    code = ("import os, signal, sys, time\n"
            + ("signal.signal(signal.SIGTERM, signal.SIG_IGN)\n" if ignore_term else "")
            + f"open({str(pid_file)!r}, 'w').write(str(os.getpid()))\n"
            "print('ready', flush=True)\n"
            "time.sleep(600)\n")
    return (PY, "-c", code)


def test_a_program_is_a_name_and_a_command() -> None:
    assert program("store-api: agentrun-store-api --listen=127.0.0.1:8089 --x='a b'") == \
        Program("store-api", ("agentrun-store-api", "--listen=127.0.0.1:8089", "--x=a b"))
    for bad in ("agentrun-operator", "operator:", ": agentrun-operator", "my op: x",
                "operator: 'unclosed"):
        with pytest.raises(ValueError, match=r"NAME: COMMAND|quotation"):
            program(bad)


def test_one_program_ending_stops_the_others_and_its_code_is_the_exit_code(
        tmp_path: Path) -> None:
    out = io.BytesIO()
    pid_file = tmp_path / "waiter.pid"
    code = asyncio.run(supervise([
        Program("waiter", waiting(pid_file)),
        Program("quitter", (PY, "-c", "import sys\n"
                                      "print('one'); print('two', end='')\n"
                                      "sys.exit(3)")),
    ], out=out))
    assert code == 3
    lines = out.getvalue().decode().splitlines()
    assert "quitter | one" in lines and "quitter | two" in lines, lines
    assert "        | quitter exited with code 3; stopping waiter" in lines, lines
    # The waiter was stopped, whether or not it had started to wait.
    if pid_file.exists():
        assert pids_alive([int(pid_file.read_text())]) == []


def test_a_program_that_ignores_sigterm_is_killed_after_the_grace(tmp_path: Path) -> None:
    pid_file = tmp_path / "stubborn.pid"
    out = io.BytesIO()
    code = asyncio.run(supervise([
        Program("stubborn", waiting(pid_file, ignore_term=True)),
        Program("quitter", (PY, "-c", "import os, sys, time\n"
                                      f"while not os.path.exists({str(pid_file)!r}): "
                                      "time.sleep(0.01)\n"
                                      "sys.exit(0)")),
    ], grace=0.5, out=out))
    assert code == 0
    assert pids_alive([int(pid_file.read_text())]) == []


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_stops_every_program(tmp_path: Path, signum: int) -> None:
    pids = [tmp_path / "a.pid", tmp_path / "b.pid"]
    log = tmp_path / "out.log"
    specs = [f"a: {shlex.join(waiting(pids[0]))}", f"bee: {shlex.join(waiting(pids[1]))}"]
    with open(log, "wb") as out:
        supervisor = subprocess.Popen([PY, "-m", "agentrun_devtools.supervise", *specs],
                                      stdout=out, stderr=subprocess.STDOUT,
                                      env=devtools_env())
    try:
        wait_for(lambda: log.read_text().count("| ready") == 2, timeout=30,
                 what="both programs ready")
        children = [int(p.read_text()) for p in pids]
        supervisor.send_signal(signum)
        assert supervisor.wait(30) == 128 + signum
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
    text = log.read_text()
    assert re.search(r"^a   \| ready$", text, re.M) and re.search(r"^bee \| ready$", text, re.M)
    assert f"{signal.Signals(signum).name}: stopping a, bee" in text, text
    assert pids_alive(children) == []
