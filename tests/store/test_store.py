"""The run store's API, as the operator will call it, on real Postgres and SQLite."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from datetime import UTC, datetime, timedelta

import pytest
from agentrun_devtools.processes import free_port
from google.adk.memory.memory_entry import MemoryEntry
from google.genai import types
from sqlalchemy import event as sqlalchemy_event
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from agentrun import store
from agentrun.store.memory import StoreMemoryService
from agentrun.vocabulary import RunStatus
from tests.runner.runs import prepare_run, query, run_runner

pytestmark = pytest.mark.postgres

EMAIL = {"to": "c@example.com", "body": "hello"}


def test_inputs_are_content_addressed_and_copied(any_store: str) -> None:
    async def go(e: AsyncEngine) -> None:
        files = {"invoice.pdf": b"%PDF-1.4 \x00\xff", "notes.txt": b"call back"}
        key = await store.installation_key(e)
        assert key == await store.installation_key(e) and len(key) == 32  # made once
        digest = await store.put_input(e, "refund 42", files, key=key)
        assert digest == await store.put_input(e, "refund 42", dict(reversed(files.items())),
                                               key=key)
        assert digest.startswith("hmac-sha256:") and len(digest) == 12 + 64
        assert digest != await store.put_input(e, "refund 42", {"invoice.pdf": b"other"},
                                               key=key)
        assert digest != await store.put_input(e, "refund 42", key=key)
        got = await store.get_input(e, digest)
        assert got is not None and got.text == "refund 42" and got.files == files
        assert await store.delete_input(e, digest)
        assert await store.get_input(e, digest) is None
        assert not await store.delete_input(e, digest)

    query(any_store, go)


def test_record_run_and_start_attempt_are_idempotent(any_store: str) -> None:
    async def go(e: AsyncEngine) -> None:
        args = ("u1", "support", "triage-42", "support-agent", "manual", "alice", "sha256:ab")
        assert await store.record_run(e, *args)
        assert not await store.record_run(e, *args)  # an operator restart re-records
        await store.start_attempt(e, "u1", 1, "u1-1", "triage-42-1")
        await store.start_attempt(e, "u1", 1, "u1-1", "triage-42-1")
        run = await store.get_run(e, "u1")
        assert run is not None and run.status == RunStatus.RUNNING and run.attempts == 1
        attempt = await store.get_attempt(e, "u1", 1)
        assert attempt is not None
        # ADK app names are qualified by namespace: the same agent, user and session id
        # in another namespace is another session.
        assert (attempt.app_name, attempt.user_id, attempt.session_id) == (
            "support/support-agent", "alice", "u1-1")
        with pytest.raises(store.RunNotRecorded):
            await store.start_attempt(e, "never-recorded", 1, "s", "p")

    query(any_store, go)


def test_agent_snapshots_are_content_addressed_and_pinned_by_the_run(any_store: str) -> None:
    async def go(e: AsyncEngine) -> None:
        snapshot = {"root": "triage", "agents": {"triage": {"model": "m", "instruction": "é"}}}
        digest = await store.put_agent(e, snapshot)
        assert digest == await store.put_agent(e, {"agents": snapshot["agents"],
                                                    "root": "triage"})
        assert digest.startswith("sha256:") and len(digest) == 7 + 64
        assert await store.get_agent(e, digest) == snapshot
        assert await store.get_agent(e, "sha256:" + "0" * 64) is None
        args = ("u9", "support", "t-1", "triage", "manual", "alice", "hmac-sha256:ab")
        assert await store.record_run(e, *args, agent_digest=digest)
        # A second record (an operator restart) never changes the pinned snapshot.
        assert not await store.record_run(e, *args, agent_digest="sha256:other")
        run = await store.get_run(e, "u9")
        assert run is not None and run.agent_digest == digest
        assert await store.record_run(e, "u10", *args[1:])
        plain = await store.get_run(e, "u10")
        assert plain is not None and plain.agent_digest is None  # an image agent

    query(any_store, go)


def test_settle_first_writer_wins(any_store: str) -> None:
    async def go(e: AsyncEngine) -> None:
        await store.record_run(e, "u2", "ns", "r2", "support-agent", "manual", "bob", None)
        await store.start_attempt(e, "u2", 1, "u2-1", "r2-1")
        won = await store.settle(e, "u2", 1, RunStatus.FAILED, "Evicted", "evicted", None)
        late = await store.settle(e, "u2", 1, RunStatus.SUCCEEDED, None, None, [])
        assert (won, late) == (True, False)
        run = await store.get_run(e, "u2")
        assert run is not None
        assert (run.status, run.reason, run.tools_executed) == (RunStatus.FAILED, "Evicted", None)
        assert run.finished_at is not None and run.finished_at.tzinfo is not None
        # Unknown is filled once, later; a known value is never overwritten.
        assert await store.set_tools_executed(e, "u2", 1, ["send_email"])
        assert not await store.set_tools_executed(e, "u2", 1, [])
        run = await store.get_run(e, "u2")
        assert run is not None and run.tools_executed == ["send_email"]
        attempt = await store.get_attempt(e, "u2", 1)
        assert attempt is not None and attempt.tools_executed == ["send_email"]

        # Two replicas settling at once: exactly one wins.
        await store.record_run(e, "u3", "ns", "r3", "support-agent", "manual", "bob", None)
        await store.start_attempt(e, "u3", 1, "u3-1", "r3-1")
        results = await asyncio.gather(
            store.settle(e, "u3", 1, RunStatus.FAILED, "PodDeleted", "a", []),
            store.settle(e, "u3", 1, RunStatus.FAILED, "NodeLost", "b", []),
        )
        assert sorted(results) == [False, True]

    query(any_store, go)


def test_a_retry_attempt_takes_the_run_and_settles_it(any_store: str) -> None:
    async def go(e: AsyncEngine) -> None:
        await store.record_run(e, "u4", "ns", "r4", "noop-agent", "manual", "bob", None)
        await store.start_attempt(e, "u4", 1, "u4-1", "r4-1")
        assert await store.settle(e, "u4", 1, RunStatus.FAILED, "Evicted", "x", [])
        await store.start_attempt(e, "u4", 2, "u4-2", "r4-2")
        run = await store.get_run(e, "u4")
        assert run is not None and (run.status, run.attempts) == (RunStatus.RUNNING, 2)
        # A late event about attempt 1 changes nothing now.
        assert not await store.settle(e, "u4", 1, RunStatus.FAILED, "PodLost", "y", None)
        assert await store.settle(e, "u4", 2, RunStatus.SUCCEEDED, "Succeeded", "ok", [])
        run = await store.get_run(e, "u4")
        assert run is not None and (run.status, run.attempts) == (RunStatus.SUCCEEDED, 2)

    query(any_store, go)


def test_a_sync_reads_the_run_and_its_attempt_in_one_statement_each_row_as_it_is(
        any_store: str) -> None:
    """run_state reads the run's row and the attempt's together: each is what its own read
    gives (get_run, get_attempt), and either may be missing without the other."""

    async def go(e: AsyncEngine) -> None:
        await store.record_run(e, "u9", "ns", "r9", "noop-agent", "manual", "bob", "sha256:i")
        await store.start_attempt(e, "u9", 1, "u9-1", "r9-1")
        await store.settle(e, "u9", 1, RunStatus.FAILED, "Evicted", "x", ["send_email"])
        await store.start_attempt(e, "u9", 2, "u9-1", "r9-2", resumes_attempt=1)
        statements: list[str] = []

        def count(*args: object) -> None:
            statements.append(str(args[2]))

        sqlalchemy_event.listen(e.sync_engine, "before_cursor_execute", count)
        try:
            state = await store.run_state(e, "u9", 1)
        finally:
            sqlalchemy_event.remove(e.sync_engine, "before_cursor_execute", count)
        assert len(statements) == 1, statements
        assert state.run == await store.get_run(e, "u9")
        assert state.attempt == await store.get_attempt(e, "u9", 1)
        assert state.attempt is not None and state.run is not None
        # The columns both tables have are each the table's own.
        assert (state.run.status, state.attempt.status) == (RunStatus.RUNNING, RunStatus.FAILED)
        assert (state.attempt.tools_executed, state.attempt.message) == (["send_email"], "x")
        assert state.run.attempts == 2
        second = await store.run_state(e, "u9", 2)
        assert second.attempt == await store.get_attempt(e, "u9", 2)
        assert second.attempt is not None and second.attempt.resumes_attempt == 1
        # An attempt never started: the run alone.
        third = await store.run_state(e, "u9", 3)
        assert (third.run, third.attempt) == (state.run, None)
        # A run never written down: neither.
        none = await store.run_state(e, "nobody", 1)
        assert (none.run, none.attempt) == (None, None)
        # An attempt whose run's row is gone (no foreign key holds it): the attempt alone.
        async with e.begin() as conn:
            await conn.execute(text("DELETE FROM runs WHERE uid = 'u9'"))
        alone = await store.run_state(e, "u9", 1)
        assert (alone.run, alone.attempt) == (None, state.attempt)

    query(any_store, go)


def test_outcome_is_reported_once(any_store: str) -> None:
    async def go(e: AsyncEngine) -> None:
        await store.begin_attempt(e, "u5", 1, "support-agent", "alice", "u5-1")
        assert await store.get_outcome(e, "u5", 1) is None
        assert await store.record_outcome(e, "u5", 1, RunStatus.FAILED, "AgentError", "boom")
        assert not await store.record_outcome(e, "u5", 1, RunStatus.SUCCEEDED)
        got = await store.get_outcome(e, "u5", 1)
        assert got is not None and (got.status, got.reason, got.message) == (
            RunStatus.FAILED, "AgentError", "boom")

    query(any_store, go)


def test_tools_executed_is_empty_only_when_both_records_were_read(pg_store: str) -> None:
    run = prepare_run(pg_store, "three-1")
    done = run_runner(run, [{"text": "Nothing to do."}])
    assert done.returncode == 0, done.stderr
    # Both the ledger and the session were read, and hold no call: [].
    assert query(pg_store, lambda e: store.tools_executed(e, run.uid, 1)) == []

    # The session store is unreachable (nothing listens there): unknown, never [].
    down = f"postgresql+psycopg://agentrun@127.0.0.1:{free_port()}/nowhere"
    assert query(down, lambda e: store.tools_executed(e, run.uid, 1)) is None

    # The ledger is readable but the session events are not: unknown too.
    async def hide_events(engine: AsyncEngine) -> None:
        async with engine.begin() as conn:
            await conn.execute(text("ALTER TABLE events RENAME TO events_hidden"))

    query(pg_store, hide_events)
    assert query(pg_store, lambda e: store.tools_executed(e, run.uid, 1)) is None


def test_tools_executed_unions_ledger_and_session_in_call_order(pg_store: str) -> None:
    run = prepare_run(pg_store, "union-1")
    done = run_runner(run, [
        {"call": "send_email", "args": EMAIL},
        {"call": "update_crm", "args": {"customer": "42", "status": "open"}},
        {"call": "send_email", "args": EMAIL},
        {"text": "Done."},
    ])
    assert done.returncode == 0, done.stderr
    assert query(pg_store, lambda e: store.tools_executed(e, run.uid, 1)) == [
        "send_email", "update_crm", "send_email"]

    # A call the session holds but the ledger lost still counts (and vice versa).
    async def drop_ledger(engine: AsyncEngine) -> None:
        async with engine.begin() as conn:
            await conn.execute(text("DELETE FROM tool_calls WHERE seq = 2"))

    query(pg_store, drop_ledger)
    assert query(pg_store, lambda e: store.tools_executed(e, run.uid, 1)) == [
        "send_email", "update_crm", "send_email"]
    entries = query(pg_store, lambda e: store.ledger(e, run.uid))
    assert [(x.attempt, x.seq, x.tool) for x in entries] == [
        (1, 1, "send_email"), (1, 3, "send_email")]


def test_the_settle_reads_what_it_counts_once_and_counts_as_tools_executed(
        pg_store: str) -> None:
    """settle_then_state counts from the ledger and session rows it then shows (one read
    of each), with the same answer as tools_executed; when the session cannot be read,
    the attempt is settled all the same, its tools unknown (None), never []."""
    run = prepare_run(pg_store, "fence-1")
    assert run_runner(run, [
        {"call": "send_email", "args": EMAIL},
        {"call": "update_crm", "args": {"customer": "42", "status": "open"}},
        {"text": "Done."},
    ]).returncode == 0
    counted = query(pg_store, lambda e: store.tools_executed(e, run.uid, 1))
    assert counted == ["send_email", "update_crm"]

    def settle(uid: str) -> store.RunState | None:
        return query(pg_store, lambda e: store.settle_then_state(
            e, uid, 1, RunStatus.FAILED, "Evicted", "evicted", count=True, approvals=True,
            published=True))

    state = settle(run.uid)
    assert state is not None and state.run is not None and state.attempt is not None
    assert state.attempt.tools_executed == state.run.tools_executed == counted
    assert (state.run.status, state.attempt.status) == (RunStatus.FAILED, RunStatus.FAILED)
    assert state.ledger is not None and [x.tool for x in state.ledger] == counted
    assert state.usage is not None and state.usage.tool_calls == 2
    assert state.result is not None and state.result.text == "Done."
    # As run_state reads it afterwards.
    assert query(pg_store, lambda e: store.run_state(
        e, run.uid, 1, approvals=True, published=True)) == state

    hidden = prepare_run(pg_store, "fence-2")
    assert run_runner(hidden, [{"call": "send_email", "args": EMAIL},
                               {"text": "Sent."}]).returncode == 0

    async def hide_events(engine: AsyncEngine) -> None:
        async with engine.begin() as conn:
            await conn.execute(text("ALTER TABLE events RENAME TO events_hidden"))

    query(pg_store, hide_events)
    state = settle(hidden.uid)
    assert state is not None and state.run is not None and state.attempt is not None
    assert (state.attempt.status, state.attempt.tools_executed) == (RunStatus.FAILED, None)
    assert (state.run.status, state.run.tools_executed) == (RunStatus.FAILED, None)
    assert state.ledger is not None and [x.tool for x in state.ledger] == ["send_email"]


def test_a_pooled_connection_the_server_closed_is_replaced_before_use(
        pg_store: str) -> None:
    """No ping per checkout: a pooled connection whose backend the server ended (a restart,
    pg_terminate_backend) is found by its socket and replaced; the query runs."""

    async def go(e: AsyncEngine) -> None:
        async def backend() -> int:
            async with e.connect() as conn:
                return int((await conn.execute(text("SELECT pg_backend_pid()"))).scalar_one())

        first = await backend()
        other = store.make_engine(pg_store)
        try:  # another client ends the first connection's backend while it is pooled
            async with other.connect() as conn:
                assert (await conn.execute(
                    text(f"SELECT pg_terminate_backend({first})"))).scalar_one()
        finally:
            await other.dispose()
        await asyncio.sleep(0.5)  # the server's close reaches the idle socket
        assert await backend() != first

    query(pg_store, go)


def test_memory_is_scoped_per_agent_and_user(any_store: str) -> None:
    def entry(words: str) -> MemoryEntry:
        return MemoryEntry(author="user", content=types.Content(
            role="user", parts=[types.Part(text=words)]))

    async def go(e: AsyncEngine) -> None:
        memory = StoreMemoryService(e)
        await memory.add_memory(app_name="support-agent", user_id="alice",
                                memories=[entry("Alice prefers refunds by bank transfer")])
        await memory.add_memory(app_name="support-agent", user_id="bob",
                                memories=[entry("Bob wants a phone call")])

        async def found(app: str, user: str, query_text: str) -> list[str]:
            got = await memory.search_memory(app_name=app, user_id=user, query=query_text)
            return [m.content.parts[0].text or "" for m in got.memories if m.content.parts]

        assert await found("support-agent", "alice", "how to refund?") == [
            "Alice prefers refunds by bank transfer"]
        assert await found("support-agent", "bob", "refunds transfer Alice") == []
        assert await found("billing-agent", "alice", "refunds transfer") == []
        assert await found("support-agent", "bob", "PHONE") == ["Bob wants a phone call"]
        assert await found("support-agent", "alice", "the and of") == []

        # Entries expire after N days, and the purge removes them.
        expired = StoreMemoryService(e, ttl_days=0)
        await expired.add_memory(app_name="support-agent", user_id="carol",
                                 memories=[entry("Carol's refund")])
        assert await found("support-agent", "carol", "refund") == []
        assert await store.purge_expired_memory(e, datetime.now(UTC) + timedelta(seconds=1)) == 1

    query(any_store, go)


def test_a_successful_run_is_remembered_for_its_user_only(pg_store: str) -> None:
    run = prepare_run(pg_store, "mem-1", "My order number is 777", user_id="dora")
    assert run_runner(run, [{"text": "Noted your order 777."}]).returncode == 0

    async def search(e: AsyncEngine, user: str, app: str = run.app) -> int:
        got = await StoreMemoryService(e).search_memory(
            app_name=app, user_id=user, query="order 777")
        return len(got.memories)

    assert query(pg_store, lambda e: search(e, "dora")) == 2
    assert query(pg_store, lambda e: search(e, "alice")) == 0
    # Memory is the namespace's: the same agent and user elsewhere remember nothing.
    assert query(pg_store, lambda e: search(e, "dora", "elsewhere/support-agent")) == 0


def test_migrate_is_idempotent_and_safe_in_parallel(postgres_url: str) -> None:
    code = (
        "import asyncio, sys; from agentrun.store import migrate; "
        "asyncio.run(migrate(sys.argv[1]))"
    )
    procs = [subprocess.Popen([sys.executable, "-c", code, postgres_url]) for _ in range(4)]
    assert [p.wait(timeout=120) for p in procs] == [0, 0, 0, 0]
    asyncio.run(store.migrate(postgres_url))

    async def check(e: AsyncEngine) -> None:
        await store.check_schema(e)

    query(postgres_url, check)


def test_store_urls_are_normalised_to_async_drivers() -> None:
    assert store.async_url("postgresql+psycopg://u@h/db") == "postgresql+psycopg://u@h/db"
    assert store.async_url("postgresql://u:p@h:5432/db") == "postgresql+psycopg://u:p@h:5432/db"
    assert store.async_url("postgres://u@h/db") == "postgresql+psycopg://u@h/db"
    assert store.async_url("sqlite:///var/agentrun.db") == "sqlite+aiosqlite:///var/agentrun.db"
    assert store.session_service_url("sqlite:////abs/a.db") == "sqlite+aiosqlite:////abs/a.db"
    assert not store.is_durable(None)
    assert not store.is_durable("sqlite:///:memory:")
    assert not store.is_durable("sqlite://")
    assert store.is_durable("sqlite:///x.db")
    assert store.is_durable("postgresql+psycopg://h/db")
    engine = store.make_engine("postgresql+psycopg://u@h/db")
    assert (engine.pool.size(), engine.pool._max_overflow) == (3, 2)  # type: ignore[attr-defined]
    engine = store.make_engine("postgresql+psycopg://u@h/db", pool_size=1, max_overflow=0)
    assert engine.pool.size() == 1  # type: ignore[attr-defined]


def test_a_fork_is_what_adk_reads_back_without_the_contentless_events(any_store: str) -> None:
    # The operator forks with plain SQL on ADK's tables (it carries no ADK); ADK itself
    # must read the copy as the source's session, minus what a fork leaves out, and go on
    # appending to it.
    from google.adk.events.event import Event
    from google.adk.events.event_actions import EventActions
    from google.adk.sessions.database_session_service import DatabaseSessionService

    app, user = "shop/support-agent", "alice"

    def say(author: str, invocation: str, part: types.Part | None, *,
            delta: dict[str, object] | None = None, error: str | None = None) -> Event:
        return Event(author=author, invocation_id=invocation,
                     content=types.Content(role="user" if author == "user" else "model",
                                           parts=[part]) if part else None,
                     actions=EventActions(state_delta=delta or {}), error_code=error)

    async def go(e: AsyncEngine) -> None:
        adk = DatabaseSessionService(db_engine=e)
        source = await adk.create_session(app_name=app, user_id=user, session_id="s-1",
                                          state={"order": "42"})
        for event in (
            say("user", "inv-1", types.Part(text="refund order 42")),
            say("agent", "inv-1", types.Part(function_call=types.FunctionCall(
                id="adk-1", name="send_email", args={"to": "c@example.com"})),
                delta={"step": "emailing", "user:tier": "gold", "app:region": "eu"}),
            say("agent", "inv-1", types.Part(function_response=types.FunctionResponse(
                id="adk-1", name="send_email", response={"sent": True}))),
            say("agent", "inv-1", None, error="MODEL_ERROR"),
        ):
            await adk.append_event(source, event)
        before = await adk.get_session(app_name=app, user_id=user, session_id="s-1")
        assert before is not None and len(before.events) == 4

        assert await store.fork_session(e, app_name=app, user_id=user, source="s-1",
                                        target="s-1-resume")
        assert not await store.fork_session(e, app_name=app, user_id=user, source="s-1",
                                            target="s-1-resume")
        with pytest.raises(LookupError):
            await store.fork_session(e, app_name=app, user_id=user, source="gone",
                                     target="gone-resume")

        fork = await adk.get_session(app_name=app, user_id=user, session_id="s-1-resume")
        assert fork is not None
        kept = before.events[:3]
        assert [(x.id, x.invocation_id, x.author, x.timestamp, x.content)
                for x in fork.events] == [
            (x.id, x.invocation_id, x.author, x.timestamp, x.content) for x in kept]
        # Session state copied; app and user state shared, not copied into the session.
        assert fork.state == before.state
        assert fork.state["step"] == "emailing" and fork.state["user:tier"] == "gold"
        assert fork.events[1].actions.state_delta == {"step": "emailing"}
        # ADK goes on with the copy; the source stays as it was.
        await adk.append_event(fork, say("agent", "inv-1", types.Part(text="Refunded.")))
        again = await adk.get_session(app_name=app, user_id=user, session_id="s-1-resume")
        assert again is not None and again.events[-1].content.parts[0].text == "Refunded."
        after = await adk.get_session(app_name=app, user_id=user, session_id="s-1")
        assert after is not None and [x.id for x in after.events] == [
            x.id for x in before.events]

    query(any_store, go)
