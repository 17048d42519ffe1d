"""Helpers shared by tests (imported explicitly, never from conftest); fixtures are in
tests/fixtures/."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
