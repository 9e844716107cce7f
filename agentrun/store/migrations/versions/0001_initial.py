"""Initial schema: runs, attempts, the tool ledger, inputs, memory, sample_outbox.

Revision ID: 0001
Revises:
Create Date: 2026-11-30 00:45:32.491934
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "attempts",
        sa.Column("run_uid", sa.String(length=64), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("pod_name", sa.String(length=253), nullable=True),
        sa.Column("app_name", sa.String(length=253), nullable=True),
        sa.Column("user_id", sa.String(length=253), nullable=True),
        sa.Column("session_id", sa.String(length=253), nullable=True),
        sa.Column("invocation_id", sa.String(length=253), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.String(length=64), nullable=True),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("tools_executed", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("outcome_status", sa.String(length=16), nullable=True),
        sa.Column("outcome_reason", sa.String(length=64), nullable=True),
        sa.Column("outcome_message", sa.Text(), nullable=True),
        sa.Column("outcome_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("runner_started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("run_uid", "attempt", name=op.f("pk_attempts")),
    )
    op.create_table(
        "inputs",
        sa.Column("digest", sa.String(length=80), nullable=False),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("digest", name=op.f("pk_inputs")),
    )
    op.create_table(
        "memory",
        sa.Column("id", sa.String(length=64), nullable=False),
        sa.Column("agent", sa.String(length=253), nullable=False),
        sa.Column("user_id", sa.String(length=253), nullable=False),
        sa.Column("session_id", sa.String(length=253), nullable=True),
        sa.Column("author", sa.String(length=253), nullable=True),
        sa.Column("text", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_memory")),
    )
    op.create_index(
        op.f("ix_memory_agent_user_id_expires_at"), "memory", ["agent", "user_id", "expires_at"]
    )

    op.create_table(
        "runs",
        sa.Column("uid", sa.String(length=64), nullable=False),
        sa.Column("namespace", sa.String(length=253), nullable=False),
        sa.Column("name", sa.String(length=253), nullable=False),
        sa.Column("agent", sa.String(length=253), nullable=False),
        sa.Column("trigger", sa.String(length=32), nullable=False),
        sa.Column("user_id", sa.String(length=253), nullable=False),
        sa.Column("input_digest", sa.String(length=80), nullable=True),
        sa.Column("replay_of", sa.String(length=253), nullable=True),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("reason", sa.String(length=64), nullable=True),
        sa.Column("message", sa.Text(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("tools_executed", sa.JSON(none_as_null=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("uid", name=op.f("pk_runs")),
    )
    op.create_index(op.f("ix_runs_namespace_name"), "runs", ["namespace", "name"])

    op.create_table(
        "sample_outbox",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("run_name", sa.String(length=253), nullable=True),
        sa.Column("run_uid", sa.String(length=64), nullable=True),
        sa.Column("attempt", sa.Integer(), nullable=True),
        sa.Column("tool", sa.String(length=255), nullable=False),
        sa.Column("args", sa.JSON(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_sample_outbox")),
    )
    op.create_index(op.f("ix_sample_outbox_run_name"), "sample_outbox", ["run_name"])

    op.create_table(
        "tool_calls",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("run_uid", sa.String(length=64), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("tool", sa.String(length=255), nullable=False),
        sa.Column("call_id", sa.String(length=255), nullable=True),
        sa.Column("args_digest", sa.String(length=80), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("outcome", sa.String(length=16), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tool_calls")),
        sa.UniqueConstraint(
            "run_uid", "attempt", "seq", name=op.f("uq_tool_calls_run_uid_attempt_seq")
        ),
    )
    op.create_table(
        "input_files",
        sa.Column("digest", sa.String(length=80), nullable=False),
        sa.Column("name", sa.String(length=255), nullable=False),
        sa.Column("content", sa.LargeBinary(), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["digest"],
            ["inputs.digest"],
            name=op.f("fk_input_files_digest_inputs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("digest", "name", name=op.f("pk_input_files")),
    )


def downgrade() -> None:
    op.drop_table("input_files")
    op.drop_table("tool_calls")
    op.drop_index(op.f("ix_sample_outbox_run_name"), table_name="sample_outbox")
    op.drop_table("sample_outbox")
    op.drop_index(op.f("ix_runs_namespace_name"), table_name="runs")
    op.drop_table("runs")
    op.drop_index(op.f("ix_memory_agent_user_id_expires_at"), table_name="memory")
    op.drop_table("memory")
    op.drop_table("inputs")
    op.drop_table("attempts")
