"""Thread lifecycle: tombstones of deleted threads, pending Langfuse trace purges.

`thread_tombstones` holds the id and deletion time of every deleted thread (no owner, no
content). A trigger refuses to insert a thread row whose id has a tombstone: a finalize that
was waiting on the row lock of a thread being deleted would otherwise re-create the thread
when the lock is released (`INSERT ... ON CONFLICT` retries the insert once the conflicting
row is gone). The trigger runs after the insert, with a fresh snapshot, so it sees a tombstone
committed while the insert waited. SQLSTATE AM001 = "thread deleted". SECURITY DEFINER (with
the migration's search_path): a role that may only write threads and turns, as a least-privilege
finalize worker's, needs no grant on the tombstones for the check.

`trace_purges` lists deleted threads whose Langfuse traces still have to be deleted (id and
time only), retried until a pass after the settle window finds none.

Revision ID: 3d9a6c1e5b27
Revises: 7b1e2f4c9d10
Create Date: 2026-12-01 12:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "3d9a6c1e5b27"
down_revision: str | Sequence[str] | None = "7b1e2f4c9d10"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_FUNCTION = """
CREATE FUNCTION refuse_deleted_thread() RETURNS trigger LANGUAGE plpgsql
SECURITY DEFINER SET search_path FROM CURRENT AS $$
BEGIN
  IF EXISTS (SELECT 1 FROM thread_tombstones WHERE thread_id = NEW.id) THEN
    RAISE EXCEPTION 'thread deleted' USING ERRCODE = 'AM001';
  END IF;
  RETURN NULL;
END
$$
"""

_TRIGGER = """
CREATE TRIGGER refuse_deleted_thread AFTER INSERT ON conversation_threads
FOR EACH ROW EXECUTE FUNCTION refuse_deleted_thread()
"""


def upgrade() -> None:
    op.create_table(
        "thread_tombstones",
        sa.Column("thread_id", sa.UUID(), nullable=False),
        sa.Column(
            "deleted_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("thread_id", name=op.f("pk_thread_tombstones")),
    )
    op.create_table(
        "trace_purges",
        sa.Column("thread_id", sa.UUID(), nullable=False),
        sa.Column(
            "requested_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("attempts", sa.Integer(), server_default=sa.text("0"), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint("thread_id", name=op.f("pk_trace_purges")),
    )
    # Retention scans threads by last activity.
    op.create_index("ix_conversation_threads_updated_at", "conversation_threads", ["updated_at"])
    op.execute(_FUNCTION)
    op.execute(_TRIGGER)


def downgrade() -> None:
    op.execute("DROP TRIGGER refuse_deleted_thread ON conversation_threads")
    op.execute("DROP FUNCTION refuse_deleted_thread()")
    op.drop_index("ix_conversation_threads_updated_at", table_name="conversation_threads")
    op.drop_table("trace_purges")
    op.drop_table("thread_tombstones")
