"""Alembic: one head, up -> down -> up, and no drift between models and migrations."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, inspect

import memory_core.models  # noqa: F401
from memory_core.io.db import Base
from memory_core.migrate import alembic_config, downgrade, upgrade
from memory_core.settings import get_settings


def test_single_head() -> None:
    assert len(ScriptDirectory.from_config(alembic_config()).get_heads()) == 1


def test_revision_files_are_named_by_date() -> None:
    import re

    for script in ScriptDirectory.from_config(alembic_config()).walk_revisions():
        assert re.match(r"^\d{4}_\d{2}_\d{2}_\d{4}-", script.path.rsplit("/", 1)[-1])


def test_upgrade_downgrade_upgrade_and_no_drift(scratch_db: str) -> None:
    engine = create_engine(scratch_db)
    upgrade(scratch_db)
    assert {"conversation_threads", "thread_messages"} <= set(inspect(engine).get_table_names())
    downgrade(scratch_db)
    assert set(inspect(engine).get_table_names()) <= {"alembic_version"}
    upgrade(scratch_db)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
    assert diff == []
    engine.dispose()


def test_fixed_columns_exist() -> None:
    insp = inspect(create_engine(get_settings().database_url))
    threads = {c["name"] for c in insp.get_columns("conversation_threads")}
    messages = {c["name"] for c in insp.get_columns("thread_messages")}
    assert {
        "id",
        "owner_id",
        "agent_type",
        "title",
        "summary",
        "summary_through_seq",
        "is_archived",
    } <= threads
    assert {"thread_id", "session_id", "seq", "artifacts", "response_payload"} <= messages
    uniques = {tuple(u["column_names"]) for u in insp.get_unique_constraints("thread_messages")}
    assert ("session_id",) in uniques and ("thread_id", "seq") in uniques
