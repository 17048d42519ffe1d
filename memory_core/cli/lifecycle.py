"""The lifecycle commands: `threads [list]|archive|unarchive|delete`, `forget`, `retention run`.

Thin shells over memory_core/lifecycle/threads.py. Destructive commands (`threads delete`, `forget`,
`retention run` without `--dry-run`) ask on a terminal; `--yes` skips the question, and without
a terminal and without `--yes` they refuse, having deleted nothing. Results are one line on
stdout; errors one line on stderr (exit 1). Owner ids are never printed on stdout nor logged;
a confirmation question (on the terminal, stderr) names the owner typed.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Annotated

import typer

from memory_core.cli.errors import check_owner, fail, one_line_errors, safe_url
from memory_core.cli.inspect import threads as list_owner_threads
from memory_core.settings import get_settings

if TYPE_CHECKING:
    from collections.abc import Callable

    from memory_core.lifecycle.purge import PurgeReport

threads_app = typer.Typer(
    help="A user's threads: list (the default), archive, unarchive, delete.",
    add_completion=False,
)
retention_app = typer.Typer(
    help="Delete threads with no new turn for MEMORY_RETENTION_DAYS.", no_args_is_help=True
)

Owner = Annotated[str, typer.Option(help="The thread's owner (required: memory is owner-only).")]
Yes = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]


# ----------------------------------------------------------------------------- helpers


def confirm(question: str, yes: bool) -> None:
    """Go on only when confirmed: `--yes`, or "y" on a terminal. Otherwise exit 1."""
    if yes:
        return
    if not sys.stdin.isatty():
        fail("refusing to delete without confirmation: stdin is not a terminal (pass --yes)")
    # Not typer.confirm: it writes part of its prompt to stdout, which holds only the result.
    typer.echo(f"{question} [y/N]: ", nl=False, err=True)
    try:
        answer = sys.stdin.readline()
    except KeyboardInterrupt:
        answer = ""
    if answer.strip().lower() not in ("y", "yes"):
        if not answer.endswith("\n"):
            typer.echo(err=True)  # end of input or Ctrl-C: end the prompt's line
        fail("not confirmed: nothing was deleted")


def plural(n: int, word: str) -> str:
    """`1 copy`, `2 copies`, `3 batches`."""
    if n == 1:
        return f"{n} {word}"
    if word.endswith("y"):
        return f"{n} {word[:-1]}ies"
    return f"{n} {word}es" if word.endswith("ch") else f"{n} {word}s"


def counts(report: PurgeReport, *, threads: bool = True) -> str:
    """`3 threads, 12 turns, 1 copy, 2 checkpoints` (+ traces when Langfuse is configured)."""
    parts = [plural(report.threads, "thread")] if threads else []
    parts += [
        plural(report.turns, "turn"),
        plural(report.copies, "copy"),
        plural(report.checkpoints, "checkpoint"),
    ]
    if get_settings().langfuse_configured:
        parts.append(plural(report.traces, "trace"))
        if report.traces_pending:
            parts.append(f"trace purge pending for {plural(report.traces_pending, 'thread')}")
    return ", ".join(parts)


# ----------------------------------------------------------------------------- threads


@threads_app.callback(invoke_without_command=True)
def threads_default(
    ctx: typer.Context,
    owner: Annotated[str | None, typer.Option(help="Whose history to list.")] = None,
    limit: Annotated[int, typer.Option(min=1, max=10_000)] = 20,
    archived: Annotated[bool, typer.Option(help="Include archived threads.")] = False,
) -> None:
    """List a user's threads (`threads --owner O` = `threads list --owner O`), or manage one."""
    if ctx.invoked_subcommand is not None:
        return
    if owner is None:
        ctx.fail("Missing option '--owner'.")  # as for `threads list`: usage, exit 2
    list_owner_threads(owner=owner, limit=limit, archived=archived)


threads_app.command("list")(list_owner_threads)


@threads_app.command("archive")
@one_line_errors
def threads_archive(thread_id: str, owner: Owner) -> None:
    """Hide a thread from the history list (still readable and continuable)."""
    from memory_core.lifecycle.threads import archive_thread

    archive_thread(thread_id, owner)
    typer.echo(f"archived thread {thread_id}")


@threads_app.command("unarchive")
@one_line_errors
def threads_unarchive(thread_id: str, owner: Owner) -> None:
    """Show an archived thread in the history list again."""
    from memory_core.lifecycle.threads import unarchive_thread

    unarchive_thread(thread_id, owner)
    typer.echo(f"unarchived thread {thread_id}")


@threads_app.command("delete")
@one_line_errors
def threads_delete(thread_id: str, owner: Owner, yes: Yes = False) -> None:
    """Delete a thread for good: turns, summary, working copy, checkpoints (and traces)."""
    from memory_core.lifecycle.threads import delete_thread

    confirm(f"Delete thread {thread_id} for good?", yes)
    report = delete_thread(thread_id, owner)
    typer.echo(f"deleted thread {thread_id}: {counts(report, threads=False)}")


# ----------------------------------------------------------------------------- forget


@one_line_errors
def forget(
    owner: Annotated[str, typer.Option(help="The owner whose every thread is deleted.")],
    yes: Yes = False,
    enqueue: Annotated[
        bool, typer.Option("--enqueue", help="Hand it to a worker (memory.forget_owner).")
    ] = False,
    batch_size: Annotated[
        int | None,
        typer.Option(min=1, max=1000, help="Threads per transaction [MEMORY_PURGE_BATCH_SIZE]."),
    ] = None,
) -> None:
    """Delete every thread (and checkpoint) of an owner for good: the right to be forgotten."""
    check_owner(owner)
    confirm(f"Delete every thread of owner {owner!r} for good?", yes)
    if enqueue:
        typer.echo(_enqueue_forget(owner))
        return
    from memory_core.lifecycle.threads import forget_owner

    with _progress() as progress:
        report = forget_owner(owner, batch_size=batch_size, progress=progress)
    typer.echo(
        f"forgot owner: {counts(report)} in {plural(report.batches, 'batch')}; "
        f"remaining: {plural(report.remaining_threads, 'thread')}, "
        f"{plural(report.remaining_checkpoints, 'checkpoint')}"
    )
    if report.remaining_threads or report.remaining_checkpoints:
        fail("the owner got new threads or checkpoints during the run: run forget again")


def _enqueue_forget(owner: str) -> str:
    """Publish `memory.forget_owner` once the broker accepted it; its task id."""
    from memory_core.fold.publisher import send_by_name
    from memory_core.io.queues import FOLD_QUEUE, FORGET_OWNER_TASK

    url = get_settings().celery_broker_url
    try:
        return send_by_name(FORGET_OWNER_TASK, [owner], FOLD_QUEUE, url)
    except Exception as exc:  # any broker/transport error: nothing was enqueued
        detail = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        fail(f"cannot reach the broker at {safe_url(url)}: {detail}")


@contextmanager
def _progress() -> Iterator[Callable[[PurgeReport, int], None] | None]:
    """A progress bar on stderr while forget runs, when stderr is a terminal (else None)."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    bar = Progress(
        TextColumn("forgetting"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("threads"),
        console=Console(stderr=True),
        transient=True,
    )
    task = bar.add_task("forget", total=None)

    def update(report: PurgeReport, total: int) -> None:
        bar.update(task, completed=report.threads, total=max(total, report.threads))

    with bar:
        yield update


# ----------------------------------------------------------------------------- retention


@retention_app.command("run")
@one_line_errors
def retention_run(
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Only count what would be deleted.")
    ] = False,
    yes: Yes = False,
) -> None:
    """Delete the threads with no new turn for MEMORY_RETENTION_DAYS now (archived or not).

    Then, with Langfuse configured, retry the pending trace purges of deleted threads.
    """
    from memory_core.lifecycle.threads import apply_retention

    s = get_settings()
    days = s.memory_retention_days
    if days is None:
        typer.echo("retention is off (MEMORY_RETENTION_DAYS unset)")
    else:
        if not dry_run:
            confirm(f"Delete every thread with no new turn for {days:g} days for good?", yes)
        result = apply_retention(dry_run=dry_run)
        cutoff = result.cutoff.isoformat(timespec="seconds") if result.cutoff else "-"
        d = result.deleted
        if dry_run:
            typer.echo(
                f"retention dry run: cutoff {cutoff} ({days:g} days); would delete "
                f"{plural(d.threads, 'thread')}, {plural(d.turns, 'turn')}"
            )
            return
        typer.echo(
            f"retention: cutoff {cutoff} ({days:g} days); deleted {counts(d)} "
            f"in {plural(d.batches, 'batch')}"
        )
    if not dry_run and s.langfuse_configured:
        _sweep_traces()


def _sweep_traces() -> None:
    from memory_core.lifecycle.trace_sweep import sweep_trace_purges

    sweep = sweep_trace_purges()
    typer.echo(
        f"trace purges: {plural(sweep.checked, 'thread')} checked, "
        f"{plural(sweep.deleted, 'trace')} deleted, {sweep.done} done, {sweep.pending} pending"
    )
    if sweep.error is not None:
        detail = (sweep.error.strip().splitlines() or ["error"])[0]
        fail(f"Langfuse trace purge failed ({detail}); the requests are kept for the next run")
