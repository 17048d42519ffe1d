"""Running private servers on this machine: as which user, one bootstrap at a time, liveness,
waiting for them to answer, and the tail of their logs when they do not."""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from memory_core.devservices.poll import WaitTimeout, wait_for

START_TIMEOUT_S = 30.0


class DevServicesError(RuntimeError):
    """A service could not be used or started; the message says what to do."""


@dataclass
class PrivateServer:
    """A private server on 127.0.0.1: its port, a line for the user, how to stop it."""

    port: int
    note: str  # what was started, or that it already ran
    stop: Callable[[], None] | None  # None: it was already running, not ours to stop
    root: Path | None = None  # where its state is kept, if the caller needs to know


def log_tail(log: Path | None) -> str:
    if log is None or not log.exists():
        return ""
    lines = log.read_text(errors="replace").splitlines()[-15:]
    return f"\n--- last lines of {log} ---\n" + "\n".join(lines)


def wait_until_up(check: Callable[[], bool], what: str, log: Path | None = None) -> None:
    """Wait for a server started here to accept connections; DevServicesError if it does not."""
    try:
        wait_for(check, START_TIMEOUT_S, f"{what} to accept connections")
    except WaitTimeout as exc:
        raise DevServicesError(f"{exc}{log_tail(log)}") from None


@contextlib.contextmanager
def locked(data_dir: Path) -> Iterator[None]:
    """Serialise concurrent bootstraps on one data dir (no-op where fcntl is missing)."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    with open(data_dir / ".lock", "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def run_as_user() -> str | None:
    """initdb/postgres refuse to run as root: pick an unprivileged account to run them as."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return None
    import pwd

    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    raise DevServicesError("running as root, but no 'postgres' or 'nobody' account to run initdb")


def as_user(cmd: list[str], user: str | None) -> list[str]:
    """`cmd`, run as `user` (None: as this process)."""
    if user is None:
        return cmd
    if shutil.which("runuser"):
        return ["runuser", "-u", user, "--", *cmd]
    return ["su", "-s", "/bin/sh", user, "-c", shlex.join(cmd)]


def traversable(path: Path, user: str) -> bool:
    """Can `user` reach `path`? (execute bit for it on every ancestor directory)"""
    import pwd

    pw = pwd.getpwnam(user)
    groups = set(os.getgrouplist(user, pw.pw_gid))
    for directory in [path, *path.parents]:
        st = directory.stat()
        bit = 0o100 if st.st_uid == pw.pw_uid else 0o010 if st.st_gid in groups else 0o001
        if not st.st_mode & bit:
            return False
    return True


def alive(pid: int) -> bool:
    """Still running? (a zombie left by an init that does not reap counts as gone)"""
    try:
        os.kill(pid, 0)
        return Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0] != "Z"
    except ProcessLookupError:
        return False
    except OSError:  # no /proc (macOS)
        return True
