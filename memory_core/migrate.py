"""Schema migrations: `agent-memory migrate` and the test suite both go through here."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from alembic import command
from alembic.config import Config

# `migrations/` in a checkout, shipped in the wheel as `memory_core.migrations` (pyproject.toml).
MIGRATIONS_DIR = Path(str(files("memory_core.migrations")))


def alembic_config(database_url: str | None = None) -> Config:
    cfg = Config(str(MIGRATIONS_DIR / "alembic.ini"))
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    if database_url:
        # ConfigParser interpolation treats % specially (URL-encoded passwords).
        cfg.set_main_option("sqlalchemy.url", database_url.replace("%", "%%"))
    return cfg


def upgrade(database_url: str | None = None, revision: str = "head") -> None:
    command.upgrade(alembic_config(database_url), revision)


def downgrade(database_url: str | None = None, revision: str = "base") -> None:
    command.downgrade(alembic_config(database_url), revision)
