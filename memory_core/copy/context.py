"""The conversation context handed to workflow nodes: running summary + recent exchanges."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field

from memory_core.write.artifacts import Artifact


class Exchange(BaseModel):
    """One user-query -> answer turn as memory sees it (the transcript payload is not here)."""

    model_config = ConfigDict(frozen=True)

    seq: int
    session_id: UUID
    user_query: str
    answer: str = ""
    artifacts: list[Artifact] = Field(default_factory=list)
    completed_at: datetime

    @classmethod
    def from_row(cls, row: Any) -> Exchange:
        """From a thread_messages row (ORM object or Core row): artifacts read back as stored."""
        return cls(
            seq=row.seq,
            session_id=row.session_id,
            user_query=row.user_query,
            answer=row.answer,
            artifacts=row.artifacts,
            completed_at=row.completed_at,
        )


class ConversationContext(BaseModel):
    """What `get_context` returns: JSON-serialisable, equal whether read from Redis or Postgres.

    `recent` holds every unfolded turn (seq > summary_through_seq) oldest first, up to the
    working-copy cap; turns older than that are covered by `summary`.
    """

    model_config = ConfigDict(frozen=True)

    thread_id: UUID
    summary: str | None = None
    summary_through_seq: int = 0
    recent: list[Exchange] = Field(default_factory=list)
    # Turns a read was asked to include (`get_context(wait_for=..., on_timeout="flag")`) that
    # were not saved in time: the context is answered without them. Empty otherwise.
    missing_session_ids: list[UUID] = Field(default_factory=list)
