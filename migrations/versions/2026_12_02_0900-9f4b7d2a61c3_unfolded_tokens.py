"""conversation_threads.unfolded_tokens: the fold token trigger's counter.

The estimated tokens (memory_core.tokens.turn_size) of a thread's unfolded turns: a finalize
adds its turn's size when `MEMORY_FOLD_TOKEN_TRIGGER` is on, a fold subtracts the sizes of the
turns it folded. Existing threads start at 0 (adding the column rewrites no rows): their turns
stored before the upgrade are not counted, and the next fold that reads the unfolded turns
corrects the counter (memory_core/fold/tokens.py).

Revision ID: 9f4b7d2a61c3
Revises: 3d9a6c1e5b27
Create Date: 2026-12-02 09:00:00

"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "9f4b7d2a61c3"
down_revision: str | Sequence[str] | None = "3d9a6c1e5b27"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "conversation_threads",
        sa.Column("unfolded_tokens", sa.Integer(), server_default=sa.text("0"), nullable=False),
    )


def downgrade() -> None:
    op.drop_column("conversation_threads", "unfolded_tokens")
