"""`Write` steps on the blocking driver: one prebuilt statement on a pooled DBAPI connection.

The finalize's single statement (claim.finalize_statement) is the hot path of every turn, and
SQLAlchemy's `Connection.execute` around it cost more CPU than the statement's round trip
(docs/BENCHMARKS.md, "Where the time goes"). Here it is rendered once per statement (SQL text,
literal parameters, bind processors: the dialect's own), and each call only binds, executes
in autocommit on a connection of the same pool, and reads the rows. Errors are SQLAlchemy's
(`DBAPIError` subclasses, parameters hidden), and a lost connection invalidates the pool as
SQLAlchemy would, so `retry_on_disconnect` behaves the same.
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Callable, Mapping, Sequence
from contextlib import suppress
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.engine import Dialect
from sqlalchemy.exc import DBAPIError


@dataclass(frozen=True, slots=True)
class Rendered:
    sql: str
    defaults: Mapping[str, Any]
    processors: Mapping[str, Callable[[Any], Any]]

    def bind(self, params: Mapping[str, Any] | None) -> dict[str, Any]:
        bound = dict(self.defaults)
        for name, value in (params or {}).items():
            process = self.processors.get(name)
            bound[name] = process(value) if process is not None and value is not None else value
        return bound


@lru_cache(maxsize=32)  # prebuilt statements only: a handful per process
def render(stmt: Any, dialect: Dialect) -> Rendered:
    compiled = stmt.compile(dialect=dialect)
    processors = {}
    for name, bind in compiled.binds.items():
        process = bind.type.dialect_impl(dialect).bind_processor(dialect)
        if process is not None:
            processors[name] = process
    literals = {n: b.effective_value for n, b in compiled.binds.items() if not b.required}
    defaults = {n: processors[n](v) if n in processors else v for n, v in literals.items()}
    return Rendered(compiled.string, defaults, processors)


@lru_cache(maxsize=32)
def _row_type(names: tuple[str, ...]) -> Any:
    return namedtuple("Row", names)  # attribute access, as SQLAlchemy's rows


def execute_autocommit(engine: Engine, stmt: Any, params: Mapping[str, Any] | None) -> list[Any]:
    """Run `stmt` as one autocommitted statement; its rows (attribute access by column)."""
    dialect = engine.dialect
    rendered = render(stmt, dialect)
    bound = rendered.bind(params)
    try:
        fairy = engine.raw_connection()
    except dialect.loaded_dbapi.Error as exc:  # Postgres unreachable: as SQLAlchemy reports it
        raise _wrapped(rendered, exc, dialect, lost=False) from exc
    dbapi: Any = fairy.dbapi_connection  # psycopg2's connection (autocommit: client side)
    try:
        dbapi.autocommit = True
        cur = dbapi.cursor()
        try:
            cur.execute(rendered.sql, bound)
            rows: Sequence[Any] = cur.fetchall() if cur.description else []
            names = tuple(d[0] for d in cur.description or ())
        finally:
            cur.close()
    except dialect.loaded_dbapi.Error as exc:
        lost = dialect.is_disconnect(exc, dbapi, None)
        if lost:
            engine.pool._invalidate(fairy, exc)  # as SQLAlchemy does: the whole pool is stale
        raise _wrapped(rendered, exc, dialect, lost=lost) from exc
    finally:
        with suppress(Exception):  # a lost connection cannot be switched back: it is discarded
            dbapi.autocommit = False
        fairy.close()
    row = _row_type(names)
    return [row(*r) for r in rows]


def _wrapped(rendered: Rendered, exc: Exception, dialect: Dialect, *, lost: bool) -> Exception:
    return DBAPIError.instance(
        rendered.sql,
        None,
        exc,
        dialect.loaded_dbapi.Error,
        hide_parameters=True,
        connection_invalidated=lost,
        dialect=dialect,
    )
