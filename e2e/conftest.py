"""`make test-e2e`: agentrun installed the way a platform team installs it, on a real node
(e2e/install.py: the control plane, the real node, the README's "Install on your cluster"
typed as written). One cluster for the whole session."""

from __future__ import annotations

import shutil
from collections.abc import Iterator

import pytest

from e2e.install import Cluster, installed


@pytest.fixture(scope="session")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("e2e")
    try:
        with installed(root) as e2e:
            yield e2e
            print("\ne2e timings: " + ", ".join(f"{k} {v:.0f}s"
                                                for k, v in e2e.timings.items()))
    finally:
        shutil.rmtree(root, ignore_errors=True)
