"""Local TCP ports for private servers, fake services and endpoints meant to be unreachable."""

from __future__ import annotations

import contextlib
import socket


def free_port() -> int:
    """A port of 127.0.0.1 nothing listens on right now: for a server to bind, or as an
    endpoint that refuses connections."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def free_ports(count: int) -> list[int]:
    """`count` distinct free ports of 127.0.0.1, held open together while drawn: calls of
    `free_port` in a row may hand out one port twice, or one a server of the same draw is
    about to bind."""
    with contextlib.ExitStack() as stack:
        socks = [
            stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            for _ in range(count)
        ]
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]
