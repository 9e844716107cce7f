"""`make test-e2e`: agentrun installed the way a platform team installs it, on a real node
(e2e/install.py: the control plane, the real node, the README's "Install on your cluster"
typed as written). One cluster for the whole session."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from e2e.install import Cluster, installed


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> object:
    """A failed test's report carries what the cluster said about the release then."""
    report = yield
    cluster = getattr(item, "funcargs", {}).get("cluster")
    if report.when == "call" and report.failed and isinstance(cluster, Cluster):
        report.sections.append(("the release when this test failed",
                                cluster.release_report()))
    return report


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("e2e")
    try:
        with installed(root) as e2e:
            yield e2e
            print("\ne2e timings: " + ", ".join(f"{k} {v:.0f}s"
                                                for k, v in e2e.timings.items()))
            went = e2e.node_not_ready()
            assert not went, "the node went NotReady during the session:\n" + "\n".join(went)
    finally:
        shutil.rmtree(root, ignore_errors=True)
