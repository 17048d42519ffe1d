"""Partial index on fold_due_at; memory_settings_seen.

The fold-lag gauges count threads with a fold due from a partial index instead of scanning
every thread on each scrape. `memory_settings_seen` lets processes with different memory
settings (threshold, recent turns, cap, key prefix) notice each other.

Revision ID: 7b1e2f4c9d10
Revises: c5a8ea4dca55
Create Date: 2026-12-01 03:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "7b1e2f4c9d10"
down_revision: str | Sequence[str] | None = "c5a8ea4dca55"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_index(
        "ix_conversation_threads_fold_due",
        "conversation_threads",
        ["fold_due_at"],
        postgresql_where=sa.text("fold_due_at IS NOT NULL"),
    )
    op.create_table(
        "memory_settings_seen",
        sa.Column("fingerprint", sa.String(length=500), nullable=False),
        sa.Column(
            "last_seen", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("fingerprint", name=op.f("pk_memory_settings_seen")),
    )


def downgrade() -> None:
    op.drop_table("memory_settings_seen")
    op.drop_index(
        "ix_conversation_threads_fold_due",
        table_name="conversation_threads",
        postgresql_where=sa.text("fold_due_at IS NOT NULL"),
    )
