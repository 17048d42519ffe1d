"""The commands that read memory: `context`, `threads` (the listing of `threads` / `threads
list`, memory_core/cli/lifecycle.py), `events tail`."""

from __future__ import annotations

from typing import Annotated

import typer

from memory_core.cli.errors import fail, one_line_errors
from memory_core.cli.safe_text import terminal_safe
from memory_core.settings import get_settings

events_app = typer.Typer(help="Read the memory:events stream.", no_args_is_help=True)


@one_line_errors
def context(
    thread_id: str,
    owner: Annotated[
        str, typer.Option(help="The thread's owner (required: memory is owner-only).")
    ],
    focus: Annotated[str, typer.Option(help="brief | sql | visualizations")] = "brief",
    max_tokens: Annotated[int, typer.Option(min=0, help="The view's token budget.")] = 2000,
    json_output: Annotated[bool, typer.Option("--json", help="Print the raw context.")] = False,
) -> None:
    """Print a thread's memory as the node view FOCUS would see it."""
    from memory_core.conversation_memory import RedisConversationMemory
    from memory_core.copy.views import FOCUSES, render_conversation_context

    if focus not in FOCUSES:
        fail(f"--focus must be one of {', '.join(FOCUSES)}")
    ctx = RedisConversationMemory().get_context(thread_id, owner)
    if json_output:
        typer.echo(terminal_safe(ctx.model_dump_json(indent=2)))
        return
    typer.echo(terminal_safe(render_conversation_context(ctx, focus, max_tokens)), nl=False)


@one_line_errors
def threads(
    owner: Annotated[str, typer.Option(help="Whose history to list.")],
    limit: Annotated[int, typer.Option(min=1, max=10_000)] = 20,
    archived: Annotated[bool, typer.Option(help="Include archived threads.")] = False,
) -> None:
    """List a user's threads, most recently active first (the history UI's list)."""
    from memory_core.cli.errors import check_owner
    from memory_core.lifecycle.threads import list_threads

    rows = list_threads(check_owner(owner), include_archived=archived, limit=limit)
    for t in rows:
        flag = " [archived]" if t.is_archived else ""
        line = (
            f"{t.id}  {t.updated_at:%Y-%m-%d %H:%M}  {t.agent_type:<7}  "
            f"{t.turns:>4} turns  {t.title[:60]}{flag}"
        )
        typer.echo(terminal_safe(line))
    if not rows:
        typer.echo(terminal_safe(f"no threads for {owner}"), err=True)


@events_app.command("tail")
@one_line_errors
def events_tail(  # options only: typer passes them by name
    *,
    group: Annotated[str | None, typer.Option(help="Consumer group (acks what it reads).")] = None,
    consumer: Annotated[str | None, typer.Option(help="Consumer name within the group.")] = None,
    follow: Annotated[bool, typer.Option("--follow/--no-follow", "-f")] = False,
    count: Annotated[int, typer.Option(min=1, max=100_000)] = 20,
    from_start: bool = False,
    routine: Annotated[
        bool, typer.Option(help="The routine stream (memory_summarized) instead.")
    ] = False,
) -> None:
    """Print memory events (memory_summarization_failed, memory_finalize_rejected, ...)."""
    from memory_core.events import format_event, routine_stream, tail_events
    from memory_core.io.redis_client import get_redis

    s = get_settings()
    stream = routine_stream(s.memory_events_stream) if routine else s.memory_events_stream
    for event in tail_events(
        get_redis(s.redis_url),
        stream=stream,
        group=group,
        consumer=consumer,
        follow=follow,
        count=count,
        block_ms=5000,
        from_start=from_start,
    ):
        typer.echo(terminal_safe(format_event(event)))
