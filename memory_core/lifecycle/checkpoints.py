"""The LangGraph checkpointer: same database, own schema; and forgetting a conversation's runs.

`setup_checkpointer` / `postgres_checkpointer` / `async_postgres_checkpointer` need the
`langgraph` extra; the deletion and counting functions are plain SQLAlchemy on the caller's
connection (memory_core/lifecycle/purge.py runs them in the transaction that deletes the
threads) and need no extra. Re-exported by `memory_core.langgraph`, where the README documents
them.
"""

from __future__ import annotations

import asyncio
import importlib
import re
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import Text, bindparam, text
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Connection
from sqlalchemy.sql.elements import TextClause

from memory_core.logs import get_logger
from memory_core.settings import get_settings

if TYPE_CHECKING:
    from langgraph.checkpoint.postgres import PostgresSaver
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver

log = get_logger(__name__)

INSTALL_HINT = "pip install '.[langgraph]'"
CHECKPOINT_SCHEMA = "langgraph"
CHECKPOINT_TABLES = (
    "checkpoint_migrations",
    "checkpoints",
    "checkpoint_blobs",
    "checkpoint_writes",
)
# pg_advisory_lock key serialising concurrent setups (CREATE ... IF NOT EXISTS can still race).
_SETUP_LOCK = 0x4C47_4350  # "LGCP"
_IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
# Checkpoint metadata keys naming the conversation a run belongs to (set by `run_config`).
META_THREAD_ID = "memory_thread_id"
META_OWNER_ID = "memory_owner_id"
# Expression indexes on checkpoints.metadata for those keys (created by `setup_checkpointer`).
_METADATA_INDEXES = {
    "checkpoints_memory_thread_id_idx": META_THREAD_ID,
    "checkpoints_memory_owner_id_idx": META_OWNER_ID,
}
_POOL_NAME = "agent-memory-checkpointer"
_POOL_OPEN_TIMEOUT_S = 10.0


# -- the checkpointer: same database, own schema ---------------------------------------------


def langgraph_available() -> bool:
    """True when the `langgraph` extra (langgraph-checkpoint-postgres, psycopg 3) is installed."""
    try:
        for name in ("psycopg", "psycopg_pool", "langgraph.checkpoint.postgres"):
            importlib.import_module(name)
    except ImportError:
        return False
    return True


def _require_langgraph() -> None:
    if not langgraph_available():
        raise ImportError(f"the LangGraph checkpointer needs the langgraph extra: {INSTALL_HINT}")


def checkpointer_conninfo(database_url: str | None = None, schema: str = CHECKPOINT_SCHEMA) -> str:
    """A psycopg 3 conninfo for DATABASE_URL whose search_path is the checkpointer's schema.

    DATABASE_URL is SQLAlchemy-style (`postgresql+psycopg2://...`); libpq wants `postgresql://`.
    """
    _require_langgraph()
    from psycopg.conninfo import make_conninfo
    from sqlalchemy.engine import make_url

    if not _IDENTIFIER.match(schema):
        raise ValueError(f"schema must be a plain lower-case identifier, not {schema!r}")
    url = make_url(database_url or get_settings().database_url)
    if url.get_backend_name() != "postgresql":
        raise ValueError(f"the checkpointer needs a PostgreSQL URL, not {url.drivername}")
    libpq = url.set(drivername="postgresql").render_as_string(hide_password=False)
    return make_conninfo(
        libpq,
        options=f"-c search_path={schema}",
        application_name="agent-memory-checkpointer",
        connect_timeout=5,
    )


def setup_checkpointer(database_url: str | None = None, schema: str = CHECKPOINT_SCHEMA) -> None:
    """Create the schema and let PostgresSaver create or migrate its tables (idempotent)."""
    _require_langgraph()
    import psycopg
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg import sql
    from psycopg.rows import dict_row

    conninfo = checkpointer_conninfo(database_url, schema)
    # autocommit: PostgresSaver's migrations include CREATE INDEX CONCURRENTLY.
    with psycopg.connect(
        conninfo, autocommit=True, prepare_threshold=0, row_factory=dict_row
    ) as conn:
        # Try, never wait inside Postgres: a session blocked in pg_advisory_lock holds a
        # snapshot, which the holder's CREATE INDEX CONCURRENTLY waits for (a deadlock).
        try_lock = "SELECT pg_try_advisory_lock(%s) AS ok"
        while not cast(dict[str, bool], conn.execute(try_lock, (_SETUP_LOCK,)).fetchone())["ok"]:
            time.sleep(0.2)
        try:
            conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)))
            PostgresSaver(conn).setup()
            _create_metadata_indexes(conn, schema)
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_SETUP_LOCK,))


def _create_metadata_indexes(conn: Any, schema: str) -> None:
    """Expression indexes on the conversation keys of checkpoints.metadata (idempotent).

    CONCURRENTLY, like PostgresSaver's own indexes: running agents keep writing checkpoints
    while it builds. A build that failed leaves an invalid index, which IF NOT EXISTS would
    keep forever: drop it and build again.
    """
    from psycopg import sql

    for name, key in _METADATA_INDEXES.items():
        found = conn.execute(
            "SELECT i.indisvalid FROM pg_index i"
            " JOIN pg_class c ON c.oid = i.indexrelid"
            " JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = %s AND c.relname = %s",
            (schema, name),
        ).fetchone()
        if found is not None and not found["indisvalid"]:
            conn.execute(
                sql.SQL("DROP INDEX CONCURRENTLY IF EXISTS {}.{}").format(
                    sql.Identifier(schema), sql.Identifier(name)
                )
            )
        conn.execute(
            sql.SQL(
                "CREATE INDEX CONCURRENTLY IF NOT EXISTS {} ON {}.checkpoints ((metadata ->> {}))"
            ).format(sql.Identifier(name), sql.Identifier(schema), sql.Literal(key))
        )


def _connection_kwargs() -> dict[str, Any]:
    """What both savers need of a pooled connection (LangGraph's own `from_conn_string`)."""
    from psycopg.rows import dict_row

    return {"autocommit": True, "prepare_threshold": 0, "row_factory": dict_row}


@contextmanager
def postgres_checkpointer(
    database_url: str | None = None,
    *,
    schema: str = CHECKPOINT_SCHEMA,
    max_size: int = 4,
    setup: bool = False,
) -> Iterator[PostgresSaver]:
    """A PostgresSaver on a psycopg 3 pool over DATABASE_URL, in the checkpointer's schema.

    The tables must exist (`agent-memory migrate`, or `setup=True`). The pool is closed on exit.
    """
    _require_langgraph()
    from langgraph.checkpoint.postgres import PostgresSaver
    from psycopg import Connection as PgConnection
    from psycopg.rows import DictRow
    from psycopg_pool import ConnectionPool

    if setup:
        setup_checkpointer(database_url, schema)
    pool = ConnectionPool(
        checkpointer_conninfo(database_url, schema),
        min_size=1,
        max_size=max_size,
        kwargs=_connection_kwargs(),
        open=False,
        name=_POOL_NAME,
    )
    pool.open(wait=True, timeout=_POOL_OPEN_TIMEOUT_S)
    try:
        yield PostgresSaver(cast("ConnectionPool[PgConnection[DictRow]]", pool))
    finally:
        pool.close()


@asynccontextmanager
async def async_postgres_checkpointer(
    database_url: str | None = None,
    *,
    schema: str = CHECKPOINT_SCHEMA,
    max_size: int = 4,
    setup: bool = False,
) -> AsyncIterator[AsyncPostgresSaver]:
    """`postgres_checkpointer` for `ainvoke`/`astream`: an AsyncPostgresSaver, same schema.

    The same tables, set up the same way (`agent-memory migrate`, or `setup=True`: the sync
    `setup_checkpointer`, in a thread), never by the saver's own `setup()`. The pool belongs to
    the running event loop: open and use it in one loop; closed on exit.
    """
    _require_langgraph()
    from langgraph.checkpoint.postgres.aio import AsyncPostgresSaver
    from psycopg import AsyncConnection
    from psycopg.rows import DictRow
    from psycopg_pool import AsyncConnectionPool

    if setup:
        await asyncio.to_thread(setup_checkpointer, database_url, schema)
    pool = AsyncConnectionPool(
        checkpointer_conninfo(database_url, schema),
        min_size=1,
        max_size=max_size,
        kwargs=_connection_kwargs(),
        open=False,
        name=_POOL_NAME,
    )
    await pool.open(wait=True, timeout=_POOL_OPEN_TIMEOUT_S)
    try:
        yield AsyncPostgresSaver(cast("AsyncConnectionPool[AsyncConnection[DictRow]]", pool))
    finally:
        await pool.close()


def forget_run(checkpointer: Any, session_id: str | uuid.UUID) -> None:
    """Delete a finished run's checkpoints (the turn itself is in conversation memory)."""
    checkpointer.delete_thread(str(session_id))


async def aforget_run(checkpointer: Any, session_id: str | uuid.UUID) -> None:
    """`forget_run` for an AsyncPostgresSaver (its sync calls refuse its own event loop)."""
    await checkpointer.adelete_thread(str(session_id))


# -- forgetting a conversation's runs: plain SQLAlchemy, no extra needed ---------------------

# The checkpointer's data tables, in deletion order (checkpoints last).
_DATA_TABLES = ("checkpoint_writes", "checkpoint_blobs", "checkpoints")
_RUNS = bindparam("runs", type_=ARRAY(Text))


def _existing_tables(conn: Connection, schema: str) -> dict[str, str]:
    """{table: quoted schema.table} for the checkpointer's data tables that exist in `schema`."""
    if not _IDENTIFIER.match(schema):
        raise ValueError(f"schema must be a plain lower-case identifier, not {schema!r}")
    quote = conn.dialect.identifier_preparer.quote_identifier
    names = {t: f"{quote(schema)}.{quote(t)}" for t in _DATA_TABLES}
    existing = conn.execute(
        text("SELECT n FROM unnest(:names) AS n WHERE to_regclass(n) IS NOT NULL").bindparams(
            bindparam("names", type_=ARRAY(Text))
        ),
        {"names": list(names.values())},
    ).scalars()
    found = set(existing)
    return {t: name for t, name in names.items() if name in found}


def _runs_query(
    select: str,
    checkpoints: str,
    thread_ids: Sequence[uuid.UUID | str] | None,
    owner_id: str | None,
    tail: str = "",
) -> tuple[TextClause, dict[str, Any]]:
    """`SELECT <select> FROM checkpoints WHERE` the conversation keys of its metadata match.

    The WHERE expressions are the indexed ones (`setup_checkpointer`); both filters: AND.
    """
    clauses: list[str] = []
    params: dict[str, Any] = {}
    if thread_ids is not None:
        clauses.append(f"metadata ->> '{META_THREAD_ID}' = ANY(:thread_ids)")
        params["thread_ids"] = sorted({str(uuid.UUID(str(t))) for t in thread_ids})
    if owner_id is not None:
        clauses.append(f"metadata ->> '{META_OWNER_ID}' = :owner_id")
        params["owner_id"] = str(owner_id)
    if not clauses:
        raise ValueError("give thread_ids, owner_id or both")
    # Identifiers validated and quoted (`_existing_tables`), keys constant, values bound.
    where = " AND ".join(clauses)
    stmt = text(f"SELECT {select} FROM {checkpoints} WHERE {where}{tail}")  # noqa: S608
    if thread_ids is not None:
        stmt = stmt.bindparams(bindparam("thread_ids", type_=ARRAY(Text)))
    return stmt, params


def _find_runs(
    conn: Connection,
    checkpoints: str,
    thread_ids: Sequence[uuid.UUID | str] | None,
    owner_id: str | None,
    limit: int | None = None,
) -> list[str]:
    """Checkpointer thread ids (runs) any of whose checkpoints carries the conversation."""
    tail = "" if limit is None else " LIMIT :limit"
    stmt, params = _runs_query("DISTINCT thread_id", checkpoints, thread_ids, owner_id, tail)
    if limit is not None:
        params["limit"] = limit
    return [row[0] for row in conn.execute(stmt, params)]


def _delete_runs(conn: Connection, tables: Mapping[str, str], runs: Sequence[str]) -> None:
    for table in _DATA_TABLES:
        if table in tables:
            # A validated, quoted identifier (`_existing_tables`); the runs are bound.
            stmt = text(f"DELETE FROM {tables[table]} WHERE thread_id = ANY(:runs)")  # noqa: S608
            conn.execute(stmt.bindparams(_RUNS), {"runs": list(runs)})


def delete_thread_checkpoints(
    conn: Connection,
    thread_ids: Sequence[uuid.UUID | str],
    *,
    schema: str = CHECKPOINT_SCHEMA,
) -> int:
    """Delete the checkpoints of every run of these conversation threads; returns the runs.

    A run belongs to a thread when any of its checkpoints carries `memory_thread_id`
    (`run_config(..., thread_id=...)`): finished and paused runs alike, every checkpoint_ns,
    from checkpoint_writes, checkpoint_blobs and checkpoints. Runs on `conn` in the caller's
    transaction (never commits), so it can go with the thread's own rows. 0 when the
    checkpointer was never set up in `schema`. Needs no LangGraph.
    """
    tables = _existing_tables(conn, schema)
    if "checkpoints" not in tables or not thread_ids:
        return 0
    runs = _find_runs(conn, tables["checkpoints"], thread_ids, None)
    if runs:
        _delete_runs(conn, tables, runs)
    log.info("memory.checkpoints_deleted", scope="threads", threads=len(thread_ids), runs=len(runs))
    return len(runs)


def delete_owner_checkpoints(
    conn: Connection,
    owner_id: str,
    *,
    schema: str = CHECKPOINT_SCHEMA,
    limit: int | None = None,
) -> int:
    """Delete the checkpoints of the owner's runs (`memory_owner_id`); returns the runs.

    At most `limit` runs per call (call again until it returns 0); otherwise as
    `delete_thread_checkpoints`: the caller's transaction, 0 without the checkpointer tables.
    """
    if limit is not None and limit < 1:
        raise ValueError("limit must be at least 1")
    tables = _existing_tables(conn, schema)
    if "checkpoints" not in tables:
        return 0
    runs = _find_runs(conn, tables["checkpoints"], None, owner_id, limit)
    if runs:
        _delete_runs(conn, tables, runs)
    log.info("memory.checkpoints_deleted", scope="owner", runs=len(runs))
    return len(runs)


def checkpoint_runs(
    conn: Connection,
    *,
    thread_ids: Sequence[uuid.UUID | str] | None = None,
    owner_id: str | None = None,
    schema: str = CHECKPOINT_SCHEMA,
) -> int:
    """How many runs still have checkpoints of these threads and/or this owner (both: AND)."""
    if thread_ids is None and owner_id is None:
        raise ValueError("give thread_ids, owner_id or both")
    tables = _existing_tables(conn, schema)
    if "checkpoints" not in tables:
        return 0
    stmt, params = _runs_query(
        "count(DISTINCT thread_id)", tables["checkpoints"], thread_ids, owner_id
    )
    return int(conn.execute(stmt, params).scalar_one())
