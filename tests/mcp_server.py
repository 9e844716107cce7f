"""The declarative sample's MCP server (samples/declarative/crm_mcp.py: the `mcp` SDK's
FastMCP over streamable HTTP), started by a test as a process on a loopback port, and
what it saw (`GET /calls`)."""

from __future__ import annotations

import json
import sys
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from agentrun_devtools.controlplane import REPO
from agentrun_devtools.processes import Child, ProcessDied, free_port, wait_for

SCRIPT = REPO / "samples" / "declarative" / "crm_mcp.py"


class CrmServer:
    def __init__(self, log_dir: Path) -> None:
        self.port = free_port()
        self.child = Child("crm-mcp", [sys.executable, str(SCRIPT), "--host", "127.0.0.1",
                                       "--port", str(self.port)], log_dir / "crm-mcp.log")
        self.url = f"http://127.0.0.1:{self.port}/mcp"

        def up() -> bool:
            if not self.child.alive():
                raise ProcessDied(f"crm-mcp exited:\n{self.child.log_tail()}")
            self.seen()
            return True

        wait_for(up, timeout=30, what="crm-mcp")

    def seen(self) -> dict[str, Any]:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/calls", timeout=5) as r:
            found: dict[str, Any] = json.loads(r.read())
        return found

    def calls(self, tool: str | None = None) -> list[dict[str, Any]]:
        return [c for c in self.seen()["calls"] if tool is None or c["tool"] == tool]

    def stop(self) -> None:
        self.child.stop()


@contextmanager
def crm_server(log_dir: Path) -> Iterator[CrmServer]:
    server = CrmServer(log_dir)
    try:
        yield server
    finally:
        server.stop()
