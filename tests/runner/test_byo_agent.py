"""Bring your own agent: samples/byo-agent/agents/weather-agent, in ADK's layout, run by the
real runner program from its own directory (AGENTRUN_AGENTS_DIR, as the sample's image sets
/agents), its tools' effect classes reaching the ledger."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrun import store
from agentrun.vocabulary import RunnerEnv, RunnerExit
from tests.runner.runs import prepare_run, query, run_runner

pytestmark = pytest.mark.postgres

AGENTS = Path(__file__).resolve().parents[2] / "samples" / "byo-agent" / "agents"


def test_the_sample_agent_runs_from_its_own_directory(pg_store: str) -> None:
    run = prepare_run(pg_store, "byo", "I am in Paris tomorrow.", agent="weather-agent")
    done = run_runner(run, [
        {"call": "get_forecast", "args": {"city": "Paris"}},
        {"call": "reserve_umbrella", "args": {"city": "Paris"}},
        {"text": "Rain in Paris; an umbrella is reserved."}],
        **{RunnerEnv.AGENTS_DIR: str(AGENTS)})
    assert done.returncode == RunnerExit.SUCCESS, done.stderr[-3000:]
    entries = query(pg_store, lambda e: store.ledger(e, run.uid))
    assert [(x.tool, x.effect, x.outcome) for x in entries] == [
        ("get_forecast", "ReadOnly", "ok"), ("reserve_umbrella", "Idempotent", "ok")]
    assert entries[0].result == {"city": "Paris", "forecast": "rain"}
    key = entries[1].idempotency_key
    assert key and entries[1].result == {"city": "Paris", "reservation": key}


def test_an_agent_the_directory_does_not_have_is_named_with_what_it_has(pg_store: str) -> None:
    run = prepare_run(pg_store, "byo-missing", agent="forecast-agent")
    done = run_runner(run, [{"text": "never"}], **{RunnerEnv.AGENTS_DIR: str(AGENTS)})
    assert done.returncode != RunnerExit.SUCCESS
    assert "forecast-agent" in done.stderr and "weather-agent" in done.stderr, done.stderr[-2000:]
