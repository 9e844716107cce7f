"""An Agent's function tool resolves only to a marked function defined in a module of the
runner image's agents directory: never to any importable callable, and nothing is run to
find out (the refused function is never called)."""

from __future__ import annotations

import textwrap
import uuid
from pathlib import Path

import pytest
from agentrun_runner.declarative import AgentInvalid, resolve_function


@pytest.fixture
def image(tmp_path: Path) -> tuple[Path, str, Path]:
    """An agents directory with one tools module (a unique name: modules are cached per
    process) holding marked, unmarked and imported functions; the unmarked one would
    create a marker file if it ever ran."""
    module = f"tools_{uuid.uuid4().hex[:8]}"
    marker = tmp_path / "ran"
    agents_dir = tmp_path / "agents"
    (agents_dir / f"pkg_{module}").mkdir(parents=True)
    (agents_dir / f"{module}.py").write_text(textwrap.dedent(f"""
        from os import getenv
        from agentrun import effects
        from agentrun.effects import read_only as imported_decorator

        @effects.read_only
        def lookup(order: str) -> str:
            return order

        @effects.tool
        def plain(order: str) -> str:
            return order

        @effects.effectful
        def refund(order: str) -> str:
            return order

        @effects.requires_approval
        def wire(order: str) -> str:
            return order

        def unmarked(order: str) -> str:
            open({str(marker)!r}, "w").write("ran")
            return order

        not_a_function = effects.tool
    """))
    (agents_dir / f"pkg_{module}" / "__init__.py").write_text("")
    (agents_dir / f"pkg_{module}" / f"{module}.py").write_text(
        "from agentrun import effects\n\n@effects.idempotent\ndef send(x: str) -> str:\n"
        "    return x\n")
    (agents_dir / "json.py").write_text(
        "from agentrun import effects\n\n@effects.tool\ndef dumps(x: str) -> str:\n"
        "    return x\n")
    return agents_dir, module, marker


@pytest.mark.parametrize("name", ["lookup", "plain", "refund", "wire"])
def test_a_marked_function_of_an_agents_module_resolves(
        image: tuple[Path, str, Path], name: str) -> None:
    agents_dir, module, _ = image
    found = resolve_function(f"{module}.{name}", agents_dir)
    assert found.__name__ == name and found("42") == "42"


def test_a_marked_function_of_a_package_of_the_agents_directory_resolves(
        image: tuple[Path, str, Path]) -> None:
    agents_dir, module, _ = image
    assert resolve_function(f"pkg_{module}.{module}.send", agents_dir)("x") == "x"


@pytest.mark.parametrize(("path", "said"), [
    ("os.getenv", "there is no module os there"),
    ("subprocess.getoutput", "there is no module subprocess there"),
    ("builtins.exec", "there is no module builtins there"),
    # A file of the agents directory named as a module the environment already holds.
    ("json.dumps", "json is a module of the image's Python environment"),
    ("{m}.unmarked", "{m}.unmarked is not marked as a tool"),
    ("{m}.getenv", "{m} defines no function getenv"),
    ("{m}.imported_decorator", "{m} defines no function imported_decorator"),
    ("{m}.not_a_function", "{m} defines no function not_a_function"),
    ("{m}.missing", "{m} defines no function missing"),
    ("agentrun.effects.tool", "there is no module agentrun.effects there"),
])
def test_anything_else_is_refused_naming_the_function(
        image: tuple[Path, str, Path], path: str, said: str) -> None:
    agents_dir, module, marker = image
    path, said = path.format(m=module), said.format(m=module)
    with pytest.raises(AgentInvalid) as refused:
        resolve_function(path, agents_dir)
    assert f"the function {path} is not a tool of the runner image" in str(refused.value)
    assert said in str(refused.value)
    assert not marker.exists()


def test_the_samples_tools_are_marked() -> None:
    from agentrun_runner.agents import default_agents_dir

    assert resolve_function("sample_tools.refund_policy", default_agents_dir())("42")[
        "refundable"] is True
