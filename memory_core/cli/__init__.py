"""`agent-memory`: migrate, run workers and Flower, inspect threads, context and events, bench,
and the thread lifecycle (archive, delete, forget an owner, retention).

One module per group of commands: service.py (migrate, worker, flower), inspect.py (context,
threads, events), lifecycle.py (threads list/archive/unarchive/delete, forget, retention),
bench.py, demo.py (the README's scripted conversation); errors.py turns infrastructure errors
into one line.
"""

from __future__ import annotations

import os
import sys

import typer

from memory_core.cli.bench import bench_app
from memory_core.cli.eval import eval_app
from memory_core.cli.inspect import context, events_app
from memory_core.cli.lifecycle import forget, retention_app, threads_app
from memory_core.cli.service import flower, migrate, worker
from memory_core.settings import get_settings

app = typer.Typer(
    help="Agent conversation memory: Postgres canon, Redis working copy, Celery folding.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)
for command in (migrate, worker, flower, context, forget):
    app.command()(command)
app.add_typer(threads_app, name="threads")
app.add_typer(retention_app, name="retention")
app.add_typer(events_app, name="events")
app.add_typer(bench_app, name="bench")
app.add_typer(eval_app, name="eval")


@app.command()
def demo() -> None:
    """Play a scripted analytics conversation through a real worker (see README)."""
    from memory_core.cli.demo import run_demo

    sys.exit(run_demo())


def main() -> None:
    # The library is silent unless its host configures logging; the command line is a host:
    # warnings and errors as JSON lines on stderr (MEMORY_LOG_LEVEL), never on stdout.
    # `worker` and `flower` replace this process and configure their own.
    from memory_core.logs import configure_logging
    from memory_core.settings import SettingsError

    configure_logging(os.environ.get("MEMORY_LOG_LEVEL", "WARNING").upper())
    if "--help" not in sys.argv:
        try:
            get_settings()  # settings that cannot work: one line, before anything is done
        except SettingsError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise SystemExit(1) from None
    app()
