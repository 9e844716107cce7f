"""spec.env configures the agent, never the loader: as a user who may only create runs
(agentrun-edit, no right to create pods), every known way to run code through the runner's
environment is refused by the API server, with the variable and the reason in the message;
what configures an agent is still accepted.

The reasons are agentrun/vocabulary.py's (LoaderEnv); docs/security.md lists them.
"""

from __future__ import annotations

from typing import Any

import pytest

from agentrun.vocabulary import LoaderEnv
from tests.crds.kube import Kubectl, apply, refused, run_manifest

pytestmark = pytest.mark.cluster

EDITOR = "eve"  # bound to agentrun-edit in the test's namespace, nothing else


@pytest.fixture
def editable(crds: Kubectl, namespace: str) -> str:
    crds.kubectl("create", "rolebinding", "eve-edits", "-n", namespace,
                 "--clusterrole=agentrun-edit", f"--user={EDITOR}")
    return namespace


def reason(name: str) -> str:
    if name in LoaderEnv.NAMES:
        return LoaderEnv.NAMES[name]
    (prefix,) = [p for p in LoaderEnv.PREFIXES if name.startswith(p)]
    return LoaderEnv.PREFIXES[prefix]


def message(name: str) -> str:
    """What the API server answers about one refused entry of spec.env."""
    return (f'Invalid value: "{name}": spec.env may not set {name}: it changes how the '
            f"runner's processes load or run code ({reason(name)}); configure the agent with "
            f"other variables")


def as_editor(plane: Kubectl, namespace: str, env: list[dict[str, Any]]) -> Any:
    # A server-side dry run: admission runs in full, nothing is stored or started.
    return apply(plane, namespace, run_manifest("r", model="scripted", env=env),
                 as_user=EDITOR, extra=("--dry-run=server",))


VECTORS = [
    # A warnings filter names a category by module: Python imports antigravity to find
    # it, which opens a browser, which runs the command BROWSER names.
    pytest.param([("PYTHONWARNINGS", "ignore::antigravity.x"), ("BROWSER", "/tmp/evil")],
                 id="warnings-filter-importing-a-module"),
    pytest.param([("LD_PRELOAD", "/tmp/evil.so")], id="preload-library"),
    pytest.param([("PYTHONSTARTUP", "/tmp/evil.py"), ("PYTHONINSPECT", "1")],
                 id="startup-file"),
    pytest.param([("PYTHONPATH", "/tmp/site")], id="sitecustomize-on-the-path"),
    pytest.param([("BROWSER", "/tmp/evil")], id="browser-command"),
    pytest.param([("GCONV_PATH", "/tmp/gconv")], id="character-set-converters"),
    pytest.param([("OPENSSL_CONF", "/tmp/engine.cnf")], id="openssl-engine"),
    pytest.param([("BASH_ENV", "$(touch /tmp/evil)")], id="shell-start-up"),
    pytest.param([("NODE_OPTIONS", "--require /tmp/evil.js")], id="node-options"),
    pytest.param([("PATH", "/tmp:/usr/bin")], id="path"),
]


@pytest.mark.parametrize("vector", VECTORS)
def test_every_known_vector_is_refused_naming_the_variable(
        editable: str, crds: Kubectl, vector: list[tuple[str, str]]) -> None:
    env = [{"name": "OPENAI_API_KEY", "value": "sk-test"},
           *({"name": n, "value": v} for n, v in vector)]

    said = refused(as_editor(crds, editable, env))

    for index, (name, _) in enumerate(vector, start=1):
        assert f"spec.env[{index}].name: {message(name)}" in said, said
    assert "spec.env[0]" not in said  # the model key is not the problem


def test_the_whole_list_is_refused_in_one_answer(editable: str, crds: Kubectl) -> None:
    """Every name of the list, and one name of each refused family, in one run: each is
    refused with its own reason, so that whoever wrote it learns all of them at once."""
    examples = {"PYTHON": "PYTHONHOME", "LD_": "LD_AUDIT", "DYLD_": "DYLD_INSERT_LIBRARIES",
                "BASH_FUNC_": "BASH_FUNC_ls%%", "OPENSSL_": "OPENSSL_MODULES"}
    assert examples.keys() == LoaderEnv.PREFIXES.keys()
    names = [*examples.values(), *LoaderEnv.NAMES]
    env = [{"name": name, "value": "x"} for name in names]

    said = refused(as_editor(crds, editable, env))

    for index, name in enumerate(names):
        assert f"spec.env[{index}].name: {message(name)}" in said, name


def test_what_configures_an_agent_is_accepted(editable: str, crds: Kubectl) -> None:
    """The names decided the other way (proxies, keys, TMPDIR, the script of the scripted
    model...), and names that only look like refused ones: a family is a prefix, and
    names are case-sensitive (glibc reads LD_PRELOAD, not ld_preload)."""
    lookalikes = ["MY_PYTHONPATH", "XLD_PRELOAD", "PATHS", "ld_preload", "BROWSER_URL",
                  "ENVIRONMENT", "HTTP_PROXY", "ANTHROPIC_API_KEY", "GOOGLE_API_KEY"]
    env = [{"name": name, "value": "x"} for name in [*LoaderEnv.KEPT, *lookalikes]]

    done = as_editor(crds, editable, env)

    assert done.returncode == 0, done.stderr
    assert "created (server dry run)" in done.stdout or "serverside-applied" in done.stdout
