"""The chart's Grafana dashboard reads only what the operator and the store API export
(every metric name in its PromQL, every label it groups or filters by) and shows every
metric they export; its ConfigMap is rendered only when asked for."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from agentrun_operator import metrics
from agentrun_store_api import metrics as store_api_metrics
from prometheus_client.metrics import MetricWrapperBase

from tests.chart.helm import ARGS, CHART, helm

DASHBOARD = CHART / "dashboards" / "agentrun.json"
_NAME = re.compile(r"agentrun_[a-z_]+")
_BY = re.compile(r"\b(?:by|without)\s*\(([^)]*)\)")
_MATCHER = re.compile(r"[{,]\s*([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)")
# Labels Prometheus adds to every series it scrapes, and histograms' bucket bound.
TARGET_LABELS = {"job", "instance", "__name__"}
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"),
            "gauge": ("",)}


def exported() -> dict[str, set[str]]:
    """Sample name -> its label names, for everything the two metrics modules export."""
    out: dict[str, set[str]] = {}
    for value in [*vars(metrics).values(), *vars(store_api_metrics).values()]:
        if isinstance(value, MetricWrapperBase):
            for family in value.describe():
                labels = set(value._labelnames)
                for suffix in SUFFIXES[family.type]:
                    out[family.name + suffix] = labels | ({"le"} if suffix == "_bucket" else
                                                          set())
    for family in metrics._CACHES.describe():
        out[family.name] = {k for s in family.samples for k in s.labels}
    return out


def expressions(node: Any) -> Iterator[str]:
    """Every PromQL expression of the dashboard: panel targets and variable queries."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("expr", "definition") and isinstance(value, str):
                yield value
            elif key == "query" and isinstance(value, dict | str):
                yield from ([value] if isinstance(value, str) else expressions(value))
            else:
                yield from expressions(value)
    elif isinstance(node, list):
        for item in node:
            yield from expressions(item)


@pytest.fixture(scope="module")
def dashboard() -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(DASHBOARD.read_text())
    return loaded


def test_the_metrics_modules_export_what_the_table_says() -> None:
    # A guard on exported() itself: a name it missed would let any dashboard pass.
    names = exported()
    assert "agentrun_runs_settled_total" in names and "agentrun_runs" in names
    assert names["agentrun_ledger_write_duration_seconds_bucket"] == {"operation", "code",
                                                                     "le"}


def test_every_name_and_label_in_the_dashboard_is_exported(dashboard: dict[str, Any]) -> None:
    names = exported()
    exprs = [e for e in expressions(dashboard) if "agentrun_" in e]
    assert len(exprs) > 10
    for expr in exprs:
        used = set(_NAME.findall(expr))
        if not used:  # the job variable: every series of ours, by name
            assert '{__name__=~"agentrun_.*"}' in expr, expr
            continue
        unknown = used - set(names)
        assert not unknown, f"{expr}: {sorted(unknown)} not exported"
        labels = set().union(*(names[n] for n in used)) | TARGET_LABELS
        grouped = {x.strip() for m in _BY.findall(expr) for x in m.split(",") if x.strip()}
        matched = set(_MATCHER.findall(expr))
        assert grouped | matched <= labels, f"{expr}: {sorted((grouped | matched) - labels)}"


def test_every_exported_metric_has_a_panel(dashboard: dict[str, Any]) -> None:
    shown = {n for e in expressions(dashboard) for n in _NAME.findall(e)}
    families = {re.sub(r"_(total|bucket|sum|count)$", "", n) for n in exported()}
    missing = {f for f in families if not any(n.startswith(f) for n in shown)}
    assert not missing, sorted(missing)


def test_the_dashboard_configmap_is_off_by_default_and_carries_the_file() -> None:
    base = ("template", "agentrun", str(CHART), *ARGS, "--set", "postgres.enabled=true")
    off = helm(*base, "--show-only", "templates/dashboard.yaml")
    assert off.returncode != 0 and "could not find template" in off.stderr, off.stderr
    on = helm(*base, "--set", "metrics.dashboard.enabled=true",
              "--show-only", "templates/dashboard.yaml")
    assert on.returncode == 0, on.stderr
    configmap = yaml.safe_load(on.stdout)
    assert configmap["kind"] == "ConfigMap"
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(configmap["data"]["agentrun.json"]) == json.loads(DASHBOARD.read_text())


@pytest.mark.parametrize("value", ["text", "json"])
def test_the_log_format_reaches_both_programs(value: str) -> None:
    done = helm("template", "agentrun", str(CHART), *ARGS, "--set", "postgres.enabled=true",
                "--set", f"logFormat={value}")
    assert done.returncode == 0, done.stderr
    deployments = [d for d in yaml.safe_load_all(done.stdout)
                   if d and d["kind"] == "Deployment" and d["metadata"]["name"] in (
                       "agentrun-operator", "agentrun-store")]
    assert len(deployments) == 2
    for d in deployments:
        args = d["spec"]["template"]["spec"]["containers"][0]["args"]
        assert f"--log-format={value}" in args, d["metadata"]["name"]


def test_a_wrong_log_format_is_refused() -> None:
    done = helm("template", "agentrun", str(CHART), *ARGS, "--set", "postgres.enabled=true",
                "--set", "logFormat=yaml")
    assert done.returncode != 0 and "/logFormat" in done.stderr, done.stderr
