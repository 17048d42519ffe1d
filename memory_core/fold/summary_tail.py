"""The stored summary: the summarizer's text plus a verbatim artifact tail, and its bound.

After each fold, code (not the LLM) appends the artifact lines of the last
`ARTIFACT_TAIL_TURNS` folded turns: SQL verbatim (indented, like every multi-line user text),
descriptors one-lined. SQL can be long (20 statements of 50 000 characters per turn), so the
tail has a budget: `MEMORY_SUMMARY_MAX_TOKENS // 2` tokens, newest lines first, a statement
that does not fit is cut with `[... SQL truncated]`.

The bound of a stored summary is therefore `stored_summary_bound(S)` = S + S // 2 + the marker line,
with S = `MEMORY_SUMMARY_MAX_TOKENS` (a longer LLM text is a failed fold; the LLM-free text stays
under min(S, 500)). With the default S = 1 500 that is at most 2 268 tokens; views additionally keep
room for the newest exchange (memory_core/copy/views.py).
"""

from __future__ import annotations

from collections.abc import Sequence

from memory_core.copy.context import Exchange
from memory_core.tokens import count_tokens, truncate_to_tokens
from memory_core.write.artifacts import StandingArtifact

ARTIFACT_TAIL_MARKER = "\n\n[Artifacts of the latest folded turns, verbatim]\n"
ARTIFACT_TAIL_TURNS = 3
CUT_MARKER = " [... SQL truncated]"
# A line cut shorter than this is not worth keeping.
_MIN_CUT_TOKENS = 16
_MARKER_TOKENS = count_tokens(ARTIFACT_TAIL_MARKER)


CUT_LINE_MARKER = " [...]"


def fit_lines(lines: list[str], max_tokens: int | None) -> str:
    """`lines` joined, within `max_tokens`: the lines that do not fit go from the end, whole,
    and so does a header or blank line left dangling at the end. Only a first line that alone
    is over the bound is cut, at a word, and says so."""
    text = "\n".join(lines).strip("\n")
    if max_tokens is None or count_tokens(text) <= max_tokens:
        return text
    kept: list[str] = []
    used = 0
    for line in lines:
        cost = count_tokens(line) + 1  # + the line break joining it
        if used + cost > max_tokens:
            break
        kept.append(line)
        used += cost
    # A count of a join can differ from the sum of its parts at the seams.
    while kept and count_tokens("\n".join(kept)) > max_tokens:
        kept.pop()
    while kept and (not kept[-1].strip() or kept[-1].rstrip().endswith(":")):
        kept.pop()
    if kept:
        return "\n".join(kept).strip("\n")
    first = next((line for line in lines if line.strip()), "")
    room = max(max_tokens - count_tokens(CUT_LINE_MARKER), 0)
    cut = truncate_to_tokens(first, room)
    return cut.rsplit(" ", 1)[0].rstrip() + CUT_LINE_MARKER if " " in cut else cut


def tail_budget(summary_max_tokens: int) -> int:
    return summary_max_tokens // 2


def stored_summary_bound(summary_max_tokens: int) -> int:
    """The most tokens a stored summary (text + artifact tail) can have."""
    return summary_max_tokens + tail_budget(summary_max_tokens) + _MARKER_TOKENS + 2


def strip_artifact_tail(summary: str | None) -> str | None:
    """The summarizer-written part of a stored summary (the code-appended tail is re-derived)."""
    if summary is None:
        return None
    return summary.split(ARTIFACT_TAIL_MARKER, 1)[0]


def _declares(turn: Exchange) -> bool:
    return any(isinstance(a, StandingArtifact) and a.items for a in turn.artifacts)


def artifact_tail(turns: Sequence[Exchange], budget: int) -> str:
    """Artifact lines of the last folded turns within `budget` tokens, newest kept first. A
    turn whose agent declared standing instructions starts the tail: what came before it ran
    under the rules it may have changed (the declarations are in the summary's section)."""
    last = list(turns[-ARTIFACT_TAIL_TURNS:])
    starts = [i for i, t in enumerate(last) if _declares(t)]
    lines: list[str] = []
    for turn in last[starts[-1] if starts else 0 :]:
        for art in turn.artifacts:
            if art.kind == "standing":
                continue
            text = art.expanded() if art.kind == "sql" else art.one_line()
            lines.append(f"[#{turn.seq}] {text}")
    kept: list[str] = []
    used = _MARKER_TOKENS
    for line in reversed(lines):
        cost = count_tokens(line) + 1  # + the line break joining it
        if used + cost <= budget:
            kept.append(line)
            used += cost
            continue
        room = budget - used - 1 - count_tokens(CUT_MARKER)
        if room >= _MIN_CUT_TOKENS:
            kept.append(truncate_to_tokens(line, room).rstrip() + CUT_MARKER)
        break
    return ARTIFACT_TAIL_MARKER + "\n".join(reversed(kept)) if kept else ""


def with_tail(text: str, turns: Sequence[Exchange], summary_max_tokens: int) -> str:
    """The summary to store: `text` and as much of the artifact tail as the bound allows."""
    bound = stored_summary_bound(summary_max_tokens)
    budget = min(tail_budget(summary_max_tokens), bound - count_tokens(text) - 2)
    stored = text + artifact_tail(turns, budget)
    # Token counts of a concatenation can differ from the sum by one at the seam.
    return stored if count_tokens(stored) <= bound else text
