"""The development node's `$(VAR)` expansion is the kubelet's: devtools/peers/kubelet-expansion
runs k8s.io/kubernetes/third_party/forked/golang/expansion at the control plane's release.
Each row is a rule a real node applies; the development node passes what this returns to
the process (agentrun_devtools.devnode DevNode._env)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from agentrun_devtools import peers

REPO = Path(__file__).resolve().parents[2]

CASES = [
    ("a reference to an earlier variable expands",
     [("A", "a", False), ("B", "x$(A)y", False)], [("A", "a"), ("B", "xay")]),
    ("$$ is a literal $, so $$(A) stays $(A)",
     [("A", "a", False), ("B", "$$(A)", False)], [("A", "a"), ("B", "$(A)")]),
    ("an undefined reference stays as written",
     [("B", "$(NOPE)-$(A)", False)], [("B", "$(NOPE)-$(A)")]),
    ("a later variable is not visible to an earlier one",
     [("B", "$(A)", False), ("A", "a", False)], [("B", "$(A)"), ("A", "a")]),
    ("a resolved valueFrom is taken as it is, never expanded",
     [("A", "a", False), ("S", "s$(A)", True)], [("A", "a"), ("S", "s$(A)")]),
    ("a value after a resolved one sees it (why Secrets go last in a runner pod)",
     [("S", "secret", True), ("M", "$(S)", False)], [("S", "secret"), ("M", "secret")]),
    ("a lone $ and an unclosed reference stay",
     [("A", "a", False), ("B", "5$ and $(A", False)], [("A", "a"), ("B", "5$ and $(A")]),
    ("the newest of two duplicates is the one a reference sees",
     [("A", "1", False), ("A", "2", False), ("B", "$(A)", False)],
     [("A", "1"), ("A", "2"), ("B", "2")]),
]


@pytest.mark.parametrize(("env", "expanded"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_env_expands_as_the_kubelet_expands(env: list[tuple[str, str, bool]],
                                            expanded: list[tuple[str, str]]) -> None:
    assert peers.expand(env).env == expanded


def test_command_and_args_see_the_whole_env_secrets_included() -> None:
    # This is why no tenant text may go into a runner's command or args.
    out = peers.expand([("S", "secret", True), ("A", "a", False)],
                       ["run", "$(S)", "$$(S)"], ["--x=$(A)", "$(LATER)"])
    assert out.command == ["run", "secret", "$(S)"]
    assert out.args == ["--x=a", "$(LATER)"]


def test_the_expansion_is_built_from_the_control_planes_release() -> None:
    def pinned(go_mod: Path) -> str:
        found = re.search(r"k8s\.io/kubernetes (v\S+)", go_mod.read_text())
        assert found, f"{go_mod} pins no k8s.io/kubernetes"
        return found.group(1)

    assert pinned(REPO / "devtools/peers/kubelet-expansion/go.mod") == pinned(
        REPO / "devtools/controlplane/kubernetes/go.mod")
