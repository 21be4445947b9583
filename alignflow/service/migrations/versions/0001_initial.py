"""Feedback, API tokens and training jobs.

Revision ID: 0001
Revises:
Create Date: 2025-01-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "feedback",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("agent_id", sa.String(64), nullable=False),
        sa.Column("kind", sa.String(16), nullable=False),
        sa.Column("prompt", sa.Text, nullable=False),
        sa.Column("response", sa.Text),
        sa.Column("score", sa.Float),
        sa.Column("chosen", sa.Text),
        sa.Column("rejected", sa.Text),
        sa.Column("run_id", sa.String(200)),
        sa.Column("notes", sa.Text),
        sa.Column("idempotency_key", sa.String(200)),
        sa.Column("request_hash", sa.String(64), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.UniqueConstraint("agent_id", "idempotency_key", name="uq_feedback_idempotency"),
    )
    op.create_index("ix_feedback_agent_created", "feedback", ["agent_id", "created_at"])
    op.create_table(
        "api_tokens",
        sa.Column("token_hash", sa.String(64), primary_key=True),
        sa.Column("name", sa.String(100), nullable=False),
        sa.Column("agents", sa.JSON),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("agent_id", sa.String(64), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("params", sa.JSON, nullable=False),
        sa.Column("dataset_path", sa.Text),
        sa.Column("feedback_count", sa.Integer, nullable=False),
        sa.Column("result", sa.JSON),
        sa.Column("error", sa.Text),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_jobs_agent_created", "jobs", ["agent_id", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_jobs_agent_created", table_name="jobs")
    op.drop_table("jobs")
    op.drop_table("api_tokens")
    op.drop_index("ix_feedback_agent_created", table_name="feedback")
    op.drop_table("feedback")
