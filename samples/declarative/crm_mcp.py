"""crm-mcp: the declarative sample's MCP server (the `mcp` SDK's FastMCP, streamable HTTP).

Three tools, each saying what it does to the world in MCP's own tool annotations, which
is where agentrun takes their effect class from:

- lookup_customer: readOnlyHint -> ReadOnly (an in-doubt call of it runs again on resume);
- update_ticket: idempotentHint -> Idempotent; it dedupes by the request's Idempotency-Key
  header (agentrun sends the call's key with every call), so a call run again on resume
  changes the ticket once;
- close_account: destructiveHint, neither read-only nor idempotent -> Effectful (an
  in-doubt call of it is not run again: the resume is refused ToolCallInDoubt).

Every call is printed as one JSON line (`crm-mcp call {...}`) and kept in memory, and
`GET /calls` returns them, so anyone can count what the server really saw.

    python3 crm_mcp.py [--host 0.0.0.0] [--port 8080]

It needs only what the runner image carries (mcp, uvicorn): the sample runs it from that
image, with this file from a ConfigMap.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
import time
from typing import Any

from mcp.server.fastmcp import Context, FastMCP
from mcp.types import ToolAnnotations
from starlette.requests import Request
from starlette.responses import JSONResponse

CUSTOMERS = {
    "42": {"customer": "42", "name": "Ada Lovelace", "plan": "pro",
           "orders": [{"order": "42", "amount": 120, "status": "delivered"}]},
    "43": {"customer": "43", "name": "Alan Turing", "plan": "free", "orders": []},
}
calls: list[dict[str, Any]] = []
tickets: dict[str, str] = {}
applied: dict[str, dict[str, Any]] = {}  # Idempotency-Key -> the first call's answer


def _record(tool: str, args: dict[str, Any], ctx: Context) -> str | None:
    request = ctx.request_context.request
    headers = request.headers if request is not None else {}
    key = headers.get("idempotency-key")
    # What the Agent's Secret header carried, as a digest: enough to check it arrived,
    # never the credential itself in a log.
    token = headers.get("authorization")
    call = {"tool": tool, "args": args, "idempotencyKey": key, "at": time.time(),
            "authorizationSha256": hashlib.sha256(token.encode()).hexdigest() if token else None}
    calls.append(call)
    print(f"crm-mcp call {json.dumps(call, sort_keys=True)}", flush=True)
    return key


def server(host: str, port: int) -> FastMCP:
    mcp = FastMCP("crm-mcp", host=host, port=port)

    @mcp.tool(annotations=ToolAnnotations(readOnlyHint=True))
    async def lookup_customer(customer: str, ctx: Context) -> dict[str, Any]:
        """Looks a customer up by id: name, plan and orders."""
        _record("lookup_customer", {"customer": customer}, ctx)
        return CUSTOMERS.get(customer) or {"customer": customer, "error": "no such customer"}

    @mcp.tool(annotations=ToolAnnotations(readOnlyHint=False, idempotentHint=True,
                                          destructiveHint=False))
    async def update_ticket(ticket: str, status: str, ctx: Context,
                            delay_seconds: float = 0) -> dict[str, Any]:
        """Sets a support ticket's status. The same Idempotency-Key is applied once. Answers
        after `delay_seconds` (a call that acted and has not answered yet)."""
        key = _record("update_ticket", {"ticket": ticket, "status": status}, ctx)
        if key and key in applied:
            answer = {**applied[key], "applied": False}
        else:
            tickets[ticket] = status
            answer = {"ticket": ticket, "status": status, "applied": True}
            if key:
                applied[key] = answer
        if delay_seconds:
            await asyncio.sleep(float(delay_seconds))
        return answer

    @mcp.tool(annotations=ToolAnnotations(readOnlyHint=False, idempotentHint=False,
                                          destructiveHint=True))
    async def close_account(customer: str, ctx: Context,
                            delay_seconds: float = 0) -> dict[str, Any]:
        """Closes a customer's account, for good. Answers after `delay_seconds`."""
        _record("close_account", {"customer": customer}, ctx)
        CUSTOMERS.pop(customer, None)
        if delay_seconds:
            await asyncio.sleep(float(delay_seconds))
        return {"customer": customer, "closed": True}

    @mcp.custom_route("/calls", methods=["GET"])
    async def seen(_: Request) -> JSONResponse:
        return JSONResponse({"calls": calls, "tickets": tickets})

    return mcp


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="crm-mcp")
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8080)
    args = parser.parse_args(argv)
    print(f"crm-mcp listening on {args.host}:{args.port}/mcp", flush=True)
    server(args.host, args.port).run(transport="streamable-http")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
