"""`agent-memory`: migrate, run workers and Flower, inspect threads, context and events, bench,
and the thread lifecycle (archive, delete, forget an owner, retention).

One module per group of commands: service.py (migrate, worker, flower), inspect.py (context,
threads, events), inspector.py (`inspect serve`, the web inspector), lifecycle.py (threads
list/archive/unarchive/delete, forget, retention), bench.py, demo.py (the README's scripted
conversation); errors.py turns infrastructure errors into one line.
"""

from __future__ import annotations

import os
import sys

import typer

from memory_core.cli.bench import bench_app
from memory_core.cli.eval import eval_app
from memory_core.cli.inspect import context, events_app
from memory_core.cli.inspector import inspect_app
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
app.add_typer(inspect_app, name="inspect")


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

    debug = "--debug" in sys.argv[1:]
    if debug:
        sys.argv.remove("--debug")
    configure_logging(os.environ.get("MEMORY_LOG_LEVEL", "WARNING").upper())
    if "--help" not in sys.argv:
        try:
            get_settings()  # settings that cannot work: one line, before anything is done
        except SettingsError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise SystemExit(1) from None
    sys.exit(run(debug=debug))


def run(args: list[str] | None = None, *, debug: bool = False) -> int:
    """Run the command line; its exit status. A usage error is one line on stderr and 2, as
    click's own; any other failure one line and 1. A traceback only with `--debug`."""
    try:
        status = app(args, standalone_mode=False)
    except typer.Abort:
        typer.echo("error: aborted", err=True)
        return 1
    except typer.TyperException as exc:  # click's errors (typer vendors click)
        code = int(getattr(exc, "exit_code", 1))
        if type(exc).__name__ != "NoArgsIsHelpError":  # that one has printed the help
            message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
            typer.echo(f"error: {one_line(message)}", err=True)
        return code
    except Exception as exc:
        if debug:
            raise
        # Its message may hold stored content (a query in a SQL error): the class only.
        typer.echo(f"error: unexpected {type(exc).__name__} (--debug shows where)", err=True)
        return 1
    return status if isinstance(status, int) else 0


def one_line(message: str) -> str:
    """A message on one line, safe for a terminal (it may quote what was typed)."""
    from memory_core.cli.safe_text import terminal_safe

    return terminal_safe(" ".join(message.split()))
