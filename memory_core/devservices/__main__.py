"""`python -m memory_core.devservices`: find or start PostgreSQL and Redis (and on request a
Redis Cluster and a RabbitMQ cluster), print exports."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from urllib.parse import urlsplit

from memory_core.devservices import DevServicesError, ensure_services, stop_private
from memory_core.devservices.rabbitmq_cluster import start_rabbitmq_cluster
from memory_core.devservices.redis_cluster import cluster_reachable, start_redis_cluster
from memory_core.io.redis_kinds import is_cluster_url


def main(argv: list[str] | None = None) -> int:
    from memory_core.settings import get_settings

    parser = argparse.ArgumentParser(
        prog="python -m memory_core.devservices",
        description="Find or start PostgreSQL and Redis for development and tests.",
    )
    parser.add_argument("--data-dir", type=Path, default=Path(".agent-memory/dev-services"))
    parser.add_argument("--database", help="database name (default: the one in DATABASE_URL)")
    parser.add_argument("--stop", action="store_true", help="stop private servers and exit")
    parser.add_argument(
        "--redis-cluster",
        action="store_true",
        help="REDIS_URL: a private Redis Cluster (3 primaries, 3 replicas, loopback only); "
        "CELERY_BROKER_URL stays on one Redis server",
    )
    parser.add_argument(
        "--rabbitmq-cluster",
        action="store_true",
        help="CELERY_BROKER_URL: a private 3-node RabbitMQ cluster (loopback only), as "
        "Celery's failover list",
    )
    args = parser.parse_args(argv)
    if args.stop:
        stop_private(args.data_dir)
        return 0
    settings = get_settings()
    # A cluster REDIS_URL holds the copies; Celery's Redis transport needs one server still.
    wants_cluster = args.redis_cluster or is_cluster_url(settings.redis_url)
    single = settings.celery_broker_url if wants_cluster else settings.redis_url
    if urlsplit(single).scheme not in ("redis", "rediss", "unix"):
        single = "redis://127.0.0.1:6379/0"
    try:
        services = ensure_services(
            settings.database_url, single, args.data_dir, database_name=args.database
        )
        redis_url = broker_url = services.redis_url
        if wants_cluster:
            redis_url = _cluster(settings.redis_url, args.data_dir)
        if args.rabbitmq_cluster:
            rabbit = start_rabbitmq_cluster(args.data_dir.resolve())
            print(f"# {rabbit.note}", file=sys.stderr)
            broker_url = rabbit.failover_url
    except DevServicesError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for line in services.started + services.notes:
        print(f"# {line}", file=sys.stderr)
    print(f"export DATABASE_URL={shlex.quote(services.database_url)}")
    print(f"export REDIS_URL={shlex.quote(redis_url)}")
    print(f"export CELERY_BROKER_URL={shlex.quote(broker_url)}")
    return 0


def _cluster(redis_url: str, data_dir: Path) -> str:
    """The Redis Cluster REDIS_URL names if it answers, else a private one's seed list."""
    if is_cluster_url(redis_url) and cluster_reachable(redis_url):
        print(f"# Redis Cluster answers at {redis_url.rpartition('@')[2]}", file=sys.stderr)
        return redis_url
    cluster = start_redis_cluster(data_dir.resolve())
    print(f"# {cluster.note}\n# its seed list: {cluster.url}", file=sys.stderr)
    return cluster.url


sys.exit(main())
