"""What the bad-input scenario's files share (tests/reliability/test_bad_input*.py): whether a
rejection names its field, JSON nested to a given depth, and the 1 MiB of the payload limit."""

from __future__ import annotations

import re
from typing import Any

MIB = 1024 * 1024


def names_field(field: str, reason: str) -> bool:
    """Whether a rejection's reason names `field` ("snapshot": the payload is not an object)."""
    if field == "snapshot":
        return "snapshot" in reason and ("JSON object" in reason or "dictionary" in reason)
    return re.search(rf"(?:: |; ){re.escape(field)}(?:[.:\[]|$)", reason) is not None


def nested(depth: int) -> Any:
    """`1` inside `depth` lists: JSON nested `depth` levels deep."""
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value
