"""docker-compose.yml, the Dockerfile and deploy/ (Kustomize), validated offline.

No Docker engine or cluster is needed, nor the network:
* compose: check-jsonschema against its bundled Compose Specification schema (run with a
  dead HTTP proxy, so a schema download would fail), then structural assertions.
* Kubernetes: kubernetes-validate (bundled OpenAPI-derived schemas, strict: unknown fields
  fail) for every built-in kind. It has no schema for CRDs (KEDA's ScaledObject and
  TriggerAuthentication, the RabbitMQ Cluster Operator's RabbitmqCluster) and its CLI only
  *warns* and exits 0 for them, so those are checked by assertions here (the pod template
  fragment a RabbitmqCluster overrides is validated as a Pod).
* The broker is RabbitMQ in both: compose's and the Secret's CELERY_BROKER_URL must reach the
  rabbitmq service / the RabbitmqCluster's Service with its user and vhost, and Flower's
  broker API URL is checked with Flower's own RabbitMQ client (its HTTP call intercepted).
* Commands are parsed by the real `agent-memory` CLI (click), Celery beat's by Celery's own
  CLI, and every environment variable name must be a field of memory_core.settings.Settings
  (or a listed exception).
* Celery beat: exactly one (it sends the whole schedule), on the installed app name, with its
  schedule file on a writable path, configured as the workers are.
"""

from __future__ import annotations

import asyncio
import os
import re
import shlex
import socket
import subprocess
import sys
from importlib import resources
from pathlib import Path, PurePosixPath
from types import SimpleNamespace
from typing import Any
from unittest import mock
from urllib.parse import SplitResult, unquote, urlsplit

import click
import kubernetes_validate
import pytest
import typer.core
import typer.main
import yaml
from kombu import Connection
from kubernetes_validate.utils import all_versions
from tornado import httpclient

from memory_core import cli
from memory_core.fold.publisher import WORKER_APP
from memory_core.io.queues import (
    FOLD_QUEUE,
    FORGET_OWNER_TASK,
    PURGE_TRACES_TASK,
    RETENTION_TASK,
    SWEEP_FOLDS_TASK,
)
from memory_core.settings import Settings

REPO = Path(__file__).resolve().parents[1]
COMPOSE_FILE = REPO / "docker-compose.yml"
DOCKERFILE = REPO / "Dockerfile"
DEPLOY = REPO / "deploy"
KUSTOMIZATION = DEPLOY / "kustomization.yaml"

# A version the installed kubernetes-validate bundles (it ships 1.25 .. its own version).
K8S_VERSION = "1.30.0"
WORKER_QUEUES = {"finalize": "memory.finalize", "fold": "memory.fold"}
# CRDs: kubernetes-validate has no schema for these API groups.
CRD_GROUPS = ("keda.sh/", "rabbitmq.com/")
# RabbitMQ: quorum queues with at-least-once dead-lettering (Celery's native delayed delivery).
MIN_RABBITMQ = (3, 10)
AMQP_PORT = 5672
MANAGEMENT_PORT = 15672
# Settings of the Redis broker only: with RabbitMQ they would configure nothing.
REDIS_BROKER_ONLY = {"MEMORY_VISIBILITY_TIMEOUT_S", "MEMORY_UNACKED_RESTORE_INTERVAL_S"}
SETTINGS_ENV = {name.upper() for name in Settings.model_fields}
# Environment variables that are deliberately not app settings, and who reads them.
NOT_SETTINGS = {
    "REMAP_SIGTERM": "billiard: SIGTERM starts Celery's soft shutdown instead of a warm one",
    "POD_NAME": "Kubernetes downward API: the worker's (and beat's) Celery node name",
    "FLOWER_BROKER_API": "Flower's --broker_api (RabbitMQ management API), which Flower reads "
    "from the environment; `agent-memory flower` has no flag for it",
}
# Environment the workers have and beat deliberately does not: beat has no soft shutdown.
WORKER_ONLY_ENV = {"REMAP_SIGTERM"}
# The tasks beat sends, and the queue they ride (served by the fold workers).
BEAT_TASKS = {RETENTION_TASK, PURGE_TRACES_TASK, SWEEP_FOLDS_TASK}
LIFECYCLE_QUEUE = FOLD_QUEUE
CONTAINER_TMP = PurePosixPath("/tmp")  # noqa: S108 - inside the container, writable for its user
# Credentials (or URLs that carry them): the Secret, never the ConfigMap.
SECRET_NAMES = {
    "DATABASE_URL",
    "REDIS_URL",
    "CELERY_BROKER_URL",
    "OPENAI_API_KEY",
    "LANGFUSE_PUBLIC_KEY",
    "LANGFUSE_SECRET_KEY",
    "FLOWER_BASIC_AUTH",
}
# Any attempt to download something goes to a port where nothing listens.
NO_NETWORK_ENV = {
    **os.environ,
    "HTTP_PROXY": "http://127.0.0.1:9",
    "HTTPS_PROXY": "http://127.0.0.1:9",
    "http_proxy": "http://127.0.0.1:9",
    "https_proxy": "http://127.0.0.1:9",
    "NO_PROXY": "",
    "no_proxy": "",
}
DURATION = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
# Compose interpolation with a default: ${NAME:-default} or ${NAME-default}.
COMPOSE_DEFAULT = re.compile(r"\$\{\w+:?-([^}]*)\}")


def soft_shutdown_default() -> float:
    return float(Settings.model_fields["memory_worker_soft_shutdown_s"].default)


def seconds(duration: str) -> int:
    m = DURATION.match(duration)
    assert m and any(m.groups()), f"not a compose duration: {duration!r}"
    h, mi, s = (int(g or 0) for g in m.groups())
    return h * 3600 + mi * 60 + s


def after(args: list[str], flag: str) -> str:
    assert flag in args, f"{flag} missing in {args}"
    return args[args.index(flag) + 1]


def cli_params(argv: list[str]) -> dict[str, Any]:
    """Parse `agent-memory ARGV` with the real CLI (no invocation): option typos fail here."""
    group = typer.main.get_command(cli.app)
    assert isinstance(group, typer.core.TyperGroup)  # an app of several commands
    commands = group.commands
    name, *rest = argv
    assert name in commands, f"agent-memory has no command {name!r}"
    with commands[name].make_context(name, list(rest)) as ctx:
        return dict(ctx.params)


def celery_params(argv: list[str]) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """Parse `celery ARGV` with Celery's own CLI (click), without invoking it: (the global
    options, the subcommand, its options). Option and subcommand typos fail here."""
    from celery.bin.celery import celery as group

    from workers.app import app as worker_app  # beat's option defaults read the app's conf

    ctx = click.Context(group, info_name="celery", obj=SimpleNamespace(app=worker_app))
    rest = click.Command.parse_args(group, ctx, list(argv))  # up to the subcommand
    name, sub, sub_args = group.resolve_command(ctx, rest)
    assert name is not None and sub is not None, f"no celery subcommand in {argv}"
    with sub.make_context(name, sub_args, parent=ctx) as sub_ctx:
        return dict(ctx.params), name, dict(sub_ctx.params)


def assert_installed_app(app_ref: str) -> None:
    """`-A` names the app as installed (`memory_core.workers.app[:app]`), not the checkout's
    `workers.app`, which does not exist in the image."""
    module, _, attr = app_ref.partition(":")
    assert module == WORKER_APP, app_ref
    assert attr in {"", "app"}, app_ref


def check_env_names(names: set[str], where: str) -> None:
    unknown = names - SETTINGS_ENV - set(NOT_SETTINGS)
    assert not unknown, f"{where}: not fields of memory_core.settings.Settings: {unknown}"


def settings_from(values: dict[str, Any]) -> Settings:
    """Settings built from these env values only (types and validators apply)."""
    known = {k.lower(): v for k, v in values.items() if k in SETTINGS_ENV and v is not None}
    return Settings(_env_file=None, **known)


def with_defaults(value: str) -> str:
    """A compose value as it is when the shell sets none of its variables."""
    resolved = COMPOSE_DEFAULT.sub(lambda m: m.group(1), value)
    assert "${" not in resolved, f"no default for a variable in {value!r}"
    return resolved


def rabbitmq_image_version(image: str) -> tuple[int, int]:
    """`rabbitmq:3.13-management` -> (3, 13); the image must carry the management plugin."""
    m = re.fullmatch(r"rabbitmq:(\d+)\.(\d+)(?:\.\d+)?-management(?:-alpine)?", image)
    assert m, f"not a pinned rabbitmq:X.Y[.Z]-management image: {image!r}"
    return int(m.group(1)), int(m.group(2))


def assert_amqp_url(url: str) -> SplitResult:
    """A RabbitMQ broker URL with user, password, host, port and a vhost."""
    parts = urlsplit(url)
    assert parts.scheme == "amqp", url
    assert parts.username and parts.password, f"no credentials in {url!r}"
    assert parts.port == AMQP_PORT, url
    assert len(parts.path) > 1 and "/" not in parts.path[1:], f"no vhost in {url!r}"
    # Flower's management API calls run only for this transport (flower/views/__init__.py).
    assert Connection(url).transport.driver_type == "amqp"
    return parts


def flower_queue_request(broker_url: str, broker_api: str) -> tuple[str, str, str]:
    """The management-API request Flower's RabbitMQ client makes for the queue lengths:
    (URL, user, password), with the HTTP call intercepted (no network)."""
    from flower.command import is_flower_envvar  # type: ignore[import-untyped]
    from flower.utils.broker import Broker, validate_broker_api  # type: ignore[import-untyped]

    assert is_flower_envvar("FLOWER_BROKER_API")  # the exact name Flower reads
    validate_broker_api(broker_api)  # what Flower checks at startup (http(s), a host)
    seen: dict[str, Any] = {}

    class Client:
        async def fetch(self, url: str, **kwargs: Any) -> None:
            seen.update(kwargs, url=url)
            raise OSError("intercepted")  # Flower logs it and reports no queues

        def close(self) -> None:
            pass

    with mock.patch.object(httpclient, "AsyncHTTPClient", Client):
        broker = Broker(broker_url, http_api=broker_api)
        assert asyncio.run(broker.queues(list(WORKER_QUEUES.values()))) == []
    return seen["url"], seen["auth_username"], seen["auth_password"]


# --------------------------------------------------------------------------------- compose


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def app_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        name: svc
        for name, svc in compose["services"].items()
        if str(svc.get("image", "")).startswith("agent-memory")
    }


def run_check_jsonschema(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "check_jsonschema",
            "--builtin-schema",
            "vendor.compose-spec",
            str(path),
        ],
        capture_output=True,
        text=True,
        env=NO_NETWORK_ENV,
        timeout=120,
        check=False,
    )


def test_compose_schema_is_bundled() -> None:
    schema = resources.files("check_jsonschema.builtin_schemas.vendor") / "compose-spec.json"
    assert schema.is_file()


def test_compose_file_matches_the_compose_spec(tmp_path: Path) -> None:
    result = run_check_jsonschema(COMPOSE_FILE)
    assert result.returncode == 0, result.stdout + result.stderr
    # The validator really validates: a misspelt service key is rejected.
    broken = tmp_path / "docker-compose.yml"
    broken.write_text(COMPOSE_FILE.read_text().replace("stop_grace_period:", "stop_grace:"))
    result = run_check_jsonschema(broken)
    assert result.returncode != 0
    assert "stop_grace" in result.stdout + result.stderr


@pytest.mark.parametrize("short", sorted(WORKER_QUEUES))
def test_compose_worker_per_queue(compose: dict[str, Any], short: str) -> None:
    svc = compose["services"][f"worker-{short}"]
    params = cli_params(svc["command"])
    assert params["queues"] == WORKER_QUEUES[short]
    assert params["concurrency"] >= 1
    # `docker compose up --scale worker-...=N`: no fixed name, no host port.
    assert "container_name" not in svc
    assert "ports" not in svc
    assert svc["restart"] in {"unless-stopped", "always", "on-failure"}
    assert svc["depends_on"] == {
        "migrate": {"condition": "service_completed_successfully"},
        "rabbitmq": {"condition": "service_healthy"},
        "redis": {"condition": "service_healthy"},
        "postgres": {"condition": "service_healthy"},
    }
    env = svc["environment"]
    assert env["REMAP_SIGTERM"] == "SIGQUIT"
    soft = float(env.get("MEMORY_WORKER_SOFT_SHUTDOWN_S") or soft_shutdown_default())
    assert seconds(svc["stop_grace_period"]) > soft + 5
    probe = " ".join(svc["healthcheck"]["test"])
    assert "celery -A memory_core.workers.app inspect ping" in probe
    assert "celery@$$HOSTNAME" in probe  # $$: compose escape, the shell expands it


def test_compose_worker_queues_cover_both_queues(compose: dict[str, Any]) -> None:
    served = {
        cli_params(svc["command"])["queues"]
        for svc in app_services(compose).values()
        if svc["command"][0] == "worker"
    }
    assert served == set(WORKER_QUEUES.values())


def compose_beats(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The app services that run Celery beat."""
    return {
        name: svc
        for name, svc in app_services(compose).items()
        if svc.get("entrypoint") == ["celery"] and "beat" in svc["command"]
    }


def test_compose_beat(compose: dict[str, Any]) -> None:
    # Exactly one beat: each sends the whole schedule, two would send every task twice.
    (svc,) = compose_beats(compose).values()
    assert svc.get("deploy", {}).get("replicas", 1) == 1
    assert "container_name" not in svc and "ports" not in svc
    assert svc["restart"] in {"unless-stopped", "always", "on-failure"}
    group, command, params = celery_params(svc["command"])
    assert command == "beat"
    assert_installed_app(group["app"])
    assert params["detach"] is False and params["pidfile"] is None  # foreground, no pid file
    # The schedule file in /tmp: writable for the image's non-root user, whatever its workdir.
    assert PurePosixPath(params["schedule"]).parent == CONTAINER_TMP
    assert not svc.get("read_only") and not svc.get("tmpfs")

    # The workers' settings, all of them, and nothing else but their worker-only remap.
    assert svc["environment"] == compose["x-app-env"]
    for short in WORKER_QUEUES:
        worker_env = compose["services"][f"worker-{short}"]["environment"]
        assert set(worker_env) - set(svc["environment"]) == WORKER_ONLY_ENV
        assert {k: v for k, v in worker_env.items() if k not in WORKER_ONLY_ENV} == svc[
            "environment"
        ]
    # Retention: passed through, so unset (keep forever) unless the shell sets it.
    assert "MEMORY_RETENTION_DAYS" in svc["environment"]
    assert svc["environment"]["MEMORY_RETENTION_DAYS"] is None
    # Beat needs the broker only.
    assert svc["depends_on"] == {"rabbitmq": {"condition": "service_healthy"}}

    # Health: a remote-control ping to beat's default node name celerybeat@<hostname>.
    assert params["remote_control"] is True and params["hostname"] is None
    from celery.beat import beat_nodename

    assert beat_nodename(None) == f"celerybeat@{socket.gethostname()}"
    test = svc["healthcheck"]["test"]
    assert test[0] == "CMD-SHELL"
    words = shlex.split(" ".join(test[1:]))
    assert words[:5] == ["celery", "-A", WORKER_APP, "inspect", "ping"]
    assert after(words, "-d") == "celerybeat@$$HOSTNAME"  # $$: compose escape, the shell expands it
    assert seconds(svc["healthcheck"]["timeout"]) > float(after(words, "--timeout"))


def test_compose_lifecycle_tasks_ride_a_served_queue(compose: dict[str, Any]) -> None:
    """What beat sends (and memory.forget_owner) is routed to memory.fold, which a worker
    service consumes."""
    from workers.app import app as worker_app

    scheduled = {entry["task"] for entry in worker_app.conf.beat_schedule.values()}
    assert scheduled == BEAT_TASKS
    for task in (*scheduled, FORGET_OWNER_TASK):
        assert worker_app.amqp.router.route({}, task)["queue"].name == LIFECYCLE_QUEUE, task
    served = {
        q
        for svc in app_services(compose).values()
        if svc["command"][0] == "worker"
        for q in cli_params(svc["command"])["queues"].split(",")
    }
    assert LIFECYCLE_QUEUE in served


def test_compose_rabbitmq(compose: dict[str, Any]) -> None:
    rabbit = compose["services"]["rabbitmq"]
    assert rabbitmq_image_version(rabbit["image"]) >= MIN_RABBITMQ
    assert rabbit["restart"] in {"unless-stopped", "always"}
    # The node name (rabbit@<hostname>) names its data directory: fixed, or a re-created
    # container would start on an empty database next to the old one.
    assert rabbit["hostname"] and "container_name" not in rabbit
    env = rabbit["environment"]
    assert {"RABBITMQ_DEFAULT_USER", "RABBITMQ_DEFAULT_PASS", "RABBITMQ_DEFAULT_VHOST"} <= set(env)
    assert all(with_defaults(str(env[k])) for k in env)
    # Data on a named volume (declared below), not in the container.
    (volume,) = [v for v in rabbit["volumes"] if v.endswith(":/var/lib/rabbitmq")]
    assert volume.split(":")[0] in compose["volumes"]
    # AMQP and the management UI/API published (loopback: the default credentials are weak).
    published = {int(str(p).rsplit(":", 1)[1]): str(p) for p in rabbit["ports"]}
    assert set(published) == {AMQP_PORT, MANAGEMENT_PORT}
    assert all(p.startswith("127.0.0.1:") for p in published.values())
    test = rabbit["healthcheck"]["test"]
    assert test[0] in {"CMD", "CMD-SHELL"}
    words = shlex.split(" ".join(test[1:]))
    assert words[0] == "rabbitmq-diagnostics"
    assert {"ping", "check_running", "check_port_connectivity"} & set(words[1:])


def test_compose_broker_is_rabbitmq(compose: dict[str, Any]) -> None:
    """CELERY_BROKER_URL: amqp://USER:PASS@rabbitmq:5672/VHOST, the rabbitmq service's own."""
    rabbit_env = compose["services"]["rabbitmq"]["environment"]
    anchor = compose["x-app-env"]
    url = assert_amqp_url(with_defaults(anchor["CELERY_BROKER_URL"]))
    assert url.hostname == "rabbitmq" and url.hostname in compose["services"]
    assert unquote(url.username or "") == with_defaults(rabbit_env["RABBITMQ_DEFAULT_USER"])
    assert unquote(url.password or "") == with_defaults(rabbit_env["RABBITMQ_DEFAULT_PASS"])
    assert unquote(url.path[1:]) == with_defaults(rabbit_env["RABBITMQ_DEFAULT_VHOST"])
    # The same variable drives both ends: overriding the password keeps them in step.
    pass_var = re.findall(r"\$\{(\w+)", anchor["CELERY_BROKER_URL"].split("@")[0])
    assert pass_var and pass_var == re.findall(r"\$\{(\w+)", rabbit_env["RABBITMQ_DEFAULT_PASS"])
    # Redis keeps the working copy and the event streams.
    assert urlsplit(anchor["REDIS_URL"]).hostname == "redis"
    for name, svc in app_services(compose).items():
        assert svc["environment"]["CELERY_BROKER_URL"] == anchor["CELERY_BROKER_URL"], name
        assert not REDIS_BROKER_ONLY & set(svc["environment"]), name
        if name not in ("migrate", "inspector"):  # the workers, beat and Flower
            assert svc["depends_on"]["rabbitmq"] == {"condition": "service_healthy"}, name


def test_compose_redis_is_durable_and_never_evicts(compose: dict[str, Any]) -> None:
    redis = compose["services"]["redis"]
    cmd = [str(a) for a in redis["command"]]
    assert cmd[0] == "redis-server"
    assert after(cmd, "--appendonly") == "yes"
    assert after(cmd, "--maxmemory-policy") == "noeviction"
    assert after(cmd, "--maxmemory")  # noeviction means nothing without a limit
    assert redis["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    assert any(v.endswith(":/data") for v in redis["volumes"])


def test_compose_postgres_and_migrate(compose: dict[str, Any]) -> None:
    pg = compose["services"]["postgres"]
    assert "pg_isready" in " ".join(pg["healthcheck"]["test"])
    assert any(v.endswith(":/var/lib/postgresql/data") for v in pg["volumes"])
    migrate = compose["services"]["migrate"]
    assert migrate["command"] == ["migrate"]
    assert cli_params(migrate["command"]) == {"revision": "head"}
    assert migrate["restart"] == "no"
    assert migrate["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    assert set(compose["volumes"]) >= {"pgdata", "rabbitmqdata", "redisdata"}


def test_compose_flower(compose: dict[str, Any]) -> None:
    flower = compose["services"]["flower"]
    params = cli_params(flower["command"])
    assert (params["address"], params["port"]) == ("0.0.0.0", 5555)
    # Required from the environment: no default credentials.
    assert re.fullmatch(
        r"\$\{FLOWER_BASIC_AUTH:\?[^}]+\}", flower["environment"]["FLOWER_BASIC_AUTH"]
    )
    # Flower needs the broker only (it reads tasks and workers from its events).
    assert flower["depends_on"] == {"rabbitmq": {"condition": "service_healthy"}}
    assert any(str(p).endswith(":5555") for p in flower["ports"])
    # Queue lengths from RabbitMQ's management API, which Flower is given.
    broker_url = with_defaults(flower["environment"]["CELERY_BROKER_URL"])
    rabbit_env = compose["services"]["rabbitmq"]["environment"]
    api = flower["environment"]["FLOWER_BROKER_API"]
    assert urlsplit(api).hostname == "rabbitmq" and urlsplit(api).port == MANAGEMENT_PORT
    url, user, password = flower_queue_request(broker_url, api)
    vhost = with_defaults(rabbit_env["RABBITMQ_DEFAULT_VHOST"])
    assert url == f"http://rabbitmq:{MANAGEMENT_PORT}/api/queues/{vhost}"
    assert user == with_defaults(rabbit_env["RABBITMQ_DEFAULT_USER"])
    assert password == with_defaults(rabbit_env["RABBITMQ_DEFAULT_PASS"])


def test_compose_env_names_are_settings(compose: dict[str, Any]) -> None:
    services = app_services(compose)
    assert set(services) == {
        *("migrate", "worker-finalize", "worker-fold", "beat", "flower", "inspector")
    }
    for name, svc in services.items():
        env = svc["environment"]
        check_env_names(set(env), f"docker-compose.yml service {name}")
        assert {"DATABASE_URL", "REDIS_URL", "CELERY_BROKER_URL"} <= set(env)
        # The values are valid settings as they stand, or with their defaults (compose
        # interpolation); a required one (${VAR:?...}) is left out.
        fixed = {
            k: with_defaults(str(v))
            for k, v in env.items()
            if v is not None and not re.search(r"\$\{\w+:?\?", str(v))
        }
        assert "CELERY_BROKER_URL" in fixed
        settings_from(fixed)
    anchor = compose["x-app-env"]
    assert {"OPENAI_BASE_URL", "OPENAI_API_KEY", "LANGFUSE_PUBLIC_KEY"} <= set(anchor)
    # Optional values are passed through (null), never as "" (OPENAI_BASE_URL="" is not unset).
    assert all(v != "" for v in anchor.values())


# ------------------------------------------------------------------------------ Dockerfile


def test_dockerfile() -> None:
    lines = [ln.strip() for ln in DOCKERFILE.read_text().splitlines()]
    assert "FROM python:3.11-slim" in lines
    assert 'ENTRYPOINT ["agent-memory"]' in lines
    user = next(ln.split()[1] for ln in lines if ln.startswith("USER "))
    assert user.isdigit() and int(user) != 0  # numeric: runAsNonRoot can check it
    text = DOCKERFILE.read_text()
    assert 'pip install "/src[langgraph,inspector]"' in text
    assert "COPY migrations /src/migrations" in text


def _mkdir(path: Path) -> Path:
    path.mkdir(parents=True)
    return path


def test_wheel_installs_one_top_level_name_holding_workers_and_migrations(tmp_path: Path) -> None:
    """Only `memory_core` lands in site-packages; workers/ and migrations/ ship inside it."""
    import shutil
    import subprocess
    import sys
    import zipfile

    # From a copy: an in-tree build/ left by an earlier build could smuggle stale files in.
    src = tmp_path / "src"
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name if src.exists() else _mkdir(src) / name)
    for name in ("memory_core", "workers", "migrations"):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(tmp_path),
            str(src),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("agent_memory-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    top = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert top == {"memory_core"}
    expected = {f"memory_core/{p.relative_to(REPO).as_posix()}" for p in REPO.glob("workers/*.py")}
    expected |= {
        f"memory_core/{p.relative_to(REPO).as_posix()}"
        for p in REPO.glob("migrations/**/*")
        if p.suffix in {".py", ".ini", ".mako"}
    }
    expected |= {p.relative_to(REPO).as_posix() for p in REPO.glob("memory_core/**/*.py")}
    expected |= {  # the eval's conversations and their schema: data, not modules
        p.relative_to(REPO).as_posix() for p in REPO.glob("memory_core/eval/conversations/*")
    }
    expected |= {  # the inspector's templates and stylesheet
        p.relative_to(REPO).as_posix()
        for p in REPO.glob("memory_core/inspector/*/*")
        if p.suffix in {".html", ".css"}
    }
    assert len(expected) > 30
    assert expected <= names, sorted(expected - names)


# ------------------------------------------------------------------------------ Kubernetes


def load_manifests() -> list[tuple[str, dict[str, Any]]]:
    docs = []
    for path in sorted(DEPLOY.glob("*.yaml")):
        if path == KUSTOMIZATION:
            continue
        docs += [(path.name, d) for d in yaml.safe_load_all(path.read_text()) if d]
    return docs


MANIFESTS = load_manifests()


def by_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for _, d in MANIFESTS if d["kind"] == kind}


def one(kind: str) -> dict[str, Any]:
    (doc,) = by_kind(kind).values()
    return doc


def container(workload: dict[str, Any]) -> dict[str, Any]:
    (c,) = workload["spec"]["template"]["spec"]["containers"]
    return c


def argv(c: dict[str, Any]) -> list[str]:
    return [*c.get("command", []), *c.get("args", [])]


def config_and_secret() -> tuple[dict[str, str], dict[str, str]]:
    return one("ConfigMap")["data"], one("Secret")["stringData"]


def test_kustomization_lists_every_manifest() -> None:
    k = yaml.safe_load(KUSTOMIZATION.read_text())
    assert k["kind"] == "Kustomization"
    files = {p.name for p in DEPLOY.glob("*.yaml")} - {KUSTOMIZATION.name}
    assert set(k["resources"]) == files
    (ns,) = by_kind("Namespace")
    assert k["namespace"] == ns
    assert all(d["metadata"]["namespace"] == ns for _, d in MANIFESTS if d["kind"] != "Namespace")
    # The image every workload names is the one kustomize rewrites.
    image_names = {i["name"] for i in k["images"]}
    for _, d in MANIFESTS:
        if d["kind"] in {"Deployment", "Job"}:
            assert container(d)["image"] in image_names


def test_k8s_version_is_bundled() -> None:
    assert K8S_VERSION in all_versions()


@pytest.mark.parametrize(
    "doc",
    [d for _, d in MANIFESTS],
    ids=[f"{f}:{d['kind']}/{d['metadata']['name']}" for f, d in MANIFESTS],
)
def test_manifest_validates(doc: dict[str, Any]) -> None:
    if doc["apiVersion"].startswith(CRD_GROUPS):
        # A CRD: kubernetes-validate has no schema (its CLI would only warn and pass).
        # test_keda_scaled_objects and test_rabbitmq_cluster check these structurally.
        with pytest.raises(kubernetes_validate.SchemaNotFoundError):
            kubernetes_validate.validate(doc, K8S_VERSION, strict=True)
        return
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_every_crd_kind_is_checked() -> None:
    """A new CRD kind needs assertions of its own: these are the ones with tests."""
    crds = {
        (d["apiVersion"], d["kind"]) for _, d in MANIFESTS if d["apiVersion"].startswith(CRD_GROUPS)
    }
    assert crds == {
        ("keda.sh/v1alpha1", "ScaledObject"),
        ("keda.sh/v1alpha1", "TriggerAuthentication"),
        ("rabbitmq.com/v1beta1", "RabbitmqCluster"),
    }


def test_strict_validation_rejects_a_misspelt_field() -> None:
    doc = yaml.safe_load((DEPLOY / "worker-fold.yaml").read_text())
    spec = doc["spec"]["template"]["spec"]
    spec["terminationGracePeriodSecond"] = spec.pop("terminationGracePeriodSeconds")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


@pytest.mark.parametrize("short", sorted(WORKER_QUEUES))
def test_worker_deployment(short: str) -> None:
    dep = by_kind("Deployment")[f"agent-memory-worker-{short}"]
    pod = dep["spec"]["template"]["spec"]
    c = container(dep)
    cmd = argv(c)
    assert cmd[0] == "agent-memory"
    params = cli_params(cmd[1:])
    assert params["queues"] == WORKER_QUEUES[short]
    assert params["concurrency"] >= 1
    # KEDA's HPA owns the replica count: a fixed one would be reset on every apply.
    assert "replicas" not in dep["spec"]

    # The node name is the pod name, expanded by Kubernetes from an env var it defines.
    env = {e["name"]: e for e in c["env"]}
    m = re.fullmatch(r"celery@\$\((\w+)\)", params["hostname"])
    assert m, params["hostname"]
    var = m.group(1)
    assert env[var]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["REMAP_SIGTERM"]["value"] == "SIGQUIT"

    # Liveness: a remote-control ping to exactly this node, the variable expanded by sh.
    probe = c["livenessProbe"]["exec"]["command"]
    assert probe[:2] == ["sh", "-c"]
    words = shlex.split(probe[2])
    assert words[words.index("celery") + 1 : words.index("celery") + 5] == [
        "-A",
        "memory_core.workers.app",
        "inspect",
        "ping",
    ]
    assert after(words, "-d") == f"celery@${{{var}}}"
    assert c["livenessProbe"]["timeoutSeconds"] > float(after(words, "--timeout"))

    configmap, _ = config_and_secret()
    soft = float(configmap.get("MEMORY_WORKER_SOFT_SHUTDOWN_S", soft_shutdown_default()))
    assert pod["terminationGracePeriodSeconds"] > soft + 5

    res = c["resources"]
    assert {"cpu", "memory"} <= set(res["requests"])
    assert "memory" in res["limits"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert c["securityContext"]["allowPrivilegeEscalation"] is False


def k8s_beats() -> dict[str, dict[str, Any]]:
    """The Deployments that run Celery beat."""
    return {
        name: d
        for name, d in by_kind("Deployment").items()
        if container(d).get("command") == ["celery"] and "beat" in container(d).get("args", [])
    }


def test_beat_deployment() -> None:
    # Exactly one beat, and never two at once: a rolling update would overlap old and new.
    (dep,) = k8s_beats().values()
    name = dep["metadata"]["name"]
    assert dep["spec"]["replicas"] == 1
    assert dep["spec"]["strategy"] == {"type": "Recreate"}
    scalers = [*by_kind("ScaledObject").values(), *by_kind("HorizontalPodAutoscaler").values()]
    assert name not in {s["spec"]["scaleTargetRef"]["name"] for s in scalers}

    pod = dep["spec"]["template"]["spec"]
    c = container(dep)
    cmd = argv(c)
    assert cmd[0] == "celery"
    group, command, params = celery_params(cmd[1:])
    assert command == "beat"
    assert_installed_app(group["app"])
    assert params["detach"] is False and params["pidfile"] is None

    # The schedule file on a writable emptyDir: the root filesystem is read-only.
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    schedule = PurePosixPath(params["schedule"])
    volumes = {v["name"]: v for v in pod["volumes"]}
    (mount,) = [
        m for m in c["volumeMounts"] if schedule.is_relative_to(PurePosixPath(m["mountPath"]))
    ]
    assert not mount.get("readOnly") and "emptyDir" in volumes[mount["name"]]

    # Configured as the workers are: same ConfigMap and Secret, same env but their remap.
    deployments = by_kind("Deployment")
    for short in WORKER_QUEUES:
        worker = container(deployments[f"agent-memory-worker-{short}"])
        assert c["envFrom"] == worker["envFrom"]
        worker_env = {e["name"]: e for e in worker["env"]}
        assert set(worker_env) - {e["name"] for e in c["env"]} == WORKER_ONLY_ENV
        assert {e["name"]: e for e in c["env"]} == {
            k: v for k, v in worker_env.items() if k not in WORKER_ONLY_ENV
        }

    # Liveness without a port: a remote-control ping through the broker to exactly this
    # pod's beat node (celerybeat@<pod name>), the variable expanded by sh.
    assert "ports" not in c and "readinessProbe" not in c
    probe = c["livenessProbe"]
    assert set(probe) & {"httpGet", "tcpSocket", "grpc"} == set()
    assert params["remote_control"] is True
    m = re.fullmatch(r"celerybeat@\$\((\w+)\)", params["hostname"])
    assert m, params["hostname"]
    var = m.group(1)
    env = {e["name"]: e for e in c["env"]}
    assert env[var]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    words = shlex.split(probe["exec"]["command"][2])
    assert probe["exec"]["command"][:2] == ["sh", "-c"]
    assert words[words.index("celery") + 1 : words.index("celery") + 5] == [
        "-A",
        WORKER_APP,
        "inspect",
        "ping",
    ]
    assert after(words, "-d") == f"celerybeat@${{{var}}}"
    assert probe["timeoutSeconds"] > float(after(words, "--timeout"))

    # Resources and the same hardening as the workers.
    res = c["resources"]
    assert {"cpu", "memory"} <= set(res["requests"])
    assert "memory" in res["limits"]
    fold = deployments["agent-memory-worker-fold"]
    assert pod["securityContext"] == fold["spec"]["template"]["spec"]["securityContext"]
    assert c["securityContext"] == container(fold)["securityContext"]
    assert pod["automountServiceAccountToken"] is False
    assert pod["terminationGracePeriodSeconds"] >= 10


def test_k8s_lifecycle_queue_is_served() -> None:
    """The lifecycle tasks ride memory.fold: a worker Deployment consumes it."""
    served = {
        q
        for name, d in by_kind("Deployment").items()
        if name.startswith("agent-memory-worker-")
        for q in cli_params(argv(container(d))[1:])["queues"].split(",")
    }
    assert LIFECYCLE_QUEUE in served


def test_retention_is_documented_and_off_by_default() -> None:
    """MEMORY_RETENTION_DAYS: unset in the ConfigMap (keep forever), its example commented
    out there, and that example is a valid setting."""
    configmap, secret = config_and_secret()
    assert "MEMORY_RETENTION_DAYS" not in configmap and "MEMORY_RETENTION_DAYS" not in secret
    text = (DEPLOY / "configmap.yaml").read_text()
    (line,) = [ln for ln in text.splitlines() if ln.strip().startswith("# MEMORY_RETENTION_DAYS:")]
    example = yaml.safe_load(line.strip()[1:])
    assert settings_from(example).memory_retention_days == float(example["MEMORY_RETENTION_DAYS"])
    assert Settings.model_fields["memory_retention_days"].default is None


def test_migrate_job() -> None:
    job = one("Job")
    c = container(job)
    assert argv(c) == ["agent-memory", "migrate"]
    assert cli_params(argv(c)[1:]) == {"revision": "head"}
    assert job["spec"]["backoffLimit"] >= 1
    assert job["spec"]["template"]["spec"]["restartPolicy"] in {"Never", "OnFailure"}
    assert job["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


def test_flower_deployment_and_service() -> None:
    dep = by_kind("Deployment")["agent-memory-flower"]
    c = container(dep)
    cmd = argv(c)
    assert cmd[0] == "agent-memory"
    params = cli_params(cmd[1:])
    assert (params["address"], params["port"]) == ("0.0.0.0", 5555)
    assert params["basic_auth"] is None  # from FLOWER_BASIC_AUTH, not the command line

    secret = one("Secret")
    env = {e["name"]: e for e in c["env"]}
    ref = env["FLOWER_BASIC_AUTH"]["valueFrom"]["secretKeyRef"]
    assert ref["name"] == secret["metadata"]["name"]
    assert ":" in secret["stringData"][ref["key"]]  # user:password

    # Queue lengths from the RabbitmqCluster's management API, logged in to with the broker
    # URL's credentials (none in the API URL: nothing secret outside the Secret).
    api = env["FLOWER_BROKER_API"]["value"]
    api_url = urlsplit(api)
    assert api_url.username is None and api_url.password is None
    assert api_url.hostname == rabbitmq_service_host()
    assert api_url.port == MANAGEMENT_PORT
    broker = assert_amqp_url(secret["stringData"]["CELERY_BROKER_URL"])
    url, user, password = flower_queue_request(broker.geturl(), api)
    assert url == f"http://{rabbitmq_service_host()}:{MANAGEMENT_PORT}/api/queues/{broker.path[1:]}"
    assert (user, password) == (unquote(broker.username or ""), unquote(broker.password or ""))

    (port,) = c["ports"]
    assert port["containerPort"] == 5555
    annotations = dep["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert annotations["prometheus.io/port"] == "5555"
    assert annotations["prometheus.io/path"] == "/metrics"
    assert c["readinessProbe"]["httpGet"]["path"] == "/healthcheck"

    svc = by_kind("Service")["agent-memory-flower"]
    (svc_port,) = svc["spec"]["ports"]
    assert svc_port["port"] == 5555
    assert svc_port["targetPort"] in {port["name"], 5555}
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert svc["spec"]["selector"].items() <= labels.items()
    assert svc["spec"].get("type", "ClusterIP") == "ClusterIP"


def test_workloads_reference_existing_config() -> None:
    configmap, secret = one("ConfigMap"), one("Secret")
    for _, d in MANIFESTS:
        if d["kind"] not in {"Deployment", "Job"}:
            continue
        c = container(d)
        refs = {
            (k, v["name"])
            for src in c["envFrom"]
            for k, v in src.items()
            if k in {"configMapRef", "secretRef"}
        }
        assert refs == {
            ("configMapRef", configmap["metadata"]["name"]),
            ("secretRef", secret["metadata"]["name"]),
        }, d["metadata"]["name"]


def rabbitmq_service_host() -> str:
    """The RabbitmqCluster's client Service, as the operator names it (and writes it into the
    Secret <name>-default-user as `host`)."""
    meta = one("RabbitmqCluster")["metadata"]
    return f"{meta['name']}.{meta['namespace']}.svc"


def test_rabbitmq_cluster() -> None:
    cluster = one("RabbitmqCluster")
    assert cluster["apiVersion"] == "rabbitmq.com/v1beta1"
    spec = cluster["spec"]
    assert spec["replicas"] == 3  # quorum queues: a majority survives one node down
    assert rabbitmq_image_version(spec["image"]) >= MIN_RABBITMQ
    res = spec["resources"]
    assert {"cpu", "memory"} <= set(res["requests"])
    # The operator sizes RabbitMQ's memory budget from the limit; it wants request = limit.
    assert res["limits"]["memory"] == res["requests"]["memory"]
    assert re.fullmatch(r"\d+Gi", spec["persistence"]["storage"])
    assert int(spec["persistence"]["storage"][:-2]) >= 5  # the operator's 2 GB disk floor

    # The vhost of the broker URL is the one the cluster creates for its default user.
    conf = dict(
        (k.strip(), v.strip())
        for k, _, v in (
            ln.partition("=")
            for ln in spec["rabbitmq"]["additionalConfig"].splitlines()
            if ln.strip() and not ln.strip().startswith("#")
        )
    )
    broker = assert_amqp_url(one("Secret")["stringData"]["CELERY_BROKER_URL"])
    assert conf["default_vhost"] == unquote(broker.path[1:])
    assert broker.hostname == rabbitmq_service_host()

    # The pod-template fragment the operator merges into its StatefulSet: a valid pod spec
    # (strict: a misspelt field fails) that meets the namespace's `restricted` standard.
    pod_spec = spec["override"]["statefulSet"]["spec"]["template"]["spec"]
    as_pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "override"},
        "spec": {**pod_spec, "affinity": spec["affinity"]},
    }
    kubernetes_validate.validate(as_pod, K8S_VERSION, strict=True)
    assert pod_spec["securityContext"]["runAsNonRoot"] is True
    assert pod_spec["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    containers = {c["name"]: c for c in pod_spec["containers"] + pod_spec["initContainers"]}
    assert set(containers) == {"rabbitmq", "setup-container"}  # the operator's names
    for c in containers.values():
        assert c["securityContext"]["allowPrivilegeEscalation"] is False
        assert c["securityContext"]["capabilities"]["drop"] == ["ALL"]
    (ns,) = by_kind("Namespace").values()
    assert ns["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"

    # Voluntary disruptions (drains) take one node at a time, selected by the label the
    # operator puts on its pods (app.kubernetes.io/name = the cluster's name).
    pdb = by_kind("PodDisruptionBudget")[cluster["metadata"]["name"]]
    assert pdb["spec"]["maxUnavailable"] == 1
    own_pods = {"app.kubernetes.io/name": cluster["metadata"]["name"]}
    assert pdb["spec"]["selector"] == {"matchLabels": own_pods}
    (term,) = spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["labelSelector"] == {"matchLabels": own_pods}


def test_broker_settings_are_rabbitmq() -> None:
    configmap, secret = config_and_secret()
    assert "CELERY_BROKER_URL" not in configmap  # it carries credentials
    assert_amqp_url(secret["CELERY_BROKER_URL"])
    assert urlsplit(secret["REDIS_URL"]).scheme in {"redis", "rediss"}
    assert not REDIS_BROKER_ONLY & set(configmap)


def test_keda_scaled_objects() -> None:
    scaled = by_kind("ScaledObject")
    deployments = by_kind("Deployment")
    secret = one("Secret")
    # KEDA's rabbitmq scaler takes the AMQP URL (user, password, vhost) from `host`: the
    # workers' own broker URL, from the Secret they read it from.
    auth = one("TriggerAuthentication")
    assert auth["apiVersion"] == "keda.sh/v1alpha1"
    (ref,) = auth["spec"]["secretTargetRef"]
    assert ref == {
        "parameter": "host",
        "name": secret["metadata"]["name"],
        "key": "CELERY_BROKER_URL",
    }
    broker = assert_amqp_url(secret["stringData"][ref["key"]])
    assert broker.hostname == rabbitmq_service_host()

    assert len(scaled) == len(WORKER_QUEUES)
    for short, queue in WORKER_QUEUES.items():
        target = f"agent-memory-worker-{short}"
        (so,) = [s for s in scaled.values() if s["spec"]["scaleTargetRef"]["name"] == target]
        assert so["apiVersion"] == "keda.sh/v1alpha1"
        assert target in deployments
        spec = so["spec"]
        assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
        (trigger,) = spec["triggers"]
        assert trigger["type"] == "rabbitmq"
        assert trigger["authenticationRef"] == {"name": auth["metadata"]["name"]}
        meta = trigger["metadata"]
        # KEDA metadata values are strings.
        assert all(isinstance(v, str) for v in meta.values())
        assert meta["protocol"] == "amqp"  # AMQP URL in `host`; http would need the API's
        assert meta["queueName"] == queue
        assert meta["mode"] == "QueueLength"
        assert int(meta["value"]) >= 1
        # The connection (and its credentials) only from the TriggerAuthentication.
        assert not {"host", "hostFromEnv", "vhostName"} & set(meta)


def test_k8s_env_names_are_settings() -> None:
    configmap, secret = config_and_secret()
    check_env_names(set(configmap), "deploy/configmap.yaml")
    check_env_names(set(secret), "deploy/secret.yaml")
    for _, d in MANIFESTS:
        if d["kind"] in {"Deployment", "Job"}:
            names = {e["name"] for e in container(d).get("env", [])}
            check_env_names(names, f"deploy {d['kind']}/{d['metadata']['name']}")
    assert set(secret) >= SECRET_NAMES
    assert not SECRET_NAMES & set(configmap)
    # The values (placeholders included) are valid settings.
    s = settings_from({**configmap, **secret})
    assert s.memory_worker_soft_shutdown_s == float(configmap["MEMORY_WORKER_SOFT_SHUTDOWN_S"])


def test_every_non_setting_env_name_is_used(compose: dict[str, Any]) -> None:
    """The exceptions list does not rot: each name is still used somewhere."""
    configmap, secret = config_and_secret()
    used = set(configmap) | set(secret)
    for _, d in MANIFESTS:
        if d["kind"] in {"Deployment", "Job"}:
            used |= {e["name"] for e in container(d).get("env", [])}
    for svc in app_services(compose).values():
        used |= set(svc["environment"])
    assert set(NOT_SETTINGS) <= used
