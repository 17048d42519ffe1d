"""Standing instructions carried across an LLM fold by code, not trusted to the model.

After the LLM writes a new summary, the instructions in force are computed without it: those of the
previous summary's `Standing instructions:` section plus those the folded turns set
(memory_core/instructions/detect.py), newest wording per key winning. Every one of them must be in
the new summary's instructions section, under the same key or in other words (its content words in
the section's lines): the next fold reads instructions back from that section only, so one the model
mentioned only in prose would be lost a fold later. What code knows wins over the model's words,
both ways (standing.InForce): a line that still says what the folded turns superseded (in their
words or its own), or that contradicts an instruction in force, is taken out, and what it displaced
is put back. Both are counted (`memory_fold_instructions_total{action}`, fields of the
`memory_summarized` event).

When anything changed, the section is rebuilt at the top and the rest follows, cut to the
summary's bound at line ends: restored instructions survive the bound whatever order the model
answered in, and no line is cut in half.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from memory_core.copy.context import Exchange
from memory_core.fold.llm_free import INSTRUCTIONS_HEADER, standing_after
from memory_core.fold.summary_tail import fit_lines
from memory_core.instructions.declared import parse_line
from memory_core.instructions.detect import content_words, key_of
from memory_core.instructions.in_force import InForce, same_matter
from memory_core.tokens import count_tokens

# Share of an instruction's content words that must appear in the section's lines for it to
# count as kept in other words.
_PARAPHRASE_SHARE = 0.8
_ITEM = re.compile(r"^\s*(?:[-*\u2022]|\d+[.)])\s+")


@dataclass(frozen=True)
class CarriedForward:
    text: str
    restored: int = 0  # instructions the model dropped, put back
    superseded_dropped: int = 0  # superseded or contradicting lines the model wrote, removed


def _is_header(line: str) -> bool:
    return line.strip().casefold().lstrip("#* ").rstrip("* ") == INSTRUCTIONS_HEADER.casefold()


def _section_lines(lines: list[str]) -> tuple[set[int], list[int]]:
    """(indexes of the instructions headers, indexes of their item lines): every section the
    model wrote, blank lines between items allowed, as parse_sections reads them back."""
    headers: set[int] = set()
    items: list[int] = []
    inside = False
    for i, line in enumerate(lines):
        if _is_header(line):
            headers.add(i)
            inside = True
        elif inside and _ITEM.match(line):
            items.append(i)
        elif line.strip():
            inside = False
    return headers, items


def carry_forward(
    previous_summary: str | None,
    exchanges: Sequence[Exchange],
    new_text: str,
    max_tokens: int | None = None,
) -> CarriedForward:
    """`new_text` with every standing instruction in force, none that was superseded, and
    (when it had to change) at most `max_tokens` tokens."""
    expected, replaced = standing_after(previous_summary, exchanges)
    in_force = InForce(expected, replaced)
    declared = {t for t in expected if parse_line(t)}
    lines = new_text.splitlines()
    headers, item_idx = _section_lines(lines)
    section = set(item_idx)
    removed = {
        i
        for i, line in enumerate(lines)
        if i not in headers
        and _removes(in_force, declared, _ITEM.sub("", line).strip(), i in section)
    }
    kept = [lines[i] for i in item_idx if i not in removed]
    listed = [(key_of(text), text) for i in kept if (text := _ITEM.sub("", i).strip())]
    # Only the section counts: the next fold reads instructions back from it, not from prose.
    words = {w for i in kept for w in content_words(i)}
    missing = [
        t
        for t in expected
        if not _listed(t, listed) and _overlap(content_words(t), words) < _PARAPHRASE_SHARE
    ]
    over = max_tokens is not None and count_tokens(new_text) > max_tokens
    if not missing and not removed and not over:
        return CarriedForward(new_text)
    rest = [line for i, line in enumerate(lines) if i not in headers | section | removed]
    items = [*kept, *(f"- {t}" for t in missing)]
    rebuilt = [INSTRUCTIONS_HEADER, *items] if items else []
    while rest and not rest[0].strip():
        rest.pop(0)
    if rest:
        rebuilt += ["", *rest] if rebuilt else rest
    return CarriedForward(fit_lines(rebuilt, max_tokens), len(missing), len(removed))


def _removes(in_force: InForce, declared: set[str], text: str, in_section: bool) -> bool:
    """Must the model's line go? A declared line is kept verbatim or not at all: one that is
    not exactly a declaration in force (stale, reworded, forged) goes, wherever it stands."""
    if parse_line(text):
        return text not in declared
    return in_force.removes(text, in_section)


def _listed(instruction: str, listed: list[tuple[str, str]]) -> bool:
    """Is `instruction` in the section under its key, in words that say the same thing? A line
    under the same key on another matter ("weeks start on Sunday" for "use fiscal quarters
    that start in April": both `calendar`) does not keep it. A declared line only verbatim."""
    if parse_line(instruction):
        return any(text == instruction for _, text in listed)
    key = key_of(instruction)
    return any(k == key and same_matter(text, instruction) for k, text in listed)


def _overlap(a: set[str], b: set[str]) -> float:
    return len(a & b) / len(a) if a else 0.0
