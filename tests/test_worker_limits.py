"""The worker's time limits and visibility timeout, as settings make them: production's values
by default, and the arithmetic that ties them together when a test or an operator sets them
small (tests/workers/test_exits.py holds a finalize past a 4 s soft limit)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from memory_core.settings import reset_settings_cache
from workers.app import finalize_limits, fold_limits, visibility_timeout_s

NAMES = (
    "MEMORY_FINALIZE_SOFT_LIMIT_S",
    "MEMORY_FOLD_BACKOFF_CAP_S",
    "MEMORY_FOLD_BACKOFF_BASE_S",
    "MEMORY_LLM_TIMEOUT_S",
    "MEMORY_VISIBILITY_TIMEOUT_S",
)


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    for name in NAMES:
        monkeypatch.delenv(name, raising=False)
    reset_settings_cache()
    yield monkeypatch
    monkeypatch.undo()
    reset_settings_cache()


def test_production_limits_by_default(env: pytest.MonkeyPatch) -> None:
    assert finalize_limits() == (30, 60)
    assert fold_limits() == (120, 150)  # the LLM timeout (60 s) + 60, hard 30 s later
    # The longest retry countdown (1 h) + the fold's hard limit + 5 min: ~68 minutes.
    assert visibility_timeout_s() == 3600 + 150 + 300


def test_limits_follow_the_settings(env: pytest.MonkeyPatch) -> None:
    env.setenv("MEMORY_FINALIZE_SOFT_LIMIT_S", "4")
    env.setenv("MEMORY_FOLD_BACKOFF_BASE_S", "5")
    env.setenv("MEMORY_FOLD_BACKOFF_CAP_S", "40")
    env.setenv("MEMORY_LLM_TIMEOUT_S", "10")
    reset_settings_cache()
    assert finalize_limits() == (4, 8)
    assert fold_limits() == (70, 100)
    # A waiting retry must never be redelivered as well: the timeout outlasts the longest one.
    assert visibility_timeout_s() == 40 + 100 + 300
    env.setenv("MEMORY_VISIBILITY_TIMEOUT_S", "900")
    reset_settings_cache()
    assert visibility_timeout_s() == 900
