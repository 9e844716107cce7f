"""The operator's configuration: flags, each with an environment variable and a default."""

from __future__ import annotations

import argparse
import datetime
import os
from dataclasses import dataclass, field
from pathlib import Path

from agentrun.vocabulary import DEFAULT_STALE_SECONDS, DEFAULT_TOLERATION_SECONDS

REPO = Path(__file__).resolve().parents[2]
# The embedded default store of the development cluster.
DEV_DATABASE_URL = f"sqlite:///{REPO / '.local' / 'agentrun.db'}"


@dataclass(frozen=True)
class OperatorConfig:
    """What the operator needs to know besides the cluster's own objects."""

    database_url: str = DEV_DATABASE_URL
    # Where runner pods read DATABASE_URL from: a Secret in the run's namespace
    # (name/key), or, when unset, the operator's own URL as a plain env value (the
    # development cluster, where runners are local processes).
    database_secret: str | None = None
    database_secret_key: str = "url"
    runner_image: str = "agentrun/runner:dev"
    runner_command: tuple[str, ...] = ("agentrun-runner",)
    runner_service_account: str = "agentrun-runner"
    namespaces: tuple[str, ...] = ()  # empty: all namespaces
    stale_after: datetime.timedelta = datetime.timedelta(seconds=DEFAULT_STALE_SECONDS)
    toleration_seconds: int = DEFAULT_TOLERATION_SECONDS
    # How long a pod's node may be NotReady before the run is failed NodeLost; by default
    # the same as the runner pods' tolerations, so we act when Kubernetes would evict.
    node_lost_grace: datetime.timedelta = datetime.timedelta(
        seconds=DEFAULT_TOLERATION_SECONDS)
    check_interval: float = 10.0
    metrics_port: int = 0  # 0: no metrics endpoint
    # ADK session events older than this are purged daily (0: never).
    event_retention: datetime.timedelta = datetime.timedelta(days=90)
    extra_runner_env: dict[str, str] = field(default_factory=dict)


def _env(name: str, default: str) -> str:
    return os.environ.get(name, default)


def parse(argv: list[str] | None = None) -> OperatorConfig:
    """Reads flags (falling back to AGENTRUN_* environment variables, then defaults)."""
    p = argparse.ArgumentParser(
        prog="agentrun-operator",
        description="Runs Google ADK agents as AgentRun custom resources.")
    p.add_argument("--database-url", default=_env("DATABASE_URL", DEV_DATABASE_URL),
                   help="SQLAlchemy URL of the run store (env DATABASE_URL; default: the "
                        "development cluster's SQLite file .local/agentrun.db)")
    p.add_argument("--database-secret", default=os.environ.get("AGENTRUN_DATABASE_SECRET"),
                   help="Secret (in each run's namespace) whose key holds the store URL for "
                        "runner pods (env AGENTRUN_DATABASE_SECRET; default: pass the "
                        "operator's URL as a plain value)")
    p.add_argument("--database-secret-key", default=_env("AGENTRUN_DATABASE_SECRET_KEY", "url"))
    p.add_argument("--runner-image", default=_env("AGENTRUN_RUNNER_IMAGE", "agentrun/runner:dev"))
    p.add_argument("--runner-command", default=_env("AGENTRUN_RUNNER_COMMAND", "agentrun-runner"),
                   help="the runner pod's command, space-separated")
    p.add_argument("--runner-service-account",
                   default=_env("AGENTRUN_RUNNER_SERVICE_ACCOUNT", "agentrun-runner"))
    p.add_argument("--namespace", action="append", dest="namespaces",
                   default=[n for n in _env("AGENTRUN_NAMESPACES", "").split(",") if n],
                   help="namespace to watch (repeatable; env AGENTRUN_NAMESPACES, "
                        "comma-separated; default: all)")
    p.add_argument("--stale-after", type=float,
                   default=float(_env("AGENTRUN_STALE_AFTER_SECONDS", str(DEFAULT_STALE_SECONDS))),
                   help="seconds a run may run with no completion before it is failed Stale")
    p.add_argument("--toleration-seconds", type=int,
                   default=int(_env("AGENTRUN_TOLERATION_SECONDS",
                                    str(DEFAULT_TOLERATION_SECONDS))),
                   help="runner pods' tolerations for unreachable/not-ready nodes")
    p.add_argument("--node-lost-grace", type=float,
                   default=float(_env("AGENTRUN_NODE_LOST_GRACE_SECONDS", "-1")),
                   help="seconds a node may be NotReady before its runs fail NodeLost "
                        "(default: the toleration seconds)")
    p.add_argument("--check-interval", type=float,
                   default=float(_env("AGENTRUN_CHECK_INTERVAL_SECONDS", "10")),
                   help="seconds between the safety-net checks of each live run")
    p.add_argument("--metrics-port", type=int, default=int(_env("AGENTRUN_METRICS_PORT", "0")))
    p.add_argument("--event-retention-days", type=float,
                   default=float(_env("AGENTRUN_EVENT_RETENTION_DAYS", "90")),
                   help="ADK session events older than this are purged daily, in batches "
                        "(0: never); sessions keep their shell, the ledger is kept")
    a = p.parse_args(argv)
    grace = a.node_lost_grace if a.node_lost_grace >= 0 else float(a.toleration_seconds)
    return OperatorConfig(
        database_url=a.database_url,
        database_secret=a.database_secret or None,
        database_secret_key=a.database_secret_key,
        runner_image=a.runner_image,
        runner_command=tuple(a.runner_command.split()),
        runner_service_account=a.runner_service_account,
        namespaces=tuple(a.namespaces),
        stale_after=datetime.timedelta(seconds=a.stale_after),
        toleration_seconds=a.toleration_seconds,
        node_lost_grace=datetime.timedelta(seconds=grace),
        check_interval=a.check_interval,
        metrics_port=a.metrics_port,
        event_retention=datetime.timedelta(days=a.event_retention_days),
    )
