"""Republishing folds that were requested and then lost: the `memory.sweep_folds` beat task.

A fold request lives in two places: the thread row (`fold_due_at`, written in the turn's own
statement) and a `memory.fold_thread` message. The message can be lost while the row keeps
the request: a save whose publish failed (broker down), a process killed between its COMMIT
and its publish, a broker restarted without its data, a failed fold's retry that went with
its worker. A later turn of the thread republishes such a fold after
`MEMORY_FOLD_REPUBLISH_GRACE_S` (memory_core/write/claim.py), and a redelivered turn at once, but a
thread that has gone quiet sends neither: its unfolded turns would wait for its next turn,
maybe days. The sweep closes that gap for every thread at once.

A fold is *lost* when it has been due for longer than the grace and no fold holds its lease
(a live lease: a fold is running; a failed fold's retry is due later, its backoff, so it only
counts once that time is a grace past). The sweep stamps `fold_due_at = now()` on the threads
it takes (as a turn's republish does: no second republish within the grace), commits, and
only then publishes. `FOR UPDATE SKIP LOCKED` keeps two sweeps (or a sweep and a turn) off
the same rows. A message for a fold that is merely late (a queue backlog longer than the
grace) is harmless: the fold that runs second finds nothing to do.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from sqlalchemy import func, select, update

from memory_core.conversation_memory import RedisConversationMemory
from memory_core.fold.publisher import publish_fold
from memory_core.logs import get_logger
from memory_core.metrics import FOLDS_REPUBLISHED
from memory_core.models import ConversationThread, no_live_lease

log = get_logger(__name__)

# Threads taken per pass: a pass stays one short transaction; the next pass takes the rest.
SWEEP_BATCH = 500


@dataclass
class FoldSweep:
    found: int = 0  # lost folds taken (stamped due now)
    published: int = 0  # of those, published; the rest wait a grace for the next pass


def lost_folds(memory: RedisConversationMemory, *, limit: int = SWEEP_BATCH) -> list[uuid.UUID]:
    """Take up to `limit` lost folds, oldest request first: stamp them due now and commit."""
    t = ConversationThread
    grace = func.make_interval(0, 0, 0, 0, 0, 0, memory.settings.memory_fold_republish_grace_s)
    unleased = no_live_lease(t.fold_lease_until)
    lost = (
        select(t.id)
        .where(t.fold_due_at < func.now() - grace, unleased)
        .order_by(t.fold_due_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
        .scalar_subquery()
    )
    stamp = update(t).where(t.id.in_(lost)).values(fold_due_at=func.now()).returning(t.id)
    with memory.session_factory() as session:
        ids = list(session.scalars(stamp))
        session.commit()
    return ids


def sweep_lost_folds(
    memory: RedisConversationMemory, *, limit: int = SWEEP_BATCH, broker_url: str | None = None
) -> FoldSweep:
    """Publish a fold for every lost fold (up to `limit`); see the module docstring."""
    ids = lost_folds(memory, limit=limit)
    url = broker_url or memory.settings.celery_broker_url
    published = 0
    for tid in ids:
        if publish_fold(tid, url):
            published += 1
        else:  # the broker is down: the others would fail alike; the next pass retries them
            break
    FOLDS_REPUBLISHED.inc(published)
    if ids:
        log.warning("memory.lost_folds_republished", found=len(ids), published=published)
    return FoldSweep(found=len(ids), published=published)
