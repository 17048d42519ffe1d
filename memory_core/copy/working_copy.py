"""The Redis working copy of a thread: summary cursor + unfolded turns, every key with a TTL.

Layout (one thread's keys share the hash tag `{thread_id}`, so the scripts below run
unchanged on Redis Cluster):

    <prefix>:{<thread_id>}:meta   hash  owner, through (summary cursor), summary, last
    <prefix>:{<thread_id>}:turns  zset  score = seq, member = Exchange JSON
    <prefix>:{<thread_id>}:gone   string, only for a deleted thread (no copy may be written)
    <prefix>:{<thread_id>}:saved  pub/sub channel: every successful write publishes "1" on it
                                  (a reader waiting for an enqueued turn re-reads; read_wait.py)

The copy is contiguous: it holds every turn from its oldest entry up to `last`, with no hole.
Writes go through one Lua script with two modes:

* append: add turn `seq` when it is `last + 1`; a replayed turn is a no-op. Returns `missing`
  (no copy), `gap` (an earlier write was missed, e.g. Redis was unreachable) or `stale` (a fold
  committed a newer summary than the copy has): the caller then rebuilds from Postgres.
* merge: union a complete Postgres snapshot into the copy (creating it if absent). Merging is
  monotonic (newer summary wins, rows are unioned by seq), so concurrent rebuilds and appends
  converge whatever order they land in.
* refresh: a fold's new summary, carried into an *existing* copy only. A fold reads no turns
  after the ones it folded, so it must never create a copy: one holding the summary alone
  would claim to be complete while the newest turns sit only in Postgres (`missing`: the next
  read rebuilds the copy whole).

A deleted thread's copy is removed by `forget`, which leaves the `gone` marker (TTL = the
copy's TTL): every write above refuses it (`gone`), so a write that was in flight when the
thread was deleted (a rebuild that read Postgres just before, a turn committed just before)
cannot bring the copy back.

Both then drop turns covered by the summary, cap the unfolded turns at `cap` (oldest first;
they stay in Postgres and the next fold covers them) and refresh the TTL of both keys.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from typing import Any, NamedTuple
from uuid import UUID

import msgspec

from memory_core.copy.context import ConversationContext, Exchange
from memory_core.io.redis_kinds import SyncRedis
from memory_core.io.steps import Delete, Script

_WRITE = """
local meta, turns = KEYS[1], KEYS[2]
if redis.call('EXISTS', KEYS[3]) == 1 then return 'gone' end
local mode, owner = ARGV[1], ARGV[2]
local through, last = tonumber(ARGV[4]), tonumber(ARGV[5])
local ttl, cap = tonumber(ARGV[6]), tonumber(ARGV[7])
local exists = redis.call('EXISTS', meta) == 1
local cur_through, cur_last = -1, 0
if exists then
  if redis.call('HGET', meta, 'owner') ~= owner then return 'owner' end
  cur_through = tonumber(redis.call('HGET', meta, 'through'))
  cur_last = tonumber(redis.call('HGET', meta, 'last'))
elseif mode ~= 'merge' then
  return 'missing'
end
local add_rows = true
if mode == 'append' then
  if through > cur_through then return 'stale' end
  local s = tonumber(ARGV[9])
  if s > cur_last + 1 then return 'gap' end
  add_rows = s == cur_last + 1
end
-- Out of memory (noeviction), any write below may fail, after earlier ones landed. Whatever
-- happened, readers see a new version first and both keys keep a TTL (PEXPIRE is allowed
-- when out of memory); the caller drops a copy whose write failed.
local ok, err = pcall(function()
  if exists then
    redis.call('HINCRBY', meta, 'v', 1)
  else
    -- A fresh copy starts at a random version so a re-created copy never repeats an old one.
    redis.call('HSET', meta, 'v', ARGV[8], 'owner', owner)
  end
  if mode ~= 'append' and through > cur_through then
    redis.call('HSET', meta, 'through', through)
    if ARGV[3] ~= '' then redis.call('HSET', meta, 'summary', string.sub(ARGV[3], 2)) end
    cur_through = through
  end
  if add_rows then
    for i = 9, #ARGV, 2 do
      local s = tonumber(ARGV[i])
      if s > cur_through and redis.call('ZCOUNT', turns, s, s) == 0 then
        redis.call('ZADD', turns, s, ARGV[i + 1])
      end
    end
  end
  redis.call('ZREMRANGEBYSCORE', turns, '-inf', cur_through)
  redis.call('ZREMRANGEBYRANK', turns, 0, -(cap + 1))
  if last > cur_last then cur_last = last end
  if cur_through > cur_last then cur_last = cur_through end
  redis.call('HSET', meta, 'owner', owner, 'through', cur_through, 'last', cur_last)
end)
redis.call('PEXPIRE', meta, ttl)
redis.call('PEXPIRE', turns, ttl)
if not ok then
  return redis.error_reply(type(err) == 'table' and err.err or tostring(err))
end
-- Wake whoever waits for a turn of this thread (read_wait.py); nothing of the copy is sent.
redis.call('PUBLISH', string.sub(meta, 1, -5) .. 'saved', '1')
return 'ok'
"""

# One round trip for a hit. The owner is checked here, so a stranger's read ships nothing of
# the copy (its size would tell how long the thread is). With the version a process last
# parsed, an unchanged copy answers just 'same', so the caller reuses its parsed context.
# A full reply is one document: the turns (each stored as its JSON) joined into the body of
# a JSON array here, so the client reads four strings, not one per turn, and parses once.
_READ = """
local meta = redis.call('HMGET', KEYS[1], 'v', 'owner', 'summary', 'through')
if not meta[1] then return {} end
if ARGV[3] ~= 'any' and meta[2] ~= ARGV[2] then return {'owner'} end
if ARGV[1] ~= '' and meta[1] == ARGV[1] then return {'same'} end
local body = table.concat(redis.call('ZRANGE', KEYS[2], 0, -1), ',')
return {'full', meta[1], meta[3], meta[4], body}
"""

# Inspection (tests, benchmarks, operators): the meta hash and the turn members as stored.
_INSPECT = """
if redis.call('EXISTS', KEYS[1]) == 0 then return {} end
return {redis.call('HGETALL', KEYS[1]), redis.call('ZRANGE', KEYS[2], 0, -1)}
"""

# Delete a thread's copy and leave the marker that refuses any later write (see above).
# Returns 1 if there was a copy. DEL first: it works even when Redis is out of memory.
_FORGET = """
local had = redis.call('EXISTS', KEYS[1])
redis.call('DEL', KEYS[1], KEYS[2])
redis.call('SET', KEYS[3], '1', 'PX', ARGV[1])
return had
"""


NOT_OWNER = "owner"
# The scripts the memory's steps name (memory_core/io/steps.py `Script`); async clients register
# the same sources.
SCRIPT_SOURCES = {"read": _READ, "write": _WRITE}


class CopyRead(NamedTuple):
    """A copy as the read script answers: `body` (the turns' JSON, comma-joined) is None when
    the copy is still the version the reader knows."""

    version: bytes
    summary: bytes | None = None
    through: bytes | None = None
    body: bytes | None = None


ReadReply = CopyRead | str | None


class WorkingCopy:
    """Reads and writes one Redis working copy per thread."""

    def __init__(self, client: SyncRedis, *, key_prefix: str, ttl_ms: int, cap: int) -> None:
        self.client = client
        self.key_prefix = key_prefix
        self.ttl_ms = ttl_ms
        self.cap = cap
        self._write = client.register_script(_WRITE)
        self._read = client.register_script(_READ)
        self._inspect = client.register_script(_INSPECT)
        self.scripts = {"read": self._read, "write": self._write}

    def saved_channel(self, thread_id: UUID | str) -> str:
        """The pub/sub channel every write to this thread's copy publishes on."""
        return f"{self.key_prefix}:{{{thread_id}}}:saved"

    def keys(self, thread_id: UUID | str) -> tuple[str, str]:
        tag = f"{self.key_prefix}:{{{thread_id}}}"
        return f"{tag}:meta", f"{tag}:turns"

    def write_keys(self, thread_id: UUID | str) -> tuple[str, str, str]:
        """KEYS of the write script: the copy's two keys and the deleted-thread marker."""
        return (*self.keys(thread_id), f"{self.key_prefix}:{{{thread_id}}}:gone")

    def forget(self, thread_ids: Sequence[UUID]) -> int:
        """Delete the copies of deleted threads and refuse later writes to them, in one round
        trip (raises Redis errors). Returns how many copies there were."""
        pipe = self.client.pipeline(transaction=False)
        for tid in thread_ids:
            # EVAL with the (short) source, not EVALSHA: a Redis Cluster pipeline splits the
            # batch by node and cannot load a script on a node that lacks it (and its
            # `eval` method refuses; the command itself is routed by its keys' slot).
            pipe.execute_command("EVAL", _FORGET, 3, *self.write_keys(tid), self.ttl_ms)
        return sum(int(had) for had in pipe.execute())

    def unforget(self, thread_ids: Sequence[UUID]) -> None:
        """Lift the markers `forget` left (its delete did not commit); raises Redis errors."""
        pipe = self.client.pipeline(transaction=False)
        for tid in thread_ids:  # one key per command: they live in different cluster slots
            pipe.delete(self.write_keys(tid)[2])
        pipe.execute()

    def append(self, thread_id: UUID, owner_id: str, through: int, turn: Exchange) -> str:
        """Add one just-committed turn; `through` is the summary cursor Postgres returned."""
        return self._run(thread_id, self.append_args(owner_id, through, turn))

    def merge(self, owner_id: str, ctx: ConversationContext, last_seq: int) -> str:
        """Union a complete snapshot (Postgres as of some commit) into the copy."""
        return self._run(ctx.thread_id, self.merge_args(owner_id, ctx, last_seq))

    # The same writes and reads as steps (memory_core/io/steps.py), for the logic that runs on
    # both drivers; `status` / `parse_read` decode the replies.

    def append_step(self, thread_id: UUID, owner_id: str, through: int, turn: Exchange) -> Script:
        return Script(
            "write", self.write_keys(thread_id), self.append_args(owner_id, through, turn)
        )

    def merge_step(self, owner_id: str, ctx: ConversationContext, last_seq: int) -> Script:
        return Script(
            "write", self.write_keys(ctx.thread_id), self.merge_args(owner_id, ctx, last_seq)
        )

    def read_step(self, thread_id: UUID, owner_id: str, known_version: bytes | None) -> Script:
        return Script("read", self.keys(thread_id), [known_version or "", owner_id, "owner"])

    def delete_step(self, thread_id: UUID) -> Delete:
        return Delete(self.keys(thread_id))

    def delete_step_many(self, thread_ids: Sequence[UUID]) -> Delete:
        return Delete([key for tid in thread_ids for key in self.keys(tid)])

    @staticmethod
    def status(reply: object) -> str:
        return reply.decode() if isinstance(reply, bytes) else str(reply)

    def append_args(self, owner_id: str, through: int, turn: Exchange) -> list[str | int]:
        """ARGV of the write script for an append (public for the benchmark's raw side)."""
        head: list[str | int] = ["append", owner_id, "", through, turn.seq, self.ttl_ms, self.cap]
        return [*head, 0, turn.seq, turn.model_dump_json()]

    def refresh(self, owner_id: str, thread_id: UUID, summary: str, through: int) -> str:
        """Carry a fold's summary into the copy if there is one (`missing` otherwise)."""
        ctx = ConversationContext(thread_id=thread_id, summary=summary, summary_through_seq=through)
        return self._run(thread_id, self.merge_args(owner_id, ctx, through, mode="refresh"))

    def merge_args(
        self, owner_id: str, ctx: ConversationContext, last_seq: int, mode: str = "merge"
    ) -> list[str | int]:
        summary = "" if ctx.summary is None else "s" + ctx.summary
        args: list[str | int] = [mode, owner_id, summary, ctx.summary_through_seq, last_seq]
        args += [self.ttl_ms, self.cap, secrets.randbits(48)]
        for turn in ctx.recent:
            args += [turn.seq, turn.model_dump_json()]
        return args

    def _run(self, thread_id: UUID, args: Sequence[str | int]) -> str:
        return self.status(self._write(keys=self.write_keys(thread_id), args=list(args)))

    def read(self, thread_id: UUID) -> tuple[dict[bytes, bytes], list[bytes]]:
        """Inspection (tests, benchmarks, operators): meta hash and turn members whoever owns
        them, atomically, in one round trip ({} when absent). Readers use `read_if_changed`."""
        reply = self._inspect(keys=self.keys(thread_id))
        if not reply:
            return {}, []
        flat = reply[0]
        return dict(zip(flat[::2], flat[1::2], strict=True)), reply[1] or []

    def read_if_changed(
        self, thread_id: UUID, owner_id: str, known_version: bytes | None
    ) -> ReadReply:
        """The copy (`CopyRead`; its body None when the copy is still `known_version`).

        Returns None when there is no copy and `NOT_OWNER` when it belongs to someone else
        (nothing of it leaves Redis then). One EVALSHA either way.
        """
        args = [known_version or "", owner_id, "owner"]
        return self.parse_read(self._read(keys=self.keys(thread_id), args=args), known_version)

    @staticmethod
    def parse_read(reply: list[Any], known_version: bytes | None) -> ReadReply:
        """The read script's reply as `read_if_changed` returns it."""
        if not reply:
            return None
        if reply[0] == b"owner":
            return NOT_OWNER
        if reply[0] == b"same":
            return CopyRead(known_version or b"")
        return CopyRead(reply[1], reply[2], reply[3], reply[4] or b"")

    def delete(self, thread_id: UUID) -> None:
        self.client.delete(*self.keys(thread_id))


_RECENT = msgspec.json.Decoder(list[Exchange])


def context_from_copy(thread_id: UUID, found: CopyRead) -> ConversationContext:
    """The context from the copy: its turns decoded from their JSON straight into typed
    records in one pass that checks every field (msgspec, in C), the summary as stored."""
    if found.through is None:
        raise ValueError("working copy without a summary cursor")
    return ConversationContext(
        thread_id=thread_id,
        summary=found.summary.decode() if found.summary is not None else None,
        summary_through_seq=int(found.through),
        recent=_RECENT.decode(b"".join((b"[", found.body or b"", b"]"))),
    )
