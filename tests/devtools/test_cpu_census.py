"""The CPU census's reading of a command line (no cluster, no root)."""

from __future__ import annotations

from agentrun_devtools.cpu_census import program_of

VENV = "/root/.cache/agentrun/venv/py3.11-0123/bin"


def test_python_programs_are_told_apart_by_what_they_run() -> None:
    assert program_of(f"{VENV}/python3 {VENV}/agentrun-operator --namespace=!solo-*",
                      "agentrun-operat") == "operator"
    assert program_of(f"{VENV}/python -m agentrun_runner", "python") == "runner"
    assert program_of(f"{VENV}/python3 {VENV}/pytest -n 2", "pytest") == "pytest"
    assert program_of(f"{VENV}/python3 -u -c import sys;exec(eval(sys.stdin.readline()))",
                      "python3") == "pytest"


def test_other_programs_keep_their_name_whatever_their_arguments_name() -> None:
    # The session's control plane lives in pytest's directories: it is not pytest.
    apiserver = ("/root/.cache/agentrun/controlplane/k8s/bin/kube-apiserver "
                 "--cert-dir=/tmp/pytest-of-root/pytest-3/popen-gw0/control-plane0/certs")
    assert program_of(apiserver, "kube-apiserver") == "kube-apiserver"
    assert program_of("/usr/bin/etcd --data-dir=/tmp/agentrun_runner/etcd", "etcd") == "etcd"
    assert program_of(f"{VENV}/python3 /srv/unknown.py", "python3") == "python3"
