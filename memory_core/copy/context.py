"""The conversation context handed to workflow nodes: running summary + recent exchanges.

Both are `Record`s (memory_core/records.py): immutable msgspec Structs the garbage collector
does not track, decoded from a working copy's JSON in one typed pass.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

import msgspec

from memory_core.records import Record, as_tuples
from memory_core.write.artifacts import Artifact, artifacts_from


class Exchange(Record, frozen=True, kw_only=True, gc=False):
    """One user-query -> answer turn as memory sees it (the transcript payload is not here)."""

    seq: int
    session_id: UUID
    user_query: str
    answer: str = ""
    artifacts: tuple[Artifact, ...] = ()
    completed_at: datetime

    def __post_init__(self) -> None:
        # A decoded one is a tuple already: checked inline (memory_core/write/artifacts.py).
        if type(self.artifacts) is not tuple:
            as_tuples(self, "artifacts")

    @classmethod
    def from_row(cls, row: Any) -> Exchange:
        """From a thread_messages row (ORM object or Core row): artifacts read back as stored."""
        return cls(
            seq=row.seq,
            session_id=row.session_id,
            user_query=row.user_query,
            answer=row.answer,
            artifacts=artifacts_from(row.artifacts),
            completed_at=row.completed_at,
        )


class ConversationContext(Record, frozen=True, kw_only=True, gc=False):
    """What `get_context` returns: JSON-serialisable, equal whether read from Redis or Postgres.

    `recent` holds every unfolded turn (seq > summary_through_seq) oldest first, up to the
    working-copy cap; turns older than that are covered by `summary`.
    """

    thread_id: UUID
    summary: str | None = None
    summary_through_seq: int = 0
    recent: list[Exchange] = msgspec.field(default_factory=list)
    # Turns a read was asked to include (`get_context(wait_for=..., on_timeout="flag")`) that
    # were not saved in time: the context is answered without them. Empty otherwise.
    missing_session_ids: list[UUID] = msgspec.field(default_factory=list)
