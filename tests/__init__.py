"""The test suite: real Postgres, Redis and Celery workers (docs/ARCHITECTURE.md, "Layout")."""
