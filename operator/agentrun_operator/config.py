"""The operator's configuration: flags, each with an environment variable and a default."""

from __future__ import annotations

import argparse
import datetime
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agentrun import logs, policy
from agentrun.vocabulary import DEFAULT_STALE_SECONDS, DEFAULT_TOLERATION_SECONDS, STORE_AUDIENCE

REPO = Path(__file__).resolve().parents[2]
# The embedded default store of the development cluster, in the checkout this runs from;
# installed elsewhere (a wheel, an image) there is no default: the store must be named.
_CHECKOUT = (REPO / "pyproject.toml").is_file() and (REPO / "operator").is_dir()
DEV_DATABASE_URL = f"sqlite:///{REPO / '.local' / 'agentrun.db'}" if _CHECKOUT else ""
# The CA of the development cluster's store API certificate (`make dev-cluster` writes
# it), in the same way: only from a checkout.
DEV_STORE_API_TLS = REPO / ".local" / "store-api"


def _dev_tls(name: str) -> str:
    path = DEV_STORE_API_TLS / name
    return str(path) if _CHECKOUT and path.is_file() else ""


@dataclass(frozen=True)
class OperatorConfig:
    """What the operator needs to know besides the cluster's own objects."""

    database_url: str = DEV_DATABASE_URL
    # The store API, which runner pods use instead of a database credential: its URL as
    # runner pods reach it (`agentrun-store-api` serves it, a program of its own: the
    # chart's Deployment agentrun-store, `make run`'s second process), the audience of
    # their tokens, and the CA (PEM text) they verify it with ("" = the image's roots).
    store_api_url: str = ""
    store_api_audience: str = STORE_AUDIENCE
    store_api_ca: str = ""
    # Where the trigger receiver (agentrun-receiver) is served, as senders reach it: an
    # AgentRunTrigger's status.url is this and /v1/triggers/<namespace>/<name> ("" = not
    # known: no status.url).
    receiver_url: str = ""
    # The scripted model lets whoever creates a run choose every tool call: off unless
    # asked for (development clusters, tests, the demo).
    allow_scripted_model: bool = False
    # Four eyes: a run's creator may not approve its calls, unless this says so (the
    # chart's approval.allowSelfApproval, for installations one person runs alone).
    allow_self_approval: bool = False
    runner_image: str = "agentrun/runner:dev"
    runner_command: tuple[str, ...] = ("agentrun-runner",)
    runner_service_account: str = "agentrun-runner"
    # The runner container's resources when the run's spec.resources sets none (the chart's
    # runner.resources): what Kueue's quotas and the scheduler count for each attempt.
    runner_resources: Mapping[str, Any] = field(
        default_factory=lambda: dict(DEFAULT_RUNNER_RESOURCES))
    namespaces: tuple[str, ...] = ()  # empty: all namespaces
    stale_after: datetime.timedelta = datetime.timedelta(seconds=DEFAULT_STALE_SECONDS)
    toleration_seconds: int = DEFAULT_TOLERATION_SECONDS
    # How long a pod's node may be NotReady before the run is failed NodeLost; by default
    # the same as the runner pods' tolerations, so we act when Kubernetes would evict.
    node_lost_grace: datetime.timedelta = datetime.timedelta(
        seconds=DEFAULT_TOLERATION_SECONDS)
    # How often every live run is looked at again without an event (a safety net under
    # the watches; deadlines are scheduled, not polled).
    check_interval: float = 300.0
    workers: int = 8
    # Runner pods of a settled run are deleted this long after it settled (None: kept).
    pod_ttl_after_finished: datetime.timedelta | None = datetime.timedelta(hours=1)
    # A settled run is deleted this long after it settled, unless its spec says otherwise
    # (None: kept). Its record stays in the store (ttl.py).
    run_ttl_after_finished: datetime.timedelta | None = None
    # Leader election: the namespace of the Lease ("" = none: this replica always acts).
    leader_election_namespace: str = ""
    leader_election_seconds: float = 15.0
    metrics_port: int = 0  # 0: no metrics endpoint
    log_format: str = "text"  # or "json": one object per line (logs.py)
    # Records of runs settled longer ago than this, and ADK session events older than it,
    # are purged daily (0: never; the chart's store.retention).
    retention: datetime.timedelta = datetime.timedelta(days=90)
    # The key of the input digests (HMAC), from a file (the chart mounts its Secret); None:
    # the one the run store made for this installation (store.installation_key).
    input_digest_key: bytes | None = None
    # The chart's modelPrices (JSON: {model: {inputUSDPerMillionTokens,
    # outputUSDPerMillionTokens}}), over LiteLLM's price map; given to every runner.
    model_prices: str = ""
    # The chart's toolPolicy (JSON, as spec.tools): what no Agent or run may loosen
    # (agentrun.policy); given to every runner.
    tool_policy: str = ""
    extra_runner_env: dict[str, str] = field(default_factory=dict)


# The chart's runner.resources default, and the operator's when it is run without the chart.
DEFAULT_RUNNER_RESOURCES: Mapping[str, Any] = {"requests": {"cpu": "100m", "memory": "256Mi"}}


def runner_resources_of(raw: str) -> dict[str, Any]:
    """--runner-resources: a container's resources as JSON ({"requests": {...}, "limits":
    {...}}; {} for none). Raises ValueError with what is wrong."""
    try:
        value = json.loads(raw) if raw.strip() else {}
    except ValueError as e:
        raise ValueError(f"not JSON: {e}") from None
    if not isinstance(value, dict):
        raise ValueError("must be an object with requests and/or limits")
    unknown = sorted(set(value) - {"requests", "limits"})
    if unknown:
        raise ValueError(f"only requests and limits may be set, not {', '.join(unknown)}")
    for key, amounts in value.items():
        if not isinstance(amounts, dict) or not all(
                isinstance(k, str) and isinstance(v, str | int) and not isinstance(v, bool)
                for k, v in amounts.items()):
            raise ValueError(f"{key} must map resource names to quantities, such as "
                             '{"cpu": "100m", "memory": "256Mi"}')
    return {k: {name: str(q) for name, q in v.items()} for k, v in value.items()}


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
    p.add_argument("--store-api-url", default=_env("AGENTRUN_STORE_API_URL", ""),
                   help="the store API's URL as runner pods reach it (https://...; "
                        "agentrun-store-api serves it: the chart's agentrun-store Service, "
                        "make run's second process)")
    # Earlier releases could serve the store API in this process (--store-api-listen=
    # HOST:PORT), and the chart turned that off with an empty value, which is still taken.
    p.add_argument("--store-api-listen", default="", help=argparse.SUPPRESS)
    p.add_argument("--store-api-audience", default=_env("AGENTRUN_STORE_AUDIENCE",
                                                        STORE_AUDIENCE),
                   help="the audience of the runner pods' projected store tokens")
    p.add_argument("--store-api-ca-file",
                   default=_env("AGENTRUN_STORE_API_CA_FILE", _dev_tls("ca.crt")),
                   help="the CA that issued the store API's certificate, given to runner "
                        "pods to verify it (default: .local/store-api/ca.crt; empty: the "
                        "runner image's trusted roots)")
    p.add_argument("--receiver-url", default=_env("AGENTRUN_RECEIVER_URL", ""),
                   help="the trigger receiver's address as senders reach it (an ingress's, "
                        "or the receiver's Service); AgentRunTriggers' status.url is it and "
                        "/v1/triggers/<namespace>/<name> (empty: no status.url)")
    p.add_argument("--allow-scripted-model", action="store_true",
                   default=_env("AGENTRUN_ALLOW_SCRIPTED_MODEL", "") == "true",
                   help="honour spec.model: scripted (whoever creates a run then chooses "
                        "its tool calls; development clusters and tests only)")
    p.add_argument("--allow-self-approval", action="store_true",
                   default=_env("AGENTRUN_ALLOW_SELF_APPROVAL", "") == "true",
                   help="let the user who created a run approve its calls (one-person "
                        "installations; otherwise such an approval is Rejected "
                        "SelfApproval)")
    p.add_argument("--runner-image", default=_env("AGENTRUN_RUNNER_IMAGE", "agentrun/runner:dev"))
    p.add_argument("--runner-command", default=_env("AGENTRUN_RUNNER_COMMAND", "agentrun-runner"),
                   help="the runner pod's command, space-separated")
    p.add_argument("--runner-service-account",
                   default=_env("AGENTRUN_RUNNER_SERVICE_ACCOUNT", "agentrun-runner"))
    p.add_argument("--runner-resources",
                   default=_env("AGENTRUN_RUNNER_RESOURCES",
                                json.dumps(DEFAULT_RUNNER_RESOURCES, separators=(",", ":"))),
                   help="the runner container's resources when a run's spec.resources sets "
                        "none, as JSON (default: requests of 100m CPU and 256Mi memory, "
                        "what Kueue's quotas and the scheduler count; {} for none)")
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
                   default=float(_env("AGENTRUN_CHECK_INTERVAL_SECONDS", "300")),
                   help="seconds between resyncs of every live run (a safety net under the "
                        "watches; deadlines are scheduled, not polled)")
    p.add_argument("--workers", type=int, default=int(_env("AGENTRUN_WORKERS", "8")),
                   help="reconciles running at once")
    p.add_argument("--pod-ttl-after-finished", type=float,
                   default=float(_env("AGENTRUN_POD_TTL_AFTER_FINISHED_SECONDS", "3600")),
                   help="seconds a settled run's pods are kept (negative: forever)")
    p.add_argument("--run-ttl-after-finished", type=float,
                   default=float(_env("AGENTRUN_RUN_TTL_AFTER_FINISHED_SECONDS", "-1")),
                   help="seconds a settled run is kept in the API server when its spec sets "
                        "no ttlSecondsAfterFinished (negative: forever); its record stays "
                        "in the store")
    p.add_argument("--leader-election-namespace",
                   default=_env("AGENTRUN_LEADER_ELECTION_NAMESPACE", ""),
                   help="elect one active replica with a Lease in this namespace (empty: no "
                        "election, this replica acts; run only one then)")
    p.add_argument("--leader-election-seconds", type=float,
                   default=float(_env("AGENTRUN_LEADER_ELECTION_SECONDS", "15")),
                   help="how long a silent leader keeps the Lease before a standby takes over")
    p.add_argument("--metrics-port", type=int, default=int(_env("AGENTRUN_METRICS_PORT", "0")))
    p.add_argument("--log-format", choices=logs.FORMATS,
                   default=_env("AGENTRUN_LOG_FORMAT", "text"),
                   help="text (key=value) or json (one object per line)")
    p.add_argument("--retention", type=retention_of,
                   default=retention_of(_env("AGENTRUN_RETENTION",
                                             _env("AGENTRUN_EVENT_RETENTION_DAYS", "90") + "d")),
                   help="records of runs settled longer ago than this (their ledger, results, "
                        "usage, approvals, input snapshots) and ADK session events older "
                        "than it are purged daily, in batches: 90d, 36h, 0 (never)")
    # The name of earlier releases, for events only; --retention covers both now.
    p.add_argument("--event-retention-days", type=lambda v: retention_of(f"{v}d"),
                   dest="retention", help=argparse.SUPPRESS)
    p.add_argument("--input-digest-key-file",
                   default=_env("AGENTRUN_INPUT_DIGEST_KEY_FILE", ""),
                   help="file holding the key of status.inputDigest (HMAC; the chart mounts "
                        "it from a Secret made at install and kept); default: a key the run "
                        "store makes once for this installation")
    p.add_argument("--model-prices", default=_env("AGENTRUN_MODEL_PRICES", ""),
                   help="prices of models, over LiteLLM's price map (JSON: {model: "
                        "{inputUSDPerMillionTokens, outputUSDPerMillionTokens}}); runners "
                        "estimate each call's cost with them")
    p.add_argument("--tool-policy", default=_env("AGENTRUN_TOOL_POLICY", ""),
                   help="what tools do and which need an approval, as no Agent or run may "
                        "loosen it (JSON: a list of {name, effect, approval, "
                        "approvalTimeoutSeconds}, as spec.tools; the chart's toolPolicy)")
    a = p.parse_args(argv)
    if a.store_api_listen:
        p.error(f"--store-api-listen={a.store_api_listen}: the operator does not serve the "
                "store API; run agentrun-store-api --listen=HOST:PORT beside it (the chart "
                "and make run do) and give the operator --store-api-url=https://HOST:PORT")
    if not a.store_api_url:
        p.error("runner pods need the store API: give --store-api-url (or "
                "AGENTRUN_STORE_API_URL), where agentrun-store-api serves it")
    ca = ""
    if a.store_api_ca_file:
        try:
            ca = Path(a.store_api_ca_file).read_text()
        except OSError as e:
            p.error(f"--store-api-ca-file {a.store_api_ca_file}: {e.strerror}")
        if "-----BEGIN CERTIFICATE-----" not in ca:
            p.error(f"--store-api-ca-file {a.store_api_ca_file} holds no PEM certificate")
    if a.model_prices:
        problem = model_prices_problem(a.model_prices)
        if problem:
            p.error(f"--model-prices: {problem}")
    if policy.rules_problem(a.tool_policy):
        p.error(f"--tool-policy: {policy.rules_problem(a.tool_policy)}")
    key: bytes | None = None
    if a.input_digest_key_file:
        try:
            key = Path(a.input_digest_key_file).read_bytes().strip()
        except OSError as e:
            p.error(f"--input-digest-key-file {a.input_digest_key_file}: {e.strerror}")
        if len(key) < 16:
            p.error(f"--input-digest-key-file {a.input_digest_key_file} holds "
                    f"{len(key)} bytes; the key needs at least 16")
    try:
        runner_resources = runner_resources_of(a.runner_resources)
    except ValueError as e:
        p.error(f"--runner-resources: {e}")
    grace = a.node_lost_grace if a.node_lost_grace >= 0 else float(a.toleration_seconds)
    if not a.database_url:
        p.error("no run store: set --database-url or DATABASE_URL (postgresql+psycopg://... "
                "in a cluster; sqlite:///PATH on a development machine)")
    return OperatorConfig(
        database_url=a.database_url,
        store_api_url=a.store_api_url,
        store_api_audience=a.store_api_audience,
        store_api_ca=ca,
        receiver_url=a.receiver_url,
        allow_scripted_model=a.allow_scripted_model,
        allow_self_approval=a.allow_self_approval,
        runner_image=a.runner_image,
        runner_command=tuple(a.runner_command.split()),
        runner_service_account=a.runner_service_account,
        runner_resources=runner_resources,
        namespaces=tuple(a.namespaces),
        stale_after=datetime.timedelta(seconds=a.stale_after),
        toleration_seconds=a.toleration_seconds,
        node_lost_grace=datetime.timedelta(seconds=grace),
        check_interval=a.check_interval,
        workers=max(1, a.workers),
        pod_ttl_after_finished=None if a.pod_ttl_after_finished < 0 else
        datetime.timedelta(seconds=a.pod_ttl_after_finished),
        run_ttl_after_finished=None if a.run_ttl_after_finished < 0 else
        datetime.timedelta(seconds=a.run_ttl_after_finished),
        leader_election_namespace=a.leader_election_namespace,
        leader_election_seconds=a.leader_election_seconds,
        metrics_port=a.metrics_port,
        log_format=a.log_format,
        retention=a.retention,
        input_digest_key=key,
        model_prices=a.model_prices,
        tool_policy=a.tool_policy,
    )


def retention_of(value: str) -> datetime.timedelta:
    """A retention: a number of days (90d), hours (36h) or minutes (30m); 0: never."""
    text = str(value).strip()
    units = {"d": 86400.0, "h": 3600.0, "m": 60.0}
    try:
        if text in ("0", "0d", "0h", "0m"):
            return datetime.timedelta(0)
        if text[-1:] in units and float(text[:-1]) >= 0:
            return datetime.timedelta(seconds=float(text[:-1]) * units[text[-1]])
    except ValueError:
        pass
    raise argparse.ArgumentTypeError(
        f"retention {value!r}: a number of days, hours or minutes, such as 90d, 36h or 30m "
        "(0: never)")


def model_prices_problem(raw: str) -> str:
    """What is wrong with a modelPrices JSON, or "" (the runner reads it the same way)."""
    import json

    try:
        data = json.loads(raw)
    except ValueError as e:
        return f"not JSON: {e}"
    if not isinstance(data, dict):
        return "must be an object of models"
    for model, price in data.items():
        if not isinstance(price, dict) or not all(
                isinstance(price.get(k), int | float) and not isinstance(price.get(k), bool)
                and price[k] >= 0
                for k in ("inputUSDPerMillionTokens", "outputUSDPerMillionTokens")):
            return (f"{model} needs inputUSDPerMillionTokens and outputUSDPerMillionTokens "
                    "as numbers of 0 or more")
    return ""
