"""The runner program end to end: a real subprocess against a real store."""

from __future__ import annotations

import json
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from agentrun import store
from agentrun.vocabulary import (
    ENV_SCRIPT_TRANSCRIPT,
    ENV_TEST_CRASH_IN,
    Reason,
    RunnerEnv,
    RunnerExit,
)
from tests.runner.runs import (
    EMAIL,
    Run,
    explain,
    launch,
    outcome,
    prepare_run,
    query,
    run_runner,
    runner_env,
    tools,
)
from tests.runner_world import TRUST, RunnerWorld

pytestmark = pytest.mark.postgres


def emails(url: str, run: Run | None = None) -> list[store.OutboxRow]:
    rows = query(url, lambda e: store.outbox(e, run.name if run else None))
    return [r for r in rows if r.tool == "send_email"]


def test_a_run_sends_one_email_and_succeeds(any_store: str) -> None:
    run = prepare_run(any_store, "ok-1")
    done = run_runner(run, [{"call": "read_message"}, {"call": "send_email", "args": EMAIL},
                            {"text": "Emailed the customer."}])
    assert done.returncode == RunnerExit.SUCCESS, explain(done)
    assert len(emails(any_store, run)) == 1
    got = outcome(run)
    assert got is not None and got.status == "succeeded"
    assert tools(run) == ["read_message", "send_email"]
    entries = query(any_store, lambda e: store.ledger(e, run.uid))
    assert [(x.tool, x.outcome) for x in entries] == [("read_message", "ok"), ("send_email", "ok")]
    assert all(x.finished_at is not None for x in entries)
    # Logs: one event per line, key=value, with run name and attempt.
    lines = [ln for ln in done.stderr.splitlines() if "event=" in ln]
    assert lines and all(f"run={run.name}" in ln and "attempt=1" in ln for ln in lines)


def _read_session(url: str, app: str, user: str, session_id: str) -> list[dict[str, Any]]:
    """Reads a session with ADK's own DatabaseSessionService, in a brand-new process."""
    code = (
        "import asyncio, json, sys\n"
        "from google.adk.sessions.database_session_service import DatabaseSessionService\n"
        "from agentrun.store import session_service_url\n"
        "async def main():\n"
        "    s = DatabaseSessionService(session_service_url(sys.argv[1]))\n"
        "    got = await s.get_session(app_name=sys.argv[2], user_id=sys.argv[3],"
        " session_id=sys.argv[4])\n"
        "    print(json.dumps([e.model_dump(mode='json', exclude_none=True)"
        " for e in got.events]))\n"
        "    await s.close()\n"
        "asyncio.run(main())\n"
    )
    done = subprocess.run([sys.executable, "-c", code, url, app, user, session_id],
                          capture_output=True, text=True, timeout=60, check=True)
    return list(json.loads(done.stdout))


def test_amnesia_a_session_written_by_one_runner_is_read_back_by_another(
    pg_store: str, tmp_path: Path
) -> None:
    first = prepare_run(pg_store, "chat-1", "Customer 42 asks for a refund", session_id="chat-7")
    done = run_runner(first, [{"call": "send_email", "args": EMAIL}, {"text": "Refund emailed."}])
    assert done.returncode == 0, explain(done)

    # A new process reads the session back intact, with ADK's own reader.
    events = _read_session(pg_store, first.app, "alice", "chat-7")
    texts = [p.get("text") for e in events for p in e.get("content", {}).get("parts", [])]
    calls = [p["function_call"]["name"] for e in events
             for p in e.get("content", {}).get("parts", []) if "function_call" in p]
    responses = [p["function_response"]["response"] for e in events
                 for p in e.get("content", {}).get("parts", []) if "function_response" in p]
    assert texts[0] == "Customer 42 asks for a refund"
    assert calls == ["send_email"]
    assert responses == [{"status": "sent", "to": EMAIL["to"]}]
    assert texts[-1] == "Refund emailed."

    # And a new runner continuing the session shows the model the whole first turn.
    transcript = tmp_path / "model.jsonl"
    second = prepare_run(pg_store, "chat-2", "Did you send it?", session_id="chat-7")
    done = run_runner(second, [{"text": "Yes."}], **{ENV_SCRIPT_TRANSCRIPT: str(transcript)})
    assert done.returncode == 0, explain(done)
    seen = json.loads(transcript.read_text().splitlines()[0])["contents"]
    seen_text = json.dumps(seen)
    assert "Customer 42 asks for a refund" in seen_text
    assert '"send_email"' in seen_text and "Refund emailed." in seen_text
    assert seen[-1]["parts"][0]["text"] == "Did you send it?"


def test_runner_killed_inside_send_email_leaves_the_call_on_record(pg_store: str) -> None:
    run = prepare_run(pg_store, "crash-1")
    done = run_runner(run, [{"call": "send_email", "args": EMAIL}, {"text": "never"}],
                      **{ENV_TEST_CRASH_IN: "send_email"})
    assert done.returncode == 137, explain(done)

    entries = query(pg_store, lambda e: store.ledger(e, run.uid))
    assert [(x.tool, x.finished_at, x.outcome) for x in entries] == [("send_email", None, None)]
    events = _read_session(pg_store, run.app, "alice", run.session_for(1))
    calls = [p["function_call"]["name"] for e in events
             for p in e.get("content", {}).get("parts", []) if "function_call" in p]
    assert calls == ["send_email"]
    assert outcome(run) is None
    assert tools(run) == ["send_email"]
    assert len(emails(pg_store)) == 1


def test_ledger_insert_failure_means_the_tool_never_runs(pg_store: str) -> None:
    async def break_ledger(engine: AsyncEngine) -> None:
        async with engine.begin() as conn:
            await conn.execute(text(
                "CREATE FUNCTION refuse_ledger() RETURNS trigger LANGUAGE plpgsql AS "
                "$$ BEGIN RAISE EXCEPTION 'ledger is read-only'; END $$"
            ))
            await conn.execute(text(
                "CREATE TRIGGER refuse_ledger BEFORE INSERT ON tool_calls "
                "FOR EACH ROW EXECUTE FUNCTION refuse_ledger()"
            ))

    run = prepare_run(pg_store, "noledger-1")
    query(pg_store, break_ledger)
    done = run_runner(run, [{"call": "send_email", "args": EMAIL}, {"text": "Sent."}])
    assert done.returncode == RunnerExit.AGENT_ERROR, explain(done)
    assert emails(pg_store) == []
    got = outcome(run)
    assert got is not None and got.status == "failed" and got.reason == Reason.AGENT_ERROR
    assert got.message and "ledger" in got.message and "send_email was not run" in got.message
    # The model's call is still on record in the session: it counts, conservatively.
    assert tools(run) == ["send_email"]


def test_rate_limit_before_any_call_is_retried_and_the_run_succeeds(pg_store: str) -> None:
    run = prepare_run(pg_store, "429-before")
    done = run_runner(run, [{"error": 429, "retry_delay": 0.2}, {"error": 429, "retry_delay": 0.2},
                            {"call": "send_email", "args": EMAIL}, {"text": "Sent."}])
    assert done.returncode == RunnerExit.SUCCESS, explain(done)
    assert len(emails(pg_store)) == 1
    assert tools(run) == ["send_email"]


def test_rate_limit_is_retried_at_most_twice(pg_store: str) -> None:
    run = prepare_run(pg_store, "429-thrice")
    done = run_runner(run, [{"error": 429, "retry_delay": 0.1}] * 3 + [{"text": "never"}])
    assert done.returncode == RunnerExit.AGENT_ERROR, explain(done)
    got = outcome(run)
    assert got is not None and got.reason == Reason.AGENT_ERROR
    assert tools(run) == []


def test_rate_limit_after_a_call_is_not_retried(pg_store: str) -> None:
    run = prepare_run(pg_store, "429-after")
    done = run_runner(run, [{"call": "send_email", "args": EMAIL},
                            {"error": 429, "retry_delay": 0.1}, {"text": "Sent."}])
    assert done.returncode == RunnerExit.RATE_LIMITED_AFTER_TOOL_CALL, explain(done)
    got = outcome(run)
    assert got is not None and got.status == "failed"
    assert got.reason == Reason.RATE_LIMITED_AFTER_TOOL_CALL
    assert got.message and "human must decide" in got.message.lower()
    assert "send_email" in got.message
    assert len(emails(pg_store)) == 1
    assert tools(run) == ["send_email"]


def test_an_empty_turn_is_retried_once(pg_store: str) -> None:
    run = prepare_run(pg_store, "empty-once")
    done = run_runner(run, [{"empty": True}, {"text": "Here is my answer."}])
    assert done.returncode == RunnerExit.SUCCESS, explain(done)
    assert "Here is my answer." in done.stderr


def test_two_empty_turns_fail_clearly(pg_store: str) -> None:
    run = prepare_run(pg_store, "empty-twice")
    done = run_runner(run, [{"empty": True}, {"empty": True}, {"text": "never"}])
    assert done.returncode == RunnerExit.AGENT_ERROR, explain(done)
    got = outcome(run)
    assert got is not None and got.reason == Reason.AGENT_ERROR
    assert got.message and "empty turn" in got.message
    assert tools(run) == []


def test_compaction_strips_older_payloads_and_keeps_the_latest(
    pg_store: str, tmp_path: Path
) -> None:
    payload = "QUJD" * 1500  # 6,000 characters of base64, returned by read_message
    run = prepare_run(pg_store, "compact-1", payload)
    transcript = tmp_path / "model.jsonl"
    done = run_runner(
        run,
        [{"call": "read_message"}, {"call": "update_crm",
                                    "args": {"customer": "42", "status": "refunded"}},
         {"text": "Done."}],
        **{ENV_SCRIPT_TRANSCRIPT: str(transcript)},
    )
    assert done.returncode == 0, explain(done)
    requests = [json.loads(line)["contents"] for line in transcript.read_text().splitlines()]
    assert len(requests) == 3

    def read_message_response(contents: list[dict[str, Any]]) -> Any:
        for c in contents:
            for p in c.get("parts", []):
                if p.get("function_response", {}).get("name") == "read_message":
                    return p["function_response"]["response"]
        raise AssertionError("no read_message response")

    # Second call: the payload is the latest content and reaches the model byte for byte.
    assert read_message_response(requests[1]) == {"result": payload}
    # Third call: it is history now, and stripped.
    assert read_message_response(requests[2]) == {"result": "<stripped: 6000 chars>"}
    # The user's own message is not a function response: untouched.
    assert requests[2][0]["parts"][0]["text"] == payload


def test_chat_run_counts_only_its_own_turn(pg_store: str) -> None:
    first = prepare_run(pg_store, "turn-1", "refund please", session_id="chat-9")
    assert run_runner(first, [{"call": "send_email", "args": EMAIL},
                              {"text": "Sent."}]).returncode == 0
    second = prepare_run(pg_store, "turn-2", "and update the CRM", session_id="chat-9")
    assert run_runner(second, [{"call": "update_crm",
                                "args": {"customer": "42", "status": "refunded"}},
                               {"text": "Updated."}]).returncode == 0
    third = prepare_run(pg_store, "turn-3", "thanks", session_id="chat-9")
    assert run_runner(third, [{"text": "You're welcome."}]).returncode == 0

    assert tools(first) == ["send_email"]
    assert tools(second) == ["update_crm"]
    assert tools(third) == []


def test_refuses_to_start_without_a_durable_store(pg_store: str) -> None:
    run = prepare_run(pg_store, "nostore-1")
    env = runner_env(run, [{"text": "hi"}])
    for missing in (RunnerEnv.STORE_URL, RunnerEnv.STORE_TOKEN_FILE):
        without = {k: v for k, v in env.items() if k != missing}
        done = launch(without)
        assert done.returncode == RunnerExit.NO_DURABLE_STORE, missing
        assert "no durable session store" in done.stderr
    # A database URL is no store for a runner: it holds no database credential.
    done = launch({**{k: v for k, v in env.items() if k != RunnerEnv.STORE_URL},
                   "DATABASE_URL": pg_store})
    assert done.returncode == RunnerExit.NO_DURABLE_STORE
    assert outcome(run) is None


def test_refuses_a_store_that_was_never_migrated(
    postgres_url: str, runner_world: RunnerWorld
) -> None:
    # The store API serves only a store at the schema it knows: until the operator has
    # migrated it, it says so, and the runner stops before anything runs.
    api = runner_world.store_api(postgres_url, ready=False)
    name, uid = runner_world.agent_run("unmigrated")
    me = runner_world.identity(name, uid, 1)
    run = Run(postgres_url, uid, name, "sha256:00", namespace=runner_world.namespace,
              identities={1: me})
    env = runner_env(run, [{"text": "hi"}])
    assert env[RunnerEnv.STORE_URL] == api.url
    # The store API asks it to come back (503, Retry-After); the runner does, for a window
    # (60 s in the image; 3 s here), then refuses the run saying what the store API said.
    done = launch(env, not_ready_seconds=3)
    assert done.returncode == RunnerExit.STORE_UNAVAILABLE, explain(done)
    assert "no agentrun tables" in done.stderr
    assert "store.not_ready" in done.stderr  # it did wait, and asked again

    async def tables(engine: AsyncEngine) -> set[str]:
        async with engine.connect() as conn:
            rows = await conn.execute(text(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public'"))
            return {r[0] for r in rows}

    assert "runs" not in query(postgres_url, tables)  # never created silently
    # Not ready, yet alive: a liveness probe must not restart a store API waiting for
    # its schema.
    assert not api.healthy()
    with urllib.request.urlopen(f"{api.url}/livez", timeout=5, context=TRUST) as answer:
        assert answer.status == 200


def test_input_gone_fails_before_the_agent_starts(pg_store: str) -> None:
    run = prepare_run(pg_store, "gone-1")
    query(pg_store, lambda e: store.delete_input(e, run.digest))
    done = run_runner(run, [{"call": "send_email", "args": EMAIL}, {"text": "Sent."}])
    assert done.returncode == RunnerExit.INPUT_UNAVAILABLE, explain(done)
    got = outcome(run)
    assert got is not None and got.reason == Reason.INPUT_UNAVAILABLE
    assert emails(pg_store) == []
    assert tools(run) == []


def test_unknown_agent_fails_with_its_name(pg_store: str) -> None:
    run = prepare_run(pg_store, "noagent-1", agent="no-such-agent")
    done = run_runner(run, [{"text": "hi"}])
    assert done.returncode == RunnerExit.AGENT_NOT_FOUND, explain(done)
    got = outcome(run)
    assert got is not None and got.reason == Reason.AGENT_NOT_FOUND
    assert got.message and "no Agent no-such-agent in namespace" in got.message
    assert "no agent 'no-such-agent' in" in got.message  # where the image was looked in
    assert tools(run) == []


def test_noop_agent_answers_without_tools(sqlite_store: str) -> None:
    run = prepare_run(sqlite_store, "noop-1", agent="noop-agent")
    done = run_runner(run, [{"text": "Hello."}])
    assert done.returncode == 0, explain(done)
    assert tools(run) == []


@pytest.mark.parametrize("flag_style", [True])
def test_cli_flags_override_the_environment(sqlite_store: str, flag_style: bool) -> None:
    run = prepare_run(sqlite_store, "flags-1", agent="noop-agent")
    env = runner_env(run, [{"text": "Hello."}])
    env["AGENTRUN_RUN_UID"] = "wrong-uid"
    done = launch(env, ["--run-uid", run.uid])
    assert done.returncode == 0, explain(done)
    assert outcome(run) is not None


def test_the_journal_keeps_each_calls_effect_key_and_result(pg_store: str) -> None:
    run = prepare_run(pg_store, "journal-1")
    done = run_runner(run, [{"call": "read_message"}, {"call": "send_email", "args": EMAIL},
                            {"call": "update_crm", "args": {"customer": "42",
                                                            "status": "refunded"}},
                            {"text": "Done."}])
    assert done.returncode == 0, explain(done)
    entries = query(pg_store, lambda e: store.ledger(e, run.uid))
    assert [(x.tool, x.effect) for x in entries] == [
        ("read_message", "ReadOnly"), ("send_email", "Idempotent"), ("update_crm", "Effectful")]
    assert entries[1].result == {"status": "sent", "to": EMAIL["to"]}
    # Keys: one per call, from the lineage and the call id (never the arguments).
    assert all(x.idempotency_key and x.idempotency_key.startswith("agentrun-") for x in entries)
    assert len({x.idempotency_key for x in entries}) == 3
    sent = emails(pg_store, run)
    assert [r.idempotency_key for r in sent] == [entries[1].idempotency_key]
    # The world dedupes by the key: the same call's email sent again is the same row.
    again = query(pg_store, lambda e: store.record_side_effect(
        e, "send_email", dict(EMAIL), run.name, run.uid, 2, entries[1].idempotency_key))
    assert again is False
    assert len(emails(pg_store, run)) == 1


def test_spec_tools_override_the_agents_declarations(pg_store: str) -> None:
    run = prepare_run(pg_store, "journal-2")
    done = run_runner(run, [{"call": "read_message"}, {"text": "Done."}], **{
        "AGENTRUN_TOOLS": json.dumps([{"name": "read_message", "effect": "Effectful"}])})
    assert done.returncode == 0, explain(done)
    entries = query(pg_store, lambda e: store.ledger(e, run.uid))
    assert [(x.tool, x.effect) for x in entries] == [("read_message", "Effectful")]
