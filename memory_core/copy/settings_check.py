"""Processes that disagree on memory settings notice each other.

Agents, finalize workers and fold workers each build their own `RedisConversationMemory`. If
they disagree on the key prefix, one writes working copies the other never reads (a follow-up
misses turns until the copy expires); on the threshold, the recent-turn count or the fold token
trigger, finalize asks for folds the fold worker declines. Each process records a fingerprint
of the settings that must agree in `memory_settings_seen` (at most once an hour per
fingerprint, in a background thread: never on the caller's path) and warns
(`memory.settings_disagree`, gauge `memory_settings_disagreements`) when another fingerprint
was recorded in the last two hours.
The fingerprint holds settings only, never content.
"""

from __future__ import annotations

import re
import threading
import time
from typing import TYPE_CHECKING, Any, Protocol

from sqlalchemy import delete, literal_column, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.engine import Connection
from sqlalchemy.sql import func

from memory_core.logs import get_logger
from memory_core.metrics import SETTINGS_DISAGREEMENTS
from memory_core.models import MemorySettingsSeen as Seen

if TYPE_CHECKING:
    from sqlalchemy import Engine


class MemorySettings(Protocol):
    """The settings of a `RedisConversationMemory` that its fingerprint covers. A protocol, so
    this module sits below memory_core/conversation_memory.py instead of importing it back."""

    engine: Engine
    key_prefix: str
    compression_threshold: int
    max_recent_messages: int
    max_unfolded_messages: int
    fold_token_trigger: int


log = get_logger(__name__)

ANNOUNCE_EVERY_S = 3600.0
WINDOW = "2 hours"
FORGET_AFTER = "7 days"
_MAX_ANNOUNCED = 64
_announced: dict[tuple[object, ...], float] = {}
_lock = threading.Lock()
_PREFIX = re.compile(r"key_prefix=(.+?) compression_threshold=")


def fingerprint(memory: MemorySettings) -> str:
    return (
        f"key_prefix={memory.key_prefix} compression_threshold={memory.compression_threshold} "
        f"max_recent_messages={memory.max_recent_messages} "
        f"max_unfolded_messages={memory.max_unfolded_messages} "
        f"fold_token_trigger={memory.fold_token_trigger}"
    )[:500]


def announce(memory: MemorySettings, *, wait: bool = False) -> threading.Thread | None:
    """Record this process's fingerprint and check for others, in a daemon thread.

    Called for every memory built (a save without `memory=` builds one): the key is a plain
    tuple so the common case, announced within the hour, costs a dict look-up.
    """
    m = memory
    key: tuple[object, ...] = (id(m.engine), m.key_prefix, m.compression_threshold)
    key += (m.max_recent_messages, m.max_unfolded_messages, m.fold_token_trigger)
    now = time.monotonic()
    with _lock:
        if now - _announced.get(key, -ANNOUNCE_EVERY_S - 1) < ANNOUNCE_EVERY_S:
            return None
        if len(_announced) >= _MAX_ANNOUNCED:
            _announced.clear()
        _announced[key] = now
    fp = fingerprint(memory)
    worker = threading.Thread(target=check, args=(memory, fp), name="memory-settings", daemon=True)
    worker.start()
    if wait:
        worker.join()
    return worker


def check(memory: MemorySettings, fp: str) -> list[str]:
    """Upsert `fp`; the other fingerprints seen within the window (warned about)."""
    try:
        with memory.engine.begin() as conn:
            conn.execute(
                insert(Seen)
                .values(fingerprint=fp)
                .on_conflict_do_update(
                    index_elements=[Seen.fingerprint], set_={"last_seen": func.now()}
                )
            )
            conn.execute(delete(Seen).where(Seen.last_seen < func.now() - _ago(FORGET_AFTER)))
            others = list(
                conn.scalars(
                    select(Seen.fingerprint).where(
                        Seen.fingerprint != fp,
                        Seen.last_seen > func.now() - _ago(WINDOW),
                    )
                )
            )
    except Exception as exc:  # an old schema, Postgres down: this is only a warning system
        log.debug("memory.settings_check_skipped", error=type(exc).__name__)
        return []
    SETTINGS_DISAGREEMENTS.set(len(others))
    if others:
        log.warning("memory.settings_disagree", here=fp, elsewhere=others)
    return others


def seen_key_prefixes(conn: Connection) -> set[str]:
    """The key prefixes of every fingerprint on record (the last 7 days): a delete removes
    a thread's copies under each, since a process still on an old prefix serves its own."""
    fingerprints = conn.scalars(select(Seen.fingerprint))
    return {m.group(1) for fp in fingerprints if (m := _PREFIX.match(fp))}


def _ago(interval: str) -> Any:
    return literal_column(f"interval '{interval}'")


def forget_announced() -> None:
    """Tests: announce again on the next memory."""
    with _lock:
        _announced.clear()
