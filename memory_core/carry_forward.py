"""Standing instructions carried across an LLM fold by code, not trusted to the model.

After the LLM writes a new summary, the instructions in force are computed without it: those
of the previous summary's `Standing instructions:` section plus those the folded turns set
(instructions.py), newest wording per key winning. Every one of them must be in the new
summary's instructions section, under the same key or in other words (its content words in
the section's lines): the next fold reads instructions back from that section only, so one the
model mentioned only in prose would be lost a fold later. What the model dropped is put back
into its section (created at the top when the model wrote none); an instruction the folded
turns superseded but the model still lists as current is taken out. Both are counted
(`memory_fold_instructions_total{action}`, fields of the `memory_summarized` event).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from memory_core.context import Exchange
from memory_core.instructions import content_words, key_of
from memory_core.llm_free_fold import INSTRUCTIONS_HEADER, standing_after

# Share of an instruction's content words that must appear in the section's lines for it to
# count as kept in other words.
_PARAPHRASE_SHARE = 0.8
_NO_LONGER = re.compile(
    r"\b(?:previously|no longer|superseded|replaced|instead of|used to|formerly)\b", re.I
)
_ITEM = re.compile(r"^\s*(?:[-*\u2022]|\d+[.)])\s+")


@dataclass(frozen=True)
class CarriedForward:
    text: str
    restored: int = 0  # instructions the model dropped, put back
    superseded_dropped: int = 0  # superseded instructions the model kept as current, removed


def _section_span(lines: list[str]) -> tuple[int, int] | None:
    """[start, end) of the item lines under the instructions header, if the text has one."""
    header = INSTRUCTIONS_HEADER.casefold()
    for i, line in enumerate(lines):
        if line.strip().casefold().lstrip("#* ").rstrip("* ") == header:
            end = i + 1
            while end < len(lines) and _ITEM.match(lines[end]):
                end += 1
            return i + 1, end
    return None


def _overlap(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a) if a else 0.0


def _is_stale(line: str, current: dict[str, set[str]], old: list[set[str]]) -> bool:
    """Does an instruction line say what a superseded instruction said (and not that it no
    longer applies)? It shares its key with one in force but resembles an old wording more."""
    text = _ITEM.sub("", line).strip()
    if _NO_LONGER.search(text) or key_of(text) not in current:
        return False
    words = content_words(text)
    best_old = max((_overlap(words, o) for o in old), default=0.0)
    return best_old > _overlap(words, current[key_of(text)])


def carry_forward(
    previous_summary: str | None, exchanges: Sequence[Exchange], new_text: str
) -> CarriedForward:
    """`new_text` with every standing instruction in force, and none that was superseded."""
    expected, replaced = standing_after(previous_summary, exchanges)
    lines = new_text.splitlines()
    span = _section_span(lines)
    items = lines[span[0] : span[1]] if span else []
    current = {key_of(t): content_words(t) for t in expected}
    old = [content_words(t) for t in replaced]
    stale = [i for i in items if old and _is_stale(i, current, old)]
    kept_items = [i for i in items if i not in stale]
    listed = {key_of(_ITEM.sub("", i).strip()) for i in kept_items}
    # Only the section counts: the next fold reads instructions back from it, not from prose.
    words = {w for i in kept_items for w in content_words(i)}
    missing = [
        t
        for t in expected
        if key_of(t) not in listed and _overlap(content_words(t), words) < _PARAPHRASE_SHARE
    ]
    if not missing and not stale:
        return CarriedForward(new_text)
    section = kept_items + [f"- {t}" for t in missing]
    if span:
        out = lines[: span[0]] + section + lines[span[1] :]
        text = "\n".join(out)
    else:
        text = "\n".join([INSTRUCTIONS_HEADER, *section]) + "\n\n" + new_text.lstrip("\n")
    return CarriedForward(text, len(missing), len(stale))
