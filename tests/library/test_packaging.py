"""Each program brings what it imports and nothing it must not carry.

pyproject.toml installs five programs from one distribution, each with its own extra. This
follows every import of each program through our own modules (imports inside functions
too, parents packages included, `if TYPE_CHECKING:` blocks left out) and checks that:

- every third-party package a program reaches is brought by its extra (the extra's
  requirements and theirs, as installed here);
- the operator's extra brings no ADK and no model provider, the runner's no kopf, no
  Kubernetes client and no database driver, the store API's no kopf and no model provider.

An import a program makes inside a function, only on a path that needs another extra, is
named below with that reason (not followed; at module level it would be).
"""

from __future__ import annotations

import ast
import importlib.metadata as metadata
import re
import sys
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest
import requirements_of
from packaging.requirements import Requirement

REPO = Path(__file__).resolve().parents[2]
SOURCES = {"agentrun": REPO / "agentrun", "agentrun_operator": REPO / "operator" /
           "agentrun_operator", "agentrun_runner": REPO / "runner-image" / "agentrun_runner",
           "agentrun_store_api": REPO / "store-api-image" / "agentrun_store_api",
           "agentrun_kubectl": REPO / "kubectl-plugin" / "agentrun_kubectl",
           "agentrun_receiver": REPO / "receiver-image" / "agentrun_receiver"}


@dataclass(frozen=True)
class Elsewhere:
    """An import inside a function of `importer`, on a path that needs `extra` besides the
    program's own. Not followed with the program; checked against both extras."""

    importer: str
    prefix: str
    extra: str


@dataclass(frozen=True)
class Program:
    extra: str
    entry: tuple[str, ...]
    elsewhere: tuple[Elsewhere, ...] = ()
    forbidden: tuple[str, ...] = ()  # distributions its extra must not bring
    dockerfile: str | None = None  # its image's, relative to the repository


PROGRAMS = {
    "agentrun-operator": Program(
        "operator", ("agentrun_operator.main",),
        forbidden=("google-adk", "google-genai", "litellm", "anthropic"),
        dockerfile="Dockerfile"),
    "agentrun-store-api": Program(
        "store-api", ("agentrun_store_api.main",),
        forbidden=("kopf", "litellm", "anthropic"),
        dockerfile="store-api-image/Dockerfile"),
    "agentrun-runner": Program(
        "runner", ("agentrun_runner.main",),
        forbidden=("kopf", "kubernetes", "sqlalchemy", "psycopg", "alembic",
                   "prometheus-client"),
        dockerfile="runner-image/Dockerfile"),
    "agentrun-receiver": Program(
        "receiver", ("agentrun_receiver.main",),
        # No store credential, no store: nothing of the database layer, no kopf, no ADK.
        forbidden=("kopf", "google-adk", "litellm", "anthropic", "sqlalchemy", "psycopg",
                   "alembic"),
        dockerfile="receiver-image/Dockerfile"),
    "kubectl-agentrun": Program(
        "kubectl", ("agentrun_kubectl.main",),
        # Reading the store itself (DATABASE_URL) needs agentrun[kubectl,store]; the
        # plugin says so when it is missing.
        elsewhere=(Elsewhere("agentrun_kubectl.tools", "agentrun.store", "store"),
                   Elsewhere("agentrun_kubectl.tools", "sqlalchemy", "store")),
        forbidden=("google-adk", "kopf", "litellm", "sqlalchemy", "psycopg", "alembic")),
}


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# -- our modules and what they import -----------------------------------------------------

@cache
def our_modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package, root in SOURCES.items():
        for path in root.rglob("*.py"):
            parts = [package, *path.relative_to(root).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, module: str, is_package: bool,
             lazy: bool = False) -> Iterator[tuple[str, bool]]:
    """Every module name an import statement of `module` loads (at any depth), and
    whether the import is inside a function (made only when it runs)."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and _is_type_checking(node):
            # Only the `else:` branch runs.
            yield from _imports(ast.Module(body=node.orelse, type_ignores=[]), module,
                                is_package, lazy)
            continue
        if isinstance(node, ast.Import):
            yield from ((alias.name, lazy) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            yield base, lazy
            # `from package import name`: name may be a submodule.
            yield from ((f"{base}.{alias.name}", lazy) for alias in node.names)
        inner = lazy or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        yield from _imports(node, module, is_package, inner)


@cache
def imports_of(module: str) -> frozenset[tuple[str, bool]]:
    path = our_modules()[module]
    tree = ast.parse(path.read_text(), str(path))
    return frozenset((name, lazy) for name, lazy in _imports(
        tree, module, path.name == "__init__.py") if name)


def _with_parents(name: str) -> Iterator[str]:
    parts = name.split(".")
    for i in range(1, len(parts) + 1):
        yield ".".join(parts[:i])


@dataclass
class Walk:
    third: dict[str, str]  # third-party module -> the first of our modules importing it
    ours: set[str]  # our modules reached
    deferred: list[tuple[Elsewhere, str]]  # imports on another extra's path, not followed


def walk(program: Program, entries: tuple[str, ...] | None = None) -> Walk:
    """Every module the program (or `entries`) reaches, through our modules."""
    ours = our_modules()
    found = Walk({}, set(), [])
    todo: list[str] = []

    def enter(name: str, importer: str) -> None:
        top = name.split(".")[0]
        if top in SOURCES:
            todo.extend(m for m in _with_parents(name) if m in ours and m not in found.ours)
        elif top not in sys.stdlib_module_names and top != "__future__":
            found.third.setdefault(name, importer)

    for entry in entries or program.entry:
        enter(entry, "(entry)")
    while todo:
        module = todo.pop()
        if module in found.ours:
            continue
        found.ours.add(module)
        for name, lazy in sorted(imports_of(module)):
            edge = next((e for e in program.elsewhere if lazy and module == e.importer and (
                name == e.prefix or name.startswith(e.prefix + "."))), None)
            if edge is not None:
                found.deferred.append((edge, name))
            else:
                enter(name, module)
    return found


def reached(program: Program) -> dict[str, str]:
    """Third-party module -> the first of our modules that imports it."""
    return walk(program).third


def _not_brought(third: dict[str, str], brings: set[str]) -> list[str]:
    missing = []
    for module, importer in sorted(third.items()):
        dist = distribution_of(module)
        if dist is None or dist not in brings:
            missing.append(f"{importer} imports {module} ({dist or 'installed by nothing'})")
    return missing


# -- what an extra brings --------------------------------------------------------------------

@cache
def _top_level_owners() -> dict[str, list[str]]:
    return metadata.packages_distributions()


def distribution_of(module: str) -> str | None:
    """The installed distribution a module comes from (for a namespace package such as
    `google`, the one whose files hold the module's second level)."""
    top, _, rest = module.partition(".")
    owners = _top_level_owners().get(top) or []
    if len(owners) > 1 and rest:
        inside = f"{top}/{rest.split('.')[0]}"
        owners = [o for o in owners if any(
            line.startswith((inside + "/", inside + ".py"))
            for line in (metadata.distribution(o).read_text("RECORD") or "").splitlines())]
    return _canonical(owners[0]) if owners else None


def brought_by(extra: str) -> set[str]:
    """The distributions agentrun[extra] installs: its requirements as the images read them
    (devtools/requirements_of.py, our own extras expanded), resolved through installed
    metadata."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    todo: list[tuple[str, frozenset[str]]] = []
    done: set[tuple[str, frozenset[str]]] = set()

    def add(requirement: str, extras: frozenset[str] = frozenset()) -> None:
        req = Requirement(requirement)
        if req.marker is not None and not any(
                req.marker.evaluate({"extra": e}) for e in (extras or {""})):
            return
        todo.append((_canonical(req.name), frozenset(req.extras)))

    for requirement in [*project.get("dependencies", []),
                        *requirements_of.requirements(project, extra, set())]:
        add(requirement)
    dists: set[str] = set()
    while todo:
        name, extras = todo.pop()
        if (name, extras) in done:
            continue
        done.add((name, extras))
        dists.add(name)
        for requirement in metadata.requires(name) or ():
            add(requirement, extras)
    return dists


# -- the checks ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_a_program_reaches_only_what_its_extra_brings(name: str) -> None:
    program = PROGRAMS[name]
    missing = _not_brought(reached(program), brought_by(program.extra))
    assert not missing, (f"{name} reaches packages agentrun[{program.extra}] does not bring: "
                         + "; ".join(missing))


@pytest.mark.parametrize("name", sorted(n for n, p in PROGRAMS.items() if p.elsewhere))
def test_a_path_that_needs_another_extra_reaches_only_what_both_bring(name: str) -> None:
    program = PROGRAMS[name]
    deferred = walk(program).deferred
    assert {edge for edge, _ in deferred} == set(program.elsewhere), (
        f"{name}: an exemption that no import uses, or one missing: {deferred}")
    for edge, imported in deferred:
        brings = brought_by(program.extra) | brought_by(edge.extra)
        missing = _not_brought(walk(program, (imported,)).third, brings)
        assert not missing, (f"{name}: {edge.importer} imports {imported}, on a path that "
                             f"agentrun[{program.extra},{edge.extra}] is to serve, but it "
                             "reaches: " + "; ".join(missing))


_REQUIREMENTS_OF = re.compile(r"requirements_of\.py\s+([\w-]+(?:\s+[\w-]+)*)\s*<")


@pytest.mark.parametrize("name", sorted(n for n, p in PROGRAMS.items() if p.dockerfile))
def test_an_image_installs_its_programs_extra_and_copies_the_code_it_reaches(
        name: str) -> None:
    from agentrun_devtools.images import copied_sources

    program = PROGRAMS[name]
    assert program.dockerfile is not None
    dockerfile = REPO / program.dockerfile
    installs = _REQUIREMENTS_OF.findall(dockerfile.read_text())
    assert [extras.split() for extras in installs] == [[program.extra]], (
        f"{program.dockerfile} installs {installs}, not agentrun[{program.extra}]")
    copied = copied_sources(dockerfile)
    for package in sorted({module.split(".")[0] for module in walk(program).ours}):
        folder = SOURCES[package].relative_to(REPO).as_posix()
        assert any(folder == c or folder.startswith(c.rstrip("/") + "/") for c in copied), (
            f"{name} reaches {package} ({folder}), which {program.dockerfile} does not "
            f"copy (it copies {copied})")


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_an_extra_carries_nothing_its_program_must_not(name: str) -> None:
    program = PROGRAMS[name]
    carried = brought_by(program.extra) & {_canonical(d) for d in program.forbidden}
    assert not carried, f"agentrun[{program.extra}] brings {sorted(carried)}"


def test_the_import_follower_sees_imports_inside_functions_and_parent_packages() -> None:
    # The operator reaches the store's database layer through agentrun.store's package
    # __init__, and the store API reaches ADK through imports inside its functions and the
    # memory module: were either missed, the checks above would pass for the wrong reason.
    operator = reached(PROGRAMS["agentrun-operator"])
    assert "sqlalchemy" in {m.split(".")[0] for m in operator}
    store_api = reached(PROGRAMS["agentrun-store-api"])
    assert any(m.startswith("google.adk.sessions.database_session_service")
               for m in store_api), sorted(store_api)
    assert not any(m.startswith("google.") for m in operator), sorted(operator)
    # The store API is a program of its own: the operator reaches none of its modules.
    served = walk(PROGRAMS["agentrun-operator"]).ours
    assert not [m for m in served if m.split(".")[0] == "agentrun_store_api"], sorted(served)
    runner = reached(PROGRAMS["agentrun-runner"])
    assert "kopf" not in runner and not any(m.startswith("sqlalchemy") for m in runner), \
        sorted(runner)
