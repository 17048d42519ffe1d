"""How a command fails: one clear line on stderr and exit 1, never a traceback."""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import Any, NoReturn, TypeVar

import typer

from memory_core.settings import get_settings
from memory_core.write.snapshot import is_blank

F = TypeVar("F", bound=Callable[..., Any])


def fail(message: str) -> NoReturn:
    from memory_core.cli.safe_text import terminal_safe

    typer.echo(f"error: {terminal_safe(message)}", err=True)
    raise typer.Exit(1)


def one_line_errors(fn: F) -> F:
    """Infrastructure errors become one clear line on stderr instead of a traceback."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        import psycopg2
        import redis
        from sqlalchemy.exc import OperationalError

        from memory_core.conversation_memory import ThreadNotFound
        from memory_core.lifecycle.purge import DeleteFailed

        try:
            return fn(*args, **kwargs)
        except (ThreadNotFound, DeleteFailed) as exc:
            fail(str(exc))
        except OperationalError as exc:
            fail(
                f"cannot reach Postgres at {safe_url(get_settings().database_url)}: "
                f"{str(exc.orig).strip().splitlines()[0]}"
            )
        except psycopg2.OperationalError as exc:  # the benches talk to Postgres directly
            fail(
                f"cannot reach Postgres at {safe_url(get_settings().database_url)}: "
                f"{str(exc).strip().splitlines()[0]}"
            )
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            fail(f"cannot reach Redis at {safe_url(get_settings().redis_url)}: {exc}")
        except redis.RedisError as exc:
            fail(f"Redis error: {exc}")

    return wrapper  # type: ignore[return-value]


def stops_what_it_started(fn: F) -> F:
    """A command that starts processes (workers, servers) ends them on SIGTERM, SIGINT and
    SIGHUP alike: the signal unwinds its `finally` blocks (later ones wait for them), and the
    command exits 128 + the signal (memory_core/devservices/signals.py)."""

    @wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from memory_core.devservices.signals import Interrupted, arm, ending_on_signals

        with ending_on_signals():
            try:
                arm()
                return fn(*args, **kwargs)
            except Interrupted as exc:
                typer.echo(f"error: stopped by {exc}", err=True)
                raise typer.Exit(exc.exit_code) from None

    return wrapper  # type: ignore[return-value]


def safe_url(url: str) -> str:
    """`url` with its password hidden; each URL of a failover list (`a;b;c`) on its own."""
    from sqlalchemy.engine import make_url

    if ";" in url:
        return ";".join(safe_url(part) for part in url.split(";"))
    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:
        return url.rsplit("@", maxsplit=1)[-1]


def check_owner(owner: str) -> str:
    """An owner id that can own threads, or one line and exit 1 (the id is not echoed)."""
    try:
        owner.encode("utf-8")
    except UnicodeEncodeError:
        fail("--owner is not valid UTF-8")
    if is_blank(owner) or "\x00" in owner:
        fail("--owner must be a non-empty string")
    return owner
