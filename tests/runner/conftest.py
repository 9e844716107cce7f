"""Runner tests: the runs, the store and the store API in front of it come from
tests/store_fixtures.py (the runner's launch is tests/runner/runs.py's); here is `crm`, a
real MCP server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.mcp_server import CrmServer, crm_server


@pytest.fixture
def crm(tmp_path: Path) -> Iterator[CrmServer]:
    with crm_server(tmp_path) as server:
        yield server
