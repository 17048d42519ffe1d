"""`agent-memory inspect serve`: the memory inspector (memory_core/inspector/) on uvicorn."""

from __future__ import annotations

import ipaddress
import logging
from typing import Annotated

import typer

from memory_core.cli.errors import fail, one_line_errors
from memory_core.settings import get_settings

inspect_app = typer.Typer(
    help="The memory inspector: a read-only web page per thread.", no_args_is_help=True
)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@inspect_app.command("serve")
@one_line_errors
def serve(
    host: Annotated[str, typer.Option(help="Address to bind (loopback by default).")] = (
        "127.0.0.1"
    ),
    port: Annotated[int, typer.Option(min=1, max=65_535)] = 8377,
) -> None:
    """Serve the inspector: threads by owner or id, each thread's memory (basic auth)."""
    auth = get_settings().memory_inspector_auth
    if not auth:
        fail("the inspector needs credentials: set MEMORY_INSPECTOR_AUTH=user:password")
    try:
        import uvicorn  # the optional extra, only for this command

        from memory_core.conversation_memory import RedisConversationMemory
        from memory_core.inspector.app import ACCESS_LOGGER, create_app, parse_auth
    except ImportError:
        fail("the inspector needs its extra: pip install 'agent-memory[inspector]'")
    try:
        parse_auth(auth)
    except ValueError as exc:
        fail(str(exc))
    if not _loopback(host):
        typer.echo(
            f"warning: serving thread content on {host}: reachable beyond this machine "
            "(docs/OPERATIONS.md, 'The memory inspector')",
            err=True,
        )
    # The access lines are the audit trail: on whatever MEMORY_LOG_LEVEL says of the rest.
    logging.getLogger(ACCESS_LOGGER).setLevel(logging.INFO)
    app = create_app(RedisConversationMemory(), auth=auth)
    typer.echo(f"inspector on http://{host}:{port}/", err=True)
    uvicorn.run(
        app,
        host=host,
        port=port,
        access_log=False,  # ours (the thread id and user, never a query string) instead
        log_config=None,  # the CLI's JSON logging (configure_logging) already applies
        server_header=False,
        proxy_headers=False,
    )
