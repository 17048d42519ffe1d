"""Local TCP ports for private servers, fake services and endpoints meant to be unreachable."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port of 127.0.0.1 nothing listens on right now: for a server to bind, or as an
    endpoint that refuses connections."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
