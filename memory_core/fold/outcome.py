"""What a fold attempt returns (`FoldOutcome`), the summarizer it calls (`Summarizer`), and the
backoff between failed attempts. Separate from folding.py so the task, the CLI and the tests
name them without the fold's machinery; folding.py re-exports them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Protocol

from memory_core.copy.context import Exchange

BACKOFF_BASE_S = 60
BACKOFF_CAP_S = 3600


def backoff_delay(attempt: int, base_s: int = BACKOFF_BASE_S, cap_s: int = BACKOFF_CAP_S) -> int:
    """Delay before retry number `attempt` (1-based): base, 2 x base, 4 x base, ... capped
    (MEMORY_FOLD_BACKOFF_BASE_S / _CAP_S: 60, 120, 240, ... 3600 s by default)."""
    return int(min(base_s * 2 ** (max(attempt, 1) - 1), cap_s))


class Summarizer(Protocol):
    def summarize(
        self, *, thread_id: str, previous_summary: str | None, exchanges: list[Exchange]
    ) -> SummaryLike: ...


class SummaryLike(Protocol):
    @property
    def text(self) -> str: ...
    @property
    def prompt(self) -> str: ...


FoldStatus = Literal["folded", "noop", "busy", "lost", "failed", "missing"]


@dataclass(frozen=True)
class FoldOutcome:
    status: FoldStatus
    thread_id: str
    through_seq: int | None = None
    folded: int = 0
    attempt: int = 0
    retry_in_s: int | None = None
    error: str | None = None
    prompt: str | None = None
    session_id: str | None = None
    more_pending: bool = False
    fallback: str | None = None  # why the LLM-free summary was used instead of the LLM's
    instructions_restored: int = 0  # standing instructions the LLM dropped, put back by code
    superseded_dropped: int = 0  # superseded ones the LLM kept as current, removed by code
