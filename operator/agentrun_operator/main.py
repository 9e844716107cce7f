"""`agentrun-operator`: the kopf operator process (`make run` runs it)."""

from __future__ import annotations

import asyncio
import gc
import logging
import sys

import kopf

from agentrun import logs
from agentrun_operator import config as configuration
from agentrun_operator import heap
from agentrun_operator.handlers import register


def main(argv: list[str] | None = None) -> int:
    config = configuration.parse(argv)
    logs.configure(config.log_format)
    # kopf's own per-object chatter goes to debug; our handlers log one line per step.
    logging.getLogger("kopf").setLevel(logging.WARNING)
    registry = register(config)
    # The imported modules are here for good: out of the garbage collector's walks.
    heap.watch()
    gc.freeze()
    asyncio.run(kopf.operator(
        registry=registry,
        # No kopf peering: replicas elect one active among them with a Lease
        # (--leader-election-namespace; see leader.py), and kopf on every replica only
        # watches and fills the work queue.
        standalone=True,
        clusterwide=not config.namespaces,
        namespaces=list(config.namespaces),
        memo=kopf.Memo(),
    ))
    return 0


if __name__ == "__main__":
    sys.exit(main())
