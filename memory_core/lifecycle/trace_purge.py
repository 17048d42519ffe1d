"""Deleting a thread's Langfuse traces: folds are traced with the thread id as session id.

`purge_session_traces(["<thread id>", ...])` lists every trace of those sessions through the
SDK's read model (`GET /api/public/v2/observations?sessionId=...`, cursor-paginated: the SDK
5 has no trace listing; observations carry their trace id), deletes them
(`DELETE /api/public/traces`, at most 100 ids a call) and lists again to report what is left.

It never raises and never retries on its own: every request is bounded by
`LANGFUSE_API_TIMEOUT_S` (no SDK retries), the first failure ends the purge and is reported
as `error` (class and HTTP status or first line, never a response body). A purge that is not
`done` can simply be run again: deleting is idempotent. Langfuse deletes asynchronously and
lists new traces with some lag, so `remaining` may be above 0 right after a successful delete,
and a fold traced moments before may not be listed yet; callers retry until `done`.

Safety: an observation listed for a session with another session id (a server that ignored
the filter) aborts the purge before anything is deleted; empty session ids are skipped (an
empty filter could mean "every trace").
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import httpx

from memory_core.fold.prompts import make_langfuse_client
from memory_core.logs import describe_error, get_logger
from memory_core.settings import Settings, SettingsError, get_settings
from memory_core.write.artifacts import one_line

if TYPE_CHECKING:  # the SDK is imported only where a configured Langfuse is called (~0.5 s)
    from langfuse import Langfuse
    from langfuse.api.core import RequestOptions

log = get_logger(__name__)

DELETE_BATCH = 100  # trace ids per DELETE /api/public/traces
PAGE_LIMIT = 1000  # observations per page (the API's maximum)
MAX_PAGES = 1000  # per session and listing: a server handing out cursors forever stops here
_ERROR_CHARS = 160


@dataclass(frozen=True)
class TracePurge:
    """What a purge did. `done` says whether the sessions' traces are gone."""

    configured: bool  # False: Langfuse not configured, nothing to do
    deleted: int = 0  # traces deleted
    remaining: int = 0  # traces still listed for those sessions after deleting (0 when done)
    error: str | None = None  # error class + status or first line, never content; None on success

    @property
    def done(self) -> bool:
        return not self.configured or (self.error is None and self.remaining == 0)


class SessionFilterIgnored(Exception):
    """The server listed an observation of another session: its filter cannot be trusted."""


class EndlessPagination(Exception):
    """The server kept handing out cursors (repeated, or beyond MAX_PAGES)."""


def describe_langfuse_error(exc: BaseException) -> str:
    """`UnauthorizedError HTTP 401`, `ReadTimeout: timed out`, `ValidationError at x.py:1 (f)`.

    The SDK's API errors print their headers and body (which may quote trace content): only
    the status is kept. Transport errors keep their first line. Anything else is described by
    class and origin (a parsing error may quote the data it could not parse).
    """
    from langfuse.api.core import ApiError  # only Langfuse calls' errors come here

    if isinstance(exc, ApiError):
        return f"{type(exc).__name__} HTTP {exc.status_code}"
    if isinstance(exc, httpx.TransportError | SessionFilterIgnored | EndlessPagination):
        first = str(exc).strip().splitlines()
        text = f"{type(exc).__name__}: {first[0]}" if first else type(exc).__name__
        return one_line(text, _ERROR_CHARS)
    return one_line(describe_error(exc), _ERROR_CHARS)


def purge_session_traces(
    session_ids: Sequence[str],
    *,
    settings: Settings | None = None,
    client: Langfuse | None = None,
) -> TracePurge:
    """Delete every Langfuse trace whose session id is one of `session_ids` (thread ids).

    With `client` None, a client is built from `settings` (default: `get_settings()`) the way
    the summarizer builds its own; without Langfuse keys the answer is
    `TracePurge(configured=False)` and nothing is sent. Never raises.
    """
    sessions = list(dict.fromkeys(s for s in session_ids if isinstance(s, str) and s.strip()))
    try:
        s = settings or get_settings()
    except SettingsError as exc:
        return _failed(sessions, one_line(f"SettingsError: {exc}", _ERROR_CHARS))
    except Exception as exc:
        return _failed(sessions, describe_langfuse_error(exc))
    own = client is None
    if client is None:
        if not s.langfuse_configured:
            return TracePurge(configured=False)
        client = make_langfuse_client(s)
        if client is None:
            return _failed(sessions, "LangfuseInitError: client could not be built")
    try:
        return _purge(client, sessions, s.langfuse_api_timeout_s)
    finally:
        if own:
            _flush_quietly(client, s.langfuse_api_timeout_s)


def _failed(sessions: list[str], error: str) -> TracePurge:
    log.warning("langfuse.trace_purge_failed", sessions=sessions, error=error)
    return TracePurge(configured=True, error=error)


def _purge(client: Langfuse, sessions: list[str], timeout_s: float) -> TracePurge:
    if not sessions:
        return TracePurge(configured=True)
    # One attempt per request, bounded: the SDK would otherwise retry 5xx/429 with backoff.
    seconds: Any = timeout_s  # annotated int; httpx takes float seconds
    from langfuse.api.core import RequestOptions

    options = RequestOptions(timeout_in_seconds=seconds, max_retries=0)
    found: dict[str, None] = {}
    deleted = 0
    step = "list"
    try:
        for session_id in sessions:
            found.update(dict.fromkeys(_trace_ids(client, session_id, options)))
        step = "delete"
        ids = list(found)
        for start in range(0, len(ids), DELETE_BATCH):
            chunk = ids[start : start + DELETE_BATCH]
            client.api.trace.delete_multiple(trace_ids=chunk, request_options=options)
            deleted += len(chunk)
        remaining = 0
        if found:
            step = "relist"
            left: dict[str, None] = {}
            for session_id in sessions:
                left.update(dict.fromkeys(_trace_ids(client, session_id, options)))
            remaining = len(left)
    except Exception as exc:
        error = describe_langfuse_error(exc)
        log.warning(
            "langfuse.trace_purge_failed",
            sessions=sessions,
            step=step,
            deleted=deleted,
            error=error,
        )
        # Known not deleted (a lower bound when the listing itself failed).
        return TracePurge(
            configured=True, deleted=deleted, remaining=len(found) - deleted, error=error
        )
    log.info("langfuse.traces_purged", sessions=sessions, deleted=deleted, remaining=remaining)
    return TracePurge(configured=True, deleted=deleted, remaining=remaining)


def _trace_ids(client: Langfuse, session_id: str, options: RequestOptions) -> Iterable[str]:
    """Distinct trace ids of the session's observations, in listing order."""
    ids: dict[str, None] = {}
    seen_cursors: set[str] = set()
    pages = client.iter_observation_pages(
        session_id=session_id, fields="core,basic", limit=PAGE_LIMIT, request_options=options
    )
    for n, page in enumerate(pages, start=1):
        for obs in page.data:
            if obs.session_id != session_id:
                raise SessionFilterIgnored("observation of another session listed")
            if obs.trace_id:
                ids[obs.trace_id] = None
        cursor = page.meta.cursor
        if cursor and (cursor in seen_cursors or n >= MAX_PAGES):
            raise EndlessPagination(f"still paginating after {n} pages")
        if cursor:
            seen_cursors.add(cursor)
    return ids


def _flush_quietly(client: Langfuse, timeout_s: float) -> None:
    """Flush a client we built, waiting at most timeout_s; never raises.

    Not `shutdown()`: the SDK shares one resource manager per public key across the process,
    so shutting ours down would stop the background workers of a summarizer using that key.
    """

    def flush() -> None:
        try:
            client.flush()
        except Exception as exc:
            log.warning("langfuse.flush_failed", error=describe_langfuse_error(exc))

    worker = threading.Thread(target=flush, name="langfuse-purge-flush", daemon=True)
    worker.start()
    worker.join(timeout_s)
