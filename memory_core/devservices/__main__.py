"""`python -m memory_core.devservices`: find or start PostgreSQL and Redis, print exports."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from memory_core.devservices import DevServicesError, ensure_services, stop_private
from memory_core.devservices.redis_cluster import start_redis_cluster


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
        help="also start a private Redis Cluster (3 primaries, 3 replicas, loopback only)",
    )
    args = parser.parse_args(argv)
    if args.stop:
        stop_private(args.data_dir)
        return 0
    settings = get_settings()
    try:
        services = ensure_services(
            settings.database_url, settings.redis_url, args.data_dir, database_name=args.database
        )
    except DevServicesError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for line in services.started + services.notes:
        print(f"# {line}", file=sys.stderr)
    if args.redis_cluster:
        try:
            cluster = start_redis_cluster(args.data_dir.resolve())
        except DevServicesError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        # Not exported: REDIS_URL takes a cluster's seed list once the clients speak the
        # cluster protocol (the work of issue 32 that follows); until then it is for tests.
        print(f"# {cluster.note}\n# its seed list: {cluster.url}", file=sys.stderr)
    print(f"export DATABASE_URL={shlex.quote(services.database_url)}")
    for name in ("REDIS_URL", "CELERY_BROKER_URL"):
        print(f"export {name}={shlex.quote(services.redis_url)}")
    return 0


sys.exit(main())
