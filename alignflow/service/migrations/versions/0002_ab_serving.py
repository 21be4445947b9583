"""Served completions (who wrote what, for whom) and each agent's traffic split.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "generations",
        sa.Column("id", sa.String(32), primary_key=True),
        sa.Column("agent_id", sa.String(64), nullable=False),
        sa.Column("policy_version", sa.String(32), nullable=False),
        sa.Column("arm", sa.String(16), nullable=False),
        sa.Column("user_key", sa.String(64)),
        sa.Column("prompt", sa.Text, nullable=False),
        sa.Column("completion", sa.Text, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_generations_agent_version", "generations", ["agent_id", "policy_version"])
    op.create_table(
        "traffic_splits",
        sa.Column("agent_id", sa.String(64), primary_key=True),
        sa.Column("challenger_share", sa.Float, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("traffic_splits")
    op.drop_index("ix_generations_agent_version", table_name="generations")
    op.drop_table("generations")
