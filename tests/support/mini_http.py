"""A minimal asyncio HTTP/1.1 server and client: a FastAPI-shaped service without FastAPI.

`MiniApp(routes, lifespan)` mirrors what a FastAPI service does with the memory: `lifespan(app)`
is an async context manager entered at startup and left at shutdown (`app.state` holds what
it creates), and each request runs its route coroutine on the server's event loop. One request
per connection (`Connection: close`), JSON bodies; enough for the tests, not a web framework.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from types import SimpleNamespace, TracebackType
from typing import Any, Self

Route = Callable[["MiniApp", dict[str, Any]], Awaitable[Any]]
Lifespan = Callable[["MiniApp"], AbstractAsyncContextManager[None]]
_REASONS = {200: "OK", 404: "Not Found", 500: "Internal Server Error"}


class MiniApp:
    """Routes by path (POST, JSON in and out) and a lifespan; `async with` starts and stops."""

    def __init__(self, routes: dict[str, Route], lifespan: Lifespan) -> None:
        self.routes = routes
        self.lifespan = lifespan
        self.state = SimpleNamespace()
        self.port = 0
        self.errors: list[BaseException] = []
        self._server: asyncio.Server | None = None
        self._life: AbstractAsyncContextManager[None] | None = None
        self._handlers: set[asyncio.Task[Any]] = set()

    async def __aenter__(self) -> Self:
        self._life = self.lifespan(self)
        await self._life.__aenter__()
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        self.port = int(self._server.sockets[0].getsockname()[1])
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        if self._life is not None:
            await self._life.__aexit__(exc_type, exc, tb)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        try:
            status, payload = await self._respond(reader)
            body = json.dumps(payload).encode()
            head = (
                f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
                "Content-Type: application/json\r\n"
                f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
            )
            writer.write(head.encode() + body)
            await writer.drain()
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
            if task is not None:
                self._handlers.discard(task)

    async def _respond(self, reader: asyncio.StreamReader) -> tuple[int, Any]:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
        request_line, *header_lines = head.split("\r\n")
        _method, path, _version = request_line.split(" ", 2)
        headers = {
            k.strip().lower(): v.strip()
            for k, _, v in (line.partition(":") for line in header_lines if line)
        }
        raw = await reader.readexactly(int(headers.get("content-length", "0")))
        route = self.routes.get(path)
        if route is None:
            return 404, {"error": "no such route"}
        try:
            return 200, await route(self, json.loads(raw or b"{}"))
        except Exception as exc:
            self.errors.append(exc)
            return 500, {"error": type(exc).__name__}


async def post_json(port: int, path: str, payload: Any) -> tuple[int, Any]:
    """POST `payload` as JSON to 127.0.0.1:`port`; the status and the decoded JSON answer."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        body = json.dumps(payload).encode()
        writer.write(
            f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            "Content-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
            + body
        )
        await writer.drain()
        response = await reader.read()
    finally:
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
    head, _, answer = response.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(answer)
