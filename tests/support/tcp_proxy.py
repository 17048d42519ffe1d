"""A pausable TCP proxy in front of a real server (Redis, PostgreSQL), for the event-loop tests.

`TcpProxy.in_front_of(url)` listens on a spare port of 127.0.0.1 and forwards every connection
to the server of `url`; `proxy.url` is that URL pointed at the proxy (user, password, database
and query kept). `pause()` holds every byte in both directions: connections are still
accepted (the kernel completes the handshake) but nothing reaches either side until
`resume()`, so a client waiting on the server is stuck for as long as the test wants, without
any server being slow or down. The proxy runs its own asyncio loop in a daemon thread: the
test's loop, whatever it does, never moves the proxy's bytes.

Counters tell a test what the clients did: `open_connections` (now), `peak_connections`,
`total_connections`, `held_bytes` (read while paused, not yet forwarded: > 0 proves that a
client is waiting on the proxy right now) and `holds` (chunks ever held). `release_held()`
forwards what is held and stays paused: a test can step a client through its round trips.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, Self, TypeVar
from urllib.parse import urlsplit, urlunsplit

T = TypeVar("T")
DEFAULT_PORTS = {"redis": 6379, "rediss": 6379, "postgres": 5432, "postgresql": 5432}
_CHUNK = 64 * 1024


def upstream_of(url: str) -> tuple[str, int]:
    """Host and port of a redis:// or postgresql[+driver]:// URL (default port if none)."""
    parts = urlsplit(url)
    scheme = parts.scheme.split("+", 1)[0]
    if scheme not in DEFAULT_PORTS or not parts.hostname:
        raise ValueError(f"not a TCP redis:// or postgresql:// URL: {parts.scheme}://")
    return parts.hostname, parts.port or DEFAULT_PORTS[scheme]


def through(url: str, host: str, port: int) -> str:
    """`url` with its host and port replaced (user, password, path and query kept)."""
    parts = urlsplit(url)
    upstream_of(url)  # refuses what is not a TCP Redis/PostgreSQL URL
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@{host}:{port}" if userinfo else f"{host}:{port}"
    return urlunsplit(parts._replace(netloc=netloc))


class TcpProxy:
    """Forwards 127.0.0.1:<port> to one upstream server; `pause()` / `resume()` the bytes."""

    def __init__(self, upstream_host: str, upstream_port: int, *, upstream_url: str = "") -> None:
        self.upstream = (upstream_host, upstream_port)
        self.upstream_url = upstream_url
        self.host = "127.0.0.1"
        self.port = 0
        self.open_connections = 0
        self.peak_connections = 0
        self.total_connections = 0
        self.held_bytes = 0
        self.holds = 0
        self._loop = asyncio.new_event_loop()
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._thread = threading.Thread(target=self._run, name="tcp-proxy", daemon=True)

    @classmethod
    def in_front_of(cls, url: str) -> Self:
        """A started proxy in front of the server of `url` (close it, or use `with`)."""
        host, port = upstream_of(url)
        return cls(host, port, upstream_url=url).start()

    @property
    def url(self) -> str:
        """The upstream URL given to `in_front_of`, pointed at the proxy."""
        return self.rewrite(self.upstream_url)

    def rewrite(self, url: str) -> str:
        """Any URL of the same server (another database, another driver) through the proxy."""
        return through(url, self.host, self.port)

    @property
    def paused(self) -> bool:
        return not self._flowing.is_set()

    # -- control (from any thread but the proxy's) ----------------------------------------

    def start(self) -> Self:
        self._thread.start()
        self._call(self._listen())
        return self

    def pause(self) -> None:
        """From now on no byte is forwarded, either way, until `resume()`."""
        self._call(self._set_flowing(False))

    def resume(self) -> None:
        """Release the held bytes (in the order they came) and forward again."""
        self._call(self._set_flowing(True))

    def release_held(self) -> None:
        """Forward the chunks held right now, and stay paused for whatever comes next: a
        test steps a client through its round trips one at a time."""
        self._call(self._pulse())

    def resume_after(self, delay_s: float) -> threading.Thread:
        """Resume from another thread after `delay_s` (for a caller that blocks its thread)."""

        def later() -> None:
            time.sleep(delay_s)
            self.resume()

        thread = threading.Thread(target=later, name="tcp-proxy-resume", daemon=True)
        thread.start()
        return thread

    def drop_connections(self) -> None:
        """Close every connection now (both sides see the peer go away)."""
        self._call(self._cancel_all())

    def close(self) -> None:
        if not self._thread.is_alive():
            return
        with contextlib.suppress(Exception):
            self._call(self._shutdown())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        if not self._thread.is_alive():
            self._loop.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    # -- the proxy's own loop ---------------------------------------------------------------

    def _run(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()

    async def _listen(self) -> None:
        self._server = await asyncio.start_server(self._accept, self.host, 0)
        self.port = int(self._server.sockets[0].getsockname()[1])

    async def _set_flowing(self, flowing: bool) -> None:
        if flowing:
            self._flowing.set()
        else:
            self._flowing.clear()

    async def _pulse(self) -> None:
        if self._flowing.is_set():
            return
        self._flowing.set()
        # The woken pumps run before this coroutine resumes: each forwards its chunk (and
        # un-counts it) and goes back to reading, so what is held afterwards is new.
        await asyncio.sleep(0)
        self._flowing.clear()

    async def _cancel_all(self) -> None:
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _shutdown(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        self._flowing.set()
        await self._cancel_all()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.open_connections += 1
        self.total_connections += 1
        self.peak_connections = max(self.peak_connections, self.open_connections)
        try:
            await self._serve(reader, writer)
        except asyncio.CancelledError:
            pass  # dropped or shut down: asyncio's stream callback must not see it cancelled
        finally:
            self.open_connections -= 1
            self._tasks.discard(task)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        upstream: asyncio.StreamWriter | None = None
        try:
            up_reader, upstream = await asyncio.open_connection(*self.upstream)
            pumps = [
                asyncio.create_task(self._pump(reader, upstream)),
                asyncio.create_task(self._pump(up_reader, writer)),
            ]
            try:
                # Either side hanging up ends the connection (Redis and PostgreSQL clients
                # never half-close).
                await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for pump in pumps:
                    pump.cancel()
                await asyncio.gather(*pumps, return_exceptions=True)
        except OSError:
            pass
        finally:
            # Close both before awaiting either: a second cancellation mid-wait must not
            # leave one open (an unclosed StreamWriter warns when collected, in any test).
            writers = [w for w in (writer, upstream) if w is not None]
            for w in writers:
                w.close()
            for w in writers:
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await w.wait_closed()

    async def _pump(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(_CHUNK):
                if not self._flowing.is_set():
                    self.held_bytes += len(data)
                    self.holds += 1
                    try:
                        await self._flowing.wait()
                    finally:
                        self.held_bytes -= len(data)
                writer.write(data)
                await writer.drain()
