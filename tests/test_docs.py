"""Docs that match the code: every setting is documented where operators look for it."""

from __future__ import annotations

import re

import pytest

from memory_core.settings import Settings
from tests.support import REPO

SETTINGS = sorted(name.upper() for name in Settings.model_fields)


def _readme_table_names() -> set[str]:
    """The names in the first cell of every README table row (a row may name several)."""
    names: set[str] = set()
    for line in (REPO / "README.md").read_text().splitlines():
        if line.startswith("| `"):
            names.update(re.findall(r"`([A-Z][A-Z0-9_]+)`", line.split(" | ")[0]))
    return names


@pytest.mark.parametrize("env", SETTINGS)
def test_every_setting_has_its_row_in_the_readme_and_its_place_in_architecture(env: str) -> None:
    architecture = (REPO / "docs" / "ARCHITECTURE.md").read_text()
    assert env in _readme_table_names(), f"README's settings table has no row for {env}"
    assert f"`{env}`" in architecture, f"docs/ARCHITECTURE.md does not name {env}"
