"""The runner's launcher (runner-image/launcher/agentrun-runner.c), compiled as the image
and the development node compile it: it removes exactly the variables of the vocabulary's
LoaderEnv, sets PATH to its own, passes every other variable and every argument through,
and starts Python isolated. A stand-in for Python prints what it was given."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from agentrun_devtools import runner_launcher
from agentrun_devtools.runner_launcher import LauncherUnavailable

from agentrun.vocabulary import ENV_SCRIPT, LoaderEnv, RunnerEnv
from tests.loader_vectors import elf_interpreter

# Prints each argument ("A...") and each environment entry ("E..."), NUL-terminated.
STAND_IN = r"""
#include <stdio.h>
extern char **environ;
int main(int argc, char **argv) {
    for (int i = 0; i < argc; i++)
        printf("A%s%c", argv[i], 0);
    for (char **e = environ; *e; e++)
        printf("E%s%c", *e, 0);
    return 0;
}
"""
# Starts argv[1] with exactly the entries before "--" as its environment (repeated names,
# entries without '=': what a dict cannot hold), and the rest as its arguments.
EXEC_WITH = r"""
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
int main(int argc, char **argv) {
    char **env = calloc(argc, sizeof *env), **args = calloc(argc, sizeof *args);
    int i = 2, e = 0, a = 0;
    args[a++] = argv[1];
    for (; i < argc && strcmp(argv[i], "--") != 0; i++)
        env[e++] = argv[i];
    for (i++; i < argc; i++)
        args[a++] = argv[i];
    execve(argv[1], args, env);
    return 127;
}
"""
RUNNER_PATH = "/opt/agentrun/bin:/usr/bin:/bin"
# One name of each refused family.
FAMILY_EXAMPLES = {"PYTHON": "PYTHONHOME", "LD_": "LD_AUDIT", "DYLD_": "DYLD_INSERT_LIBRARIES",
                   "BASH_FUNC_": "BASH_FUNC_ls%%", "OPENSSL_": "OPENSSL_MODULES"}


def compile_c(source: str, target: Path, *flags: str) -> Path:
    path = target.with_suffix(".c")
    path.write_text(source)
    subprocess.run(["gcc", "-O2", *flags, "-o", str(target), str(path)], check=True)
    return target


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return compile_c(STAND_IN, tmp_path_factory.mktemp("stand-in") / "python")


@pytest.fixture(scope="module")
def launcher(stand_in: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The launcher, built to start the stand-in instead of Python."""
    return runner_launcher.build(stand_in, path=RUNNER_PATH,
                                 cache=tmp_path_factory.mktemp("cache"))


def started(launcher: Path, entries: list[str], args: list[str],
            tmp_path: Path) -> tuple[list[str], list[str]]:
    """What the program the launcher started got: its arguments and its environment."""
    exec_with = compile_c(EXEC_WITH, tmp_path / "exec-with")
    done = subprocess.run([str(exec_with), str(launcher), *entries, "--", *args],
                          capture_output=True, check=True)
    items = [item.decode() for item in done.stdout.split(b"\0") if item]
    return [i[1:] for i in items if i[0] == "A"], [i[1:] for i in items if i[0] == "E"]


def test_the_c_source_refuses_what_the_vocabulary_lists() -> None:
    source = runner_launcher.SOURCE.read_text()

    def array(name: str) -> list[str]:
        (body,) = re.findall(rf"{name}\[\] = \{{(.*?)\}};", source, re.S)
        return re.findall(r'"([^"]*)"', body)

    assert array("refused_prefixes") == list(LoaderEnv.PREFIXES)
    assert array("refused_names") == list(LoaderEnv.NAMES)


def test_removes_exactly_the_list_and_passes_the_rest_through(
        launcher: Path, stand_in: Path, tmp_path: Path) -> None:
    refused = [*FAMILY_EXAMPLES.values(), *LoaderEnv.NAMES]
    assert set(FAMILY_EXAMPLES) == set(LoaderEnv.PREFIXES)
    # Decided the other way, the operator's own, and names that only look refused.
    kept = [*LoaderEnv.KEPT, RunnerEnv.RUN_UID, ENV_SCRIPT, "MY_PYTHONPATH", "XLD_PRELOAD",
            "PATHS", "ld_preload", "BROWSER_URL", "ENVIRONMENT", "PYTHO", "LD"]
    entries = [
        *(f"{name}=refused" for name in refused),
        *(f"{name}=kept {i}" for i, name in enumerate(kept)),
        "LD_PRELOAD=/second/copy.so",  # every copy of a name goes, not just the first
        "PYTHONPATH",  # an entry without a value is still the variable
        "VALUE_WITH_EQUALS=a=b",
    ]

    args, env = started(launcher, entries, ["--agent", "support-agent", "two words", ""],
                        tmp_path)

    assert env == [*(f"{name}=kept {i}" for i, name in enumerate(kept)),
                   "VALUE_WITH_EQUALS=a=b", f"PATH={RUNNER_PATH}"]
    assert args == [str(stand_in), "-I", "-B", "-u", "-m", "agentrun_runner",
                    "--agent", "support-agent", "two words", ""]


def test_what_the_development_node_forks_gets_what_the_launcher_gives(
        launcher: Path, stand_in: Path, tmp_path: Path) -> None:
    """The development node forks runner processes from an imported runner instead of
    exec'ing the launcher (agentrun_devtools.forkserver): their environment and command line
    are the launcher's, by runner_launcher.launched_env and launched_argv."""
    env = {"PATH": "/somewhere", **{name: "refused" for name in FAMILY_EXAMPLES.values()},
           "LD_PRELOAD": "/x.so", "BROWSER": "firefox", "HOME": "/tmp", RunnerEnv.RUN_UID: "u",
           "MY_PYTHONPATH": "kept", "VALUE_WITH_EQUALS": "a=b"}
    arguments = ["--agent", "support-agent", "two words", ""]

    args, given = started(launcher, [f"{k}={v}" for k, v in env.items()], arguments, tmp_path)

    assert given == [f"{k}={v}" for k, v in runner_launcher.launched_env(env, RUNNER_PATH).items()]
    assert args == runner_launcher.launched_argv(stand_in, arguments)


def test_an_empty_environment_gets_only_the_path(launcher: Path, tmp_path: Path) -> None:
    args, env = started(launcher, [], [], tmp_path)
    assert env == [f"PATH={RUNNER_PATH}"]
    assert args[1:] == ["-I", "-B", "-u", "-m", "agentrun_runner"]


def test_the_launcher_is_static_so_no_loader_runs_before_it(launcher: Path,
                                                            tmp_path: Path) -> None:
    assert elf_interpreter(launcher) is None
    # What the check would see in a dynamically linked program.
    assert elf_interpreter(compile_c(STAND_IN, tmp_path / "dynamic")) is not None


def test_a_missing_compiler_is_said_with_what_to_install(tmp_path: Path) -> None:
    with pytest.raises(LauncherUnavailable, match=r"apt-get install gcc libc6-dev"):
        runner_launcher.build(Path("/usr/bin/python3"), compiler="no-such-cc",
                              cache=tmp_path)


def test_a_build_is_cached_by_source_python_and_path(tmp_path: Path) -> None:
    first = runner_launcher.build(Path("/usr/bin/python3"), cache=tmp_path)
    again = runner_launcher.build(Path("/usr/bin/python3"), cache=tmp_path)
    other = runner_launcher.build(Path("/usr/bin/python3"), path="/bin", cache=tmp_path)
    assert first == again and first.parent.parent == tmp_path / "launcher"
    assert other != first
    assert first.name == other.name == "agentrun-runner"
