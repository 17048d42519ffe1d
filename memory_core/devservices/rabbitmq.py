"""RabbitMQ for development and tests: find the broker, start or install the machine's, give a
test session a vhost of its own, and run private nodes a test may kill.

* `ensure_rabbitmq`: `make test` works on a fresh machine. A broker that answers is used as it
  is; otherwise the machine's node is started (`rabbitmq-server -detached`), installed first
  with apt-get when we are root and it is missing. The error names what to install otherwise.
* `test_vhost` / `drop_vhost`: concurrent test sessions share the machine's node but never its
  queues (`rabbitmqctl add_vhost` + `set_permissions`, on the local node). `purge_queues`
  empties named queues of a vhost, a missing one being no error.
* `PrivateRabbitMQ`: a node of its own (name, AMQP port, data and logs in a throwaway
  directory, the machine's config and plugins left out) that a test may stop, kill -9 and
  restart, data kept, without touching the shared node. It runs as a foreground child; every
  process of its Erlang VM (beam.smp, erl_child_setup, inet_gethost, ...) carries a marker in
  its environment, so none outlives `kill()`/`stop()` even though they leave its process group.

`python -m memory_core.devservices.rabbitmq [URL]` prints the URL of a broker that answers.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit, urlunsplit

from kombu import Connection
from kombu.exceptions import OperationalError

from memory_core.devservices.poll import WaitTimeout, wait_for
from memory_core.devservices.ports import free_port
from memory_core.devservices.system import DevServicesError, alive, locked, log_tail

log = logging.getLogger(__name__)

DEFAULT_URL = "amqp://guest:guest@127.0.0.1:5672//"
REACH_TIMEOUT_S = 2.0  # one connection attempt, handshake included
NODE_START_TIMEOUT_S = 60.0
CTL_TIMEOUT_S = 30.0  # one rabbitmqctl / rabbitmq-diagnostics call
INSTALL_TIMEOUT_S = 900.0  # apt-get update + install on a slow mirror
STOP_TIMEOUT_S = 30.0
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})
# The real scripts (Debian/RPM keep them here; /usr/sbin has wrappers that `su rabbitmq`,
# fine for the machine's node, not for a private one in a directory of ours), then Homebrew.
_SCRIPT_DIRS = ("/usr/lib/rabbitmq/bin", "/opt/homebrew/opt/rabbitmq/sbin", "/usr/local/sbin")
_MARKER = "AGENT_MEMORY_RABBITMQ_NODE"  # in the environment of every process of a private node
_DIST_ON_LOOPBACK = "-kernel inet_dist_use_interface {127,0,0,1}"  # Erlang distribution
_serial = itertools.count(1)


def _where(url: str) -> str:
    """The URL without its password, for messages."""
    parts = urlsplit(url)
    return f"{parts.hostname}:{parts.port or 5672}{parts.path or '/'}"


def rabbitmq_reachable(url: str, timeout_s: float = REACH_TIMEOUT_S) -> bool:
    """Does an AMQP broker answer at `url` (login and vhost included)? Nobody listening is
    False; a broker that refuses the login or the vhost is a DevServicesError."""
    conn = Connection(url, connect_timeout=timeout_s)
    try:
        conn.ensure_connection(max_retries=0)  # one attempt: no retry, no back-off sleep
    except (OperationalError, OSError, *conn.connection_errors, *conn.channel_errors) as exc:
        refused = (exc, exc.__cause__)  # kombu wraps some errors of the AMQP client
        if any(getattr(err, "reply_code", None) in (403, 530) for err in refused):
            # ACCESS_REFUSED (login), NOT_ALLOWED (no such vhost)
            raise DevServicesError(f"RabbitMQ answers at {_where(url)} but: {exc}") from exc
        return False
    finally:
        conn.release()
    return True


def with_vhost(url: str, vhost: str) -> str:
    """`url` pointing at `vhost` instead."""
    return urlunsplit(urlsplit(url)._replace(path="/" + quote(vhost, safe="")))


def _tool(name: str, *, real_script: bool = False) -> str | None:
    """Where a RabbitMQ command is: PATH (and sbin directories, often not on a user's PATH),
    or with `real_script` the script the /usr/sbin wrappers run, where there is one."""
    if real_script:
        for directory in _SCRIPT_DIRS:
            candidate = Path(directory, name)
            if os.access(candidate, os.X_OK):
                return str(candidate)
    search = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin"])
    return shutil.which(name, path=search)


def _run(
    cmd: Sequence[str], timeout_s: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            list(cmd), capture_output=True, text=True, check=False, timeout=timeout_s, env=env
        )
    except subprocess.TimeoutExpired as exc:
        raise DevServicesError(f"{' '.join(cmd)} did not finish in {timeout_s:g}s") from exc


def ensure_rabbitmq(url: str | None = None) -> str:
    """A URL of a RabbitMQ that answers: `url` (default DEFAULT_URL) itself. If nothing answers
    there and the URL is local, the machine's node is started, installed first (apt-get, as
    root) when missing. DevServicesError, saying what to do, when none of that is possible."""
    url = url or DEFAULT_URL
    if rabbitmq_reachable(url):
        return url
    if urlsplit(url).hostname not in LOCAL_HOSTS:
        raise DevServicesError(f"RabbitMQ does not answer at {_where(url)}: start it there")
    lock_dir = Path(tempfile.gettempdir(), "agent-memory-rabbitmq")
    lock_dir.mkdir(exist_ok=True)
    with locked(lock_dir):  # one session installs/starts; the others then find it running
        if rabbitmq_reachable(url):
            return url
        if _tool("rabbitmq-server") is None:
            _install_rabbitmq(url)
        _start_machine_node(url, lock_dir / "start.log")
    return url


def _install_rabbitmq(url: str) -> None:
    apt = shutil.which("apt-get")
    if apt is None or os.geteuid() != 0:
        raise DevServicesError(
            f"RabbitMQ does not answer at {_where(url)} and is not installed: install "
            "rabbitmq-server (Debian/Ubuntu: `sudo apt-get install rabbitmq-server`, macOS: "
            "`brew install rabbitmq`), or point the URL at a running broker"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = [apt, "install", "-y", "-qq", "--no-install-recommends", "rabbitmq-server"]
    log.warning("RabbitMQ is not installed: installing it (%s)", " ".join(install))
    proc = _run(install, INSTALL_TIMEOUT_S, env=env)
    if proc.returncode:  # a fresh image has no package lists yet
        _run([apt, "update", "-qq"], INSTALL_TIMEOUT_S, env=env)
        proc = _run(install, INSTALL_TIMEOUT_S, env=env)
    if _tool("rabbitmq-server") is None:
        raise DevServicesError(f"apt-get install rabbitmq-server failed: {proc.stderr[-2000:]}")
    if proc.returncode:  # e.g. its post-install start failed in a container: we start it
        log.warning("apt-get install rabbitmq-server: exit %s, continuing", proc.returncode)


def _machine_node_state() -> str:
    """ "running" (the broker is up), "booting" (its Erlang node is), or "down"."""
    diagnostics = _tool("rabbitmq-diagnostics")
    if diagnostics is None:
        return "down"
    if _run([diagnostics, "-q", "check_running"], CTL_TIMEOUT_S).returncode == 0:
        return "running"
    if _run([diagnostics, "-q", "ping"], CTL_TIMEOUT_S).returncode == 0:
        return "booting"  # started by someone else a moment ago (.ci/run, another session)
    return "down"


def _start_machine_node(url: str, log_file: Path) -> None:
    state = _machine_node_state()
    if state == "running":
        raise DevServicesError(
            f"the local RabbitMQ node runs but nothing answers at {_where(url)}: "
            "check the URL's port, user and vhost"
        )
    server = _tool("rabbitmq-server")
    if server is None:  # pragma: no cover - the caller installed it
        raise DevServicesError("rabbitmq-server not found: install it")
    if state == "down":
        log.warning("RabbitMQ does not answer at %s: starting `%s -detached`", _where(url), server)
        with open(log_file, "ab") as out:
            proc = subprocess.run(
                [server, "-detached"], stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                start_new_session=True, timeout=CTL_TIMEOUT_S, check=False,
            )  # fmt: skip
        if proc.returncode:
            raise DevServicesError(f"`{server} -detached` failed{log_tail(log_file)}")
    started = time.monotonic()
    try:
        wait_for(
            lambda: rabbitmq_reachable(url, timeout_s=1.0),
            NODE_START_TIMEOUT_S,
            f"the local RabbitMQ node to answer at {_where(url)}",
            lambda: log_tail(log_file),
            interval_s=0.2,
        )
    except WaitTimeout as exc:
        raise DevServicesError(str(exc)) from None
    log.info("local RabbitMQ node up in %.1fs", time.monotonic() - started)


def _rabbitmqctl(args: Sequence[str], rabbitmqctl: Sequence[str] = ()) -> str:
    """Run rabbitmqctl (`rabbitmqctl`: the command to run, default the machine's), bounded."""
    prefix = list(rabbitmqctl)
    if not prefix:
        found = _tool("rabbitmqctl")
        if found is None:
            raise DevServicesError("rabbitmqctl not found: install rabbitmq-server")
        prefix = [found]
    proc = _run([*prefix, "-q", *args], CTL_TIMEOUT_S)
    if proc.returncode:
        raise DevServicesError(
            f"rabbitmqctl {' '.join(args)} failed ({proc.returncode}): "
            f"{(proc.stderr or proc.stdout).strip()}"
        )
    return proc.stdout


def test_vhost(base_url: str, name: str, *, rabbitmqctl: Sequence[str] = ()) -> str:
    """Create vhost `name` (if missing) on the local node, give the URL's user every permission
    on it, and return `base_url` pointing at it. Idempotent."""
    user = unquote(urlsplit(base_url).username or "guest")
    _rabbitmqctl(["add_vhost", name], rabbitmqctl)
    _rabbitmqctl(["set_permissions", "-p", name, user, ".*", ".*", ".*"], rabbitmqctl)
    return with_vhost(base_url, name)


test_vhost.__test__ = False  # type: ignore[attr-defined]  # a helper, not a pytest test


def drop_vhost(name: str, *, rabbitmqctl: Sequence[str] = ()) -> None:
    """Delete vhost `name` and everything in it; a vhost that does not exist is no error."""
    try:
        _rabbitmqctl(["delete_vhost", name], rabbitmqctl)
    except DevServicesError as exc:
        if "does not exist" not in str(exc):
            raise


def purge_queues(url: str, names: Iterable[str]) -> dict[str, int]:
    """Empty the queues among `names` that exist in the URL's vhost: name -> messages removed
    (messages held unacked by a consumer stay)."""
    purged: dict[str, int] = {}
    with Connection(url, connect_timeout=REACH_TIMEOUT_S) as conn:
        conn.ensure_connection(max_retries=0)
        for name in names:
            channel = conn.channel()  # an error closes a channel: one per queue
            try:
                purged[name] = int(channel.queue_purge(name) or 0)
            except conn.channel_errors as exc:
                if getattr(exc, "reply_code", None) != 404:  # NOT_FOUND: nothing to purge
                    raise
            else:
                channel.close()
    return purged


class PrivateRabbitMQ:
    """A RabbitMQ node of its own on a free port of 127.0.0.1, as a child process.

    `start()` (or `with`) runs it and waits until AMQP answers; `stop()` is a clean shutdown
    (SIGTERM), `kill()` a crash (SIGKILL to every process of its VM); `restart()` starts it
    again with the same name, port and data (durable and quorum queues keep their messages).
    `close()` stops it and removes its directory if it made one. `last_start_s`: how long the
    last start took. With `management=True` the management plugin listens on
    `management_port` (slower start).

    RabbitMQ 3.10's Ra saves its registry of quorum queue members every 500 ms: a node killed
    sooner after a queue's declaration recreates that queue empty (its log is orphaned).
    """

    def __init__(self, data_dir: Path | None = None, *, management: bool = False) -> None:
        self._own_dir = data_dir is None
        self.dir = Path(data_dir or tempfile.mkdtemp(prefix="agent-memory-rabbitmq-")).resolve()
        self.dir.mkdir(parents=True, exist_ok=True)
        server, ctl = (_tool(n, real_script=True) for n in ("rabbitmq-server", "rabbitmqctl"))
        if server is None or ctl is None:
            raise DevServicesError("rabbitmq-server not found: install it (apt-get/brew)")
        self.server, self.ctl_exe = server, ctl
        self.node = f"am{os.getpid()}x{next(_serial)}@localhost"
        self.port = free_port()
        self.management_port = free_port() if management else None
        self.url = f"amqp://guest:guest@127.0.0.1:{self.port}//"
        self.log = self.dir / "console.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.last_start_s: float | None = None
        self._write_config()

    def _write_config(self) -> None:
        conf = [f"listeners.tcp.default = 127.0.0.1:{self.port}", "loopback_users = none"]
        plugins = "[]."
        if self.management_port is not None:
            conf += [
                "management.tcp.ip = 127.0.0.1",
                f"management.tcp.port = {self.management_port}",
            ]
            plugins = "[rabbitmq_management]."
        (self.dir / "rabbitmq.conf").write_text("\n".join(conf) + "\n")
        (self.dir / "enabled_plugins").write_text(plugins + "\n")
        (self.dir / "rabbitmq-env.conf").write_text("")  # not the machine's /etc/rabbitmq one

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("RABBITMQ_")}
        env.update(
            {
                _MARKER: self.node,
                "HOME": str(self.dir),  # the Erlang cookie of the node and its rabbitmqctl
                "RABBITMQ_NODENAME": self.node,
                "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
                "RABBITMQ_NODE_PORT": str(self.port),
                "RABBITMQ_DIST_PORT": str(free_port()),  # any: only rabbitmqctl uses it
                "RABBITMQ_CONF_ENV_FILE": str(self.dir / "rabbitmq-env.conf"),
                "RABBITMQ_CONFIG_FILE": str(self.dir / "rabbitmq.conf"),
                "RABBITMQ_ADVANCED_CONFIG_FILE": str(self.dir / "advanced.config"),  # none
                "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.dir / "enabled_plugins"),
                "RABBITMQ_MNESIA_BASE": str(self.dir / "mnesia"),
                "RABBITMQ_LOG_BASE": str(self.dir / "log"),
                "RABBITMQ_PID_FILE": str(self.dir / "rabbitmq.pid"),
                "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS": _DIST_ON_LOOPBACK,
            }
        )
        return env

    @property
    def rabbitmqctl(self) -> list[str]:
        """The command prefix that runs rabbitmqctl against this node (for `test_vhost`)."""
        return ["env", f"HOME={self.dir}", self.ctl_exe, "-n", self.node]

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def _answers(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise DevServicesError(
                f"private RabbitMQ {self.node} exited ({self.proc.returncode}){log_tail(self.log)}"
            )
        return rabbitmq_reachable(self.url, timeout_s=1.0)

    def start(self) -> None:
        """Run the node (no-op if running) and wait until AMQP answers."""
        if self.running():
            return
        started = time.monotonic()
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                [self.server], env=self._env(), cwd=self.dir, stdin=subprocess.DEVNULL,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        try:
            wait_for(
                self._answers,
                NODE_START_TIMEOUT_S,
                f"private RabbitMQ {self.node} on 127.0.0.1:{self.port}",
                lambda: log_tail(self.log),
                interval_s=0.1,
            )
        except WaitTimeout as exc:
            self.kill()
            raise DevServicesError(str(exc)) from None
        except BaseException:
            self.kill()
            raise
        self.last_start_s = time.monotonic() - started
        log.info("private RabbitMQ %s up in %.1fs (%s)", self.node, self.last_start_s, self.dir)

    def pids(self) -> list[int]:
        """Every live process of this node's VM, found by the marker in its environment."""
        marker = f"{_MARKER}={self.node}\0".encode()
        pids = []
        for entry in Path("/proc").glob("[0-9]*"):
            with contextlib.suppress(OSError):
                if marker in (entry / "environ").read_bytes() and alive(int(entry.name)):
                    pids.append(int(entry.name))
        return pids

    def kill(self) -> None:
        """A crash: SIGKILL to every process of the node (beam.smp, erl_child_setup, ...), then
        wait until all of it is gone."""
        if self.proc is not None and self.proc.poll() is None:  # not reaped: pid not reused
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait(STOP_TIMEOUT_S)
        wait_for(lambda: not self.pids(), STOP_TIMEOUT_S, f"{self.node} to exit", interval_s=0.05)

    def stop(self) -> None:
        """A clean shutdown (SIGTERM: queues and messages flushed), then nothing left over."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(STOP_TIMEOUT_S)
        self.kill()  # what outlived the VM (a port program), or all of it after a timeout

    def restart(self) -> None:
        """Stop it if running, and start it again: same name, port and data."""
        self.stop()
        self.start()

    def close(self) -> None:
        try:
            self.stop()
        finally:
            if self._own_dir:
                shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> PrivateRabbitMQ:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="# %(message)s")
    try:
        sys.stdout.write(ensure_rabbitmq(sys.argv[1] if len(sys.argv) > 1 else None) + "\n")
    except DevServicesError as exc:
        log.error("%s", exc)
        sys.exit(1)
