"""Whose account of an attempt's end stands: the runner's recorded outcome or the cluster's
(a real SQLite store, no cluster). Found by the soak (seed 1): a runner that had recorded
its answer was evicted while its process exited, and the run was failed Evicted and
resumed into an impossible resume."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from agentrun_operator import reconcile
from agentrun_operator.classify import Outcome
from agentrun_operator.config import OperatorConfig

from agentrun import store
from agentrun.vocabulary import Phase, Reason, RunStatus

EVICTED = Outcome(Phase.FAILED, Reason.EVICTED, "The runner pod was evicted.")


def account(tmp_path: Path, recorded: tuple[str, str | None] | None, cluster: Outcome) -> Outcome:
    async def go() -> Outcome:
        url = f"sqlite:///{tmp_path / 'store.db'}"
        await store.migrate(url)
        engine = store.make_engine(url)
        try:
            await store.record_run(engine, "u1", "ns", "r1", "support-agent", "manual",
                                   "alice", None)
            await store.start_attempt(engine, "u1", 1, "s1", "r1-1")
            if recorded is not None:
                await store.record_outcome(engine, "u1", 1, recorded[0], recorded[1], "said")
            ctx = reconcile.Context(OperatorConfig(), engine, None)  # type: ignore[arg-type]
            return await reconcile._with_runner_account(ctx, "u1", 1, cluster)
        finally:
            await engine.dispose()

    return asyncio.run(go())


def test_an_answer_recorded_before_the_eviction_stands(tmp_path: Path) -> None:
    got = account(tmp_path, (RunStatus.SUCCEEDED, None), EVICTED)
    assert (got.phase, got.reason) == (Phase.SUCCEEDED, Reason.SUCCEEDED)


@pytest.mark.parametrize("recorded", [None, (RunStatus.FAILED, Reason.AGENT_ERROR)])
def test_otherwise_the_clusters_account_of_a_disruption_stands(
        tmp_path: Path, recorded: tuple[str, str | None] | None) -> None:
    assert account(tmp_path, recorded, EVICTED) == EVICTED


def test_a_plain_failure_takes_the_runners_reason(tmp_path: Path) -> None:
    plain = Outcome(Phase.FAILED, Reason.AGENT_ERROR, "exit 1")
    got = account(tmp_path, (RunStatus.FAILED, Reason.RATE_LIMITED_AFTER_TOOL_CALL), plain)
    assert got.reason == Reason.RATE_LIMITED_AFTER_TOOL_CALL


def test_the_operator_names_its_store_or_says_it_needs_one(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    from agentrun_operator import config

    monkeypatch.delenv("DATABASE_URL", raising=False)
    # From this checkout: the development cluster's SQLite file in its .local.
    elsewhere = ["--store-api-listen=", "--store-api-url=https://store:8080"]
    assert config.parse(elsewhere).database_url == \
        f"sqlite:///{config.REPO / '.local' / 'agentrun.db'}"
    with pytest.raises(SystemExit):
        config.parse([*elsewhere, "--database-url", ""])
    assert "no run store: set --database-url or DATABASE_URL" in capsys.readouterr().err


def test_the_operator_names_its_store_api_and_the_ca_runners_verify_it_with(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    from agentrun_operator import config

    # The store API is agentrun-store-api's, never served in the operator's process (an
    # empty --store-api-listen, which the chart of earlier releases passes, is taken).
    with pytest.raises(SystemExit):
        config.parse(["--store-api-listen=127.0.0.1:8089", "--store-api-url=https://s:8080"])
    assert "run agentrun-store-api --listen=HOST:PORT beside it" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        config.parse(["--store-api-url="])
    assert "runner pods need the store API: give --store-api-url" in \
        capsys.readouterr().err
    not_pem = tmp_path / "ca.crt"
    not_pem.write_text("hello")
    with pytest.raises(SystemExit):
        config.parse(["--store-api-listen=", "--store-api-url=https://store:8080",
                      f"--store-api-ca-file={not_pem}"])
    assert "holds no PEM certificate" in capsys.readouterr().err
