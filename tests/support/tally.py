"""Exactly-once bookkeeping of a load: what agents sent against what Postgres holds."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from tests.support.state import stored


@dataclass
class Tally:
    """Every turn sent, by session_id, with its thread."""

    sent: dict[str, uuid.UUID]  # session_id -> thread_id

    def check(self) -> tuple[int, int, dict[uuid.UUID, list[tuple[int, str]]]]:
        """(lost, duplicated, rows); duplicated counts extra rows and seq gaps/repeats."""
        tids = set(self.sent.values())
        rows = stored(tids)
        stored_sids = [sid for per in rows.values() for _, sid in per]
        lost = len(set(self.sent) - set(stored_sids))
        duplicated = len(stored_sids) - len(set(stored_sids))
        duplicated += len(set(stored_sids) - set(self.sent))  # a row nobody sent
        return lost, duplicated, rows


def assert_gapless(rows: dict[uuid.UUID, list[tuple[int, str]]]) -> None:
    """seq 1, 2, 3, ... in every thread: no gap, no repeat."""
    for tid, per in rows.items():
        seqs = [seq for seq, _ in per]
        assert seqs == list(range(1, len(seqs) + 1)), f"seq gap or repeat in {tid}: {seqs}"
