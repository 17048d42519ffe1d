"""Stored text made safe for a terminal: what a user typed is shown, never obeyed.

A query may hold ESC sequences (an OSC 52 clipboard write, cursor moves, a title change), BEL,
backspaces or bidi overrides that reorder what an operator reads. Printed raw, the terminal
runs them. `terminal_safe` shows each such character as its `\\uXXXX` escape instead: C0 but
newline and tab, DEL, C1, the bidi embeddings, overrides and isolates, and the line and paragraph
separators. The escape is JSON's own, so JSON output stays valid JSON with the same strings.
"""

from __future__ import annotations

import re

_UNSAFE = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028-\u202e\u2066-\u2069]")


def terminal_safe(text: str) -> str:
    return _UNSAFE.sub(lambda m: f"\\u{ord(m.group()):04x}", text)
