"""The runner's pure decisions: its configuration, and what a failure means for the run."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from agentrun_runner.ledger import LedgerWriteFailed
from agentrun_runner.main import UsageError, classify_failure, parse_config
from agentrun_runner.retries import EmptyModelTurn, RateLimitedAfterToolCall
from agentrun_runner.store_client import StoreRefused
from google.genai import errors

from agentrun.vocabulary import Reason, RunnerEnv, RunnerExit

ENV = {
    RunnerEnv.RUN_UID: "uid-1",
    RunnerEnv.RUN_NAME: "triage-42",
    RunnerEnv.AGENT: "support-agent",
    RunnerEnv.INPUT_DIGEST: "sha256:ab",
    RunnerEnv.ATTEMPT: "2",
    "DATABASE_URL": "sqlite:///x.db",
}


def test_config_from_the_environment_with_defaults() -> None:
    config = parse_config([], ENV)
    named = config.identity
    assert (named.run_uid, named.run_name, named.attempt) == ("uid-1", "triage-42", 2)
    assert named.user_id == "default"
    assert named.session_id == "uid-1-2"  # a fresh session per attempt
    assert config.trigger == "manual"
    assert config.model is None
    assert config.agents_dir.name == "agents"


def test_flags_override_the_environment() -> None:
    config = parse_config(["--attempt", "3", "--agents-dir", "/x", "--session-id", "chat-7"], ENV)
    assert (config.identity.attempt, config.agents_dir, config.identity.session_id) == (
        3, Path("/x"), "chat-7")


@pytest.mark.parametrize("missing", [RunnerEnv.RUN_UID, RunnerEnv.AGENT, RunnerEnv.INPUT_DIGEST])
def test_missing_identity_is_a_usage_error(missing: str) -> None:
    env = {k: v for k, v in ENV.items() if k != missing}
    with pytest.raises(UsageError, match=missing):
        parse_config([], env)


def test_a_bad_attempt_is_a_usage_error() -> None:
    with pytest.raises(UsageError):
        parse_config([], {**ENV, RunnerEnv.ATTEMPT: "zero"})


def _wrapped(error: BaseException) -> RuntimeError:
    outer = RuntimeError("Error in plugin")
    outer.__cause__ = error
    return outer


def _ledger_refused(status: int, message: str, reason: str | None) -> RuntimeError:
    """What a refused open looks like when it reaches the runner's outcome: the ledger's
    fail-closed error over the store API's refusal, inside ADK's plugin error."""
    refused = StoreRefused(status, message, reason)
    failed = LedgerWriteFailed("transfer", refused)
    failed.__cause__ = refused  # raised `from` the refusal, as the ledger does
    return _wrapped(failed)


@pytest.mark.parametrize(
    ("error", "reason", "says"),
    [
        # The store refused to open the approved call under other arguments.
        (_ledger_refused(409, "ann approved call c1 with arguments sha256:aa",
                         Reason.APPROVAL_MISMATCH),
         Reason.APPROVAL_MISMATCH, "ann approved call c1 with arguments sha256:aa"),
        # Any other refusal of an open stays an agent error (fail closed).
        (_ledger_refused(409, "already on the ledger as another call", None),
         Reason.AGENT_ERROR, "transfer was not run"),
    ],
)
def test_a_refused_open_names_its_reason(error: BaseException, reason: str, says: str) -> None:
    failure = classify_failure(error)
    assert (failure.code, failure.reason) == (RunnerExit.AGENT_ERROR, reason)
    assert says in failure.message


@pytest.mark.parametrize(
    ("error", "code", "reason", "says"),
    [
        (RateLimitedAfterToolCall(["send_email"], errors.ClientError(429, {})),
         RunnerExit.RATE_LIMITED_AFTER_TOOL_CALL, Reason.RATE_LIMITED_AFTER_TOOL_CALL,
         "human must decide"),
        (_wrapped(LedgerWriteFailed("send_email", OSError("disk"))),
         RunnerExit.AGENT_ERROR, Reason.AGENT_ERROR, "send_email was not run"),
        (EmptyModelTurn(), RunnerExit.AGENT_ERROR, Reason.AGENT_ERROR, "empty turn"),
        (ValueError("bad tool"), RunnerExit.AGENT_ERROR, Reason.AGENT_ERROR, "bad tool"),
    ],
)
def test_failures_map_to_exit_codes_and_reasons(
    error: BaseException, code: int, reason: str, says: str
) -> None:
    failure = classify_failure(error)
    assert (failure.code, failure.reason) == (code, reason)
    assert says in failure.message


def test_the_store_client_speaks_https_only_and_trusts_the_ca_it_is_given(
        tmp_path: Path) -> None:
    """A runner's token and session never travel in the clear, and the CA it checks the
    store API with is the operator's (AGENTRUN_STORE_CA), not the run's environment's."""
    from agentrun_runner.store_client import StoreClient, StoreUnreachable

    with pytest.raises(StoreUnreachable, match="must be reached over https"):
        StoreClient("http://127.0.0.1:8089", tmp_path / "token")
    with pytest.raises(StoreUnreachable, match="AGENTRUN_STORE_CA"):
        StoreClient("https://127.0.0.1:8089", tmp_path / "token", "not a certificate")
    async def session_of_a_client() -> bool:
        client = StoreClient("https://127.0.0.1:8089", tmp_path / "token")
        try:
            return bool(client._http().trust_env)
        finally:
            await client.close()

    assert asyncio.run(session_of_a_client()) is False
