"""Node-scoped views of a ConversationContext under a token budget.

`render_conversation_context(ctx, focus, max_tokens)` is pure and deterministic. The output is
built from parts that each start with a non-space character and end with a newline; tiktoken's
pre-tokenizer never merges text across such a boundary, so the token count of the output is
exactly the sum of the parts' counts (the property tests check this against a full count).
That lets the budget be enforced exactly without re-tokenizing the whole output.

Oldest exchanges are dropped first; the summary always survives. It is cut (with a visible
marker) when it alone exceeds the budget, or when keeping it whole would leave no room for the
newest exchange; it then still keeps at least half the budget. The newest exchange is always
in the view (from NEWEST_ALWAYS_FROM tokens up): when it alone is over what is left it is cut
to fit (`fit_exchange`), its SQL first. A view that leaves exchanges out says how many.

Nothing a user wrote can pose as a line of the view's structure: a line at column 0 is one of
the view's own (`Conversation summary:`, `Recent exchanges (oldest first):`, `[#n] User: ...`,
`Assistant: ...`, an artifact line), and user text follows such a prefix flattened to one line,
or is indented (the summary, verbatim SQL).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal

from memory_core.copy.context import ConversationContext, Exchange
from memory_core.instructions.declared import apply_recent
from memory_core.tokens import count_tokens, truncate_to_tokens
from memory_core.write.artifacts import Artifact, SqlArtifact, StandingArtifact, indent_block

Focus = Literal["brief", "sql", "visualizations"]
FOCUSES: tuple[Focus, ...] = ("brief", "sql", "visualizations")
DEFAULT_MAX_TOKENS = 2000
# From this budget up the newest exchange is always in the view (cut to fit when it alone is
# over): the summary keeps at most half, and the exchange's first line, cut, needs ~25 tokens.
NEWEST_ALWAYS_FROM = 80
SUMMARY_HEADER = "Conversation summary:\n"
TRUNCATED_MARKER = " [...summary truncated]\n"
# Gist lengths, in characters, per focus: (user query, answer).
_GIST = {"brief": (300, 200), "sql": (1000, 300), "visualizations": (1000, 300)}


def _gist(text: str, limit: int) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def render_exchange(turn: Exchange, focus: Focus) -> str:
    q_limit, a_limit = _GIST[focus]
    lines = [f"[#{turn.seq}] User: {_gist(turn.user_query, q_limit)}"]
    if turn.answer.strip():
        lines.append(f"Assistant: {_gist(turn.answer, a_limit)}")
    lines.extend(render_exchange_artifact(art, focus) for art in turn.artifacts)
    return "\n".join(lines) + "\n\n"


def render_exchange_artifact(art: Artifact, focus: Focus) -> str:
    """An artifact as `focus` shows it: expanded when it is what the node works on (declared
    instructions are one line in every view: their wording is in the summary's section)."""
    if isinstance(art, StandingArtifact):
        return art.one_line()
    sql = isinstance(art, SqlArtifact)
    expand = (focus == "sql" and sql) or (focus == "visualizations" and not sql)
    return art.expanded() if expand else art.one_line()


def _summary_part(summary: str, budget: int) -> str:
    indented = indent_block(summary.strip("\n").rstrip())
    body = SUMMARY_HEADER + indented + "\n\n"
    if count_tokens(body) <= budget:
        return body
    fixed = count_tokens(SUMMARY_HEADER) + count_tokens(TRUNCATED_MARKER) + 2
    keep = truncate_to_tokens(indented, budget - fixed).rstrip()
    while keep:
        part = SUMMARY_HEADER + keep + TRUNCATED_MARKER
        if count_tokens(part) <= budget:
            return part
        keep = truncate_to_tokens(keep, max(count_tokens(keep) - 1, 0)).rstrip()
    part = SUMMARY_HEADER.rstrip("\n") + TRUNCATED_MARKER
    return part if count_tokens(part) <= budget else ""


RECENT_HEADER = "Recent exchanges (oldest first):\n"
SQL_CUT_MARKER = "[...SQL truncated]"
QUERY_CUT_MARKER = " [...exchange truncated]"


def _omitted_note(recent: Sequence[Exchange], kept: int = 1) -> str:
    """The line that says how many exchanges the view leaves out ("" when none)."""
    omitted = len(recent) - kept
    if omitted <= 0:
        return ""
    return f"({omitted} older exchanges omitted)\n" if kept else f"({omitted} exchanges omitted)\n"


def _longest(make: Callable[[int], str], size: int, budget: int) -> str:
    """`make(n)` for the largest n in 0..size whose output fits `budget` tokens ("" if none).
    `make` cuts a text to n tokens, so its cost grows with n: a binary search finds it."""
    lo, hi, best = 0, size, ""
    while lo <= hi:
        mid = (lo + hi) // 2
        out = make(mid)
        if count_tokens(out) <= budget:
            best, lo = out, mid + 1
        else:
            hi = mid - 1
    return best


def _block(lines: list[str]) -> str:
    return "\n".join(lines) + "\n\n"


def _cut_sql(sql: str, n: int) -> str:
    keep = truncate_to_tokens(sql, n).rstrip()
    body = indent_block(keep) + "\n" if keep.strip() else ""
    return f"SQL:\n{body}{SQL_CUT_MARKER}"


def _with_sql_cut(before: list[str], sql: str, after: list[str], budget: int) -> str:
    return _longest(
        lambda n: _block([*before, _cut_sql(sql, n), *after]), count_tokens(sql), budget
    )


def fit_exchange(turn: Exchange, focus: Focus, budget: int) -> str:
    """`render_exchange`, cut to `budget` tokens: in a `sql` view its statements first (the
    earlier ones first: the last is the one the answer came from), each cut with a marker;
    then its other artifacts; then its answer and query. "" only when not even the first
    line fits."""
    full = render_exchange(turn, focus)
    if count_tokens(full) <= budget:
        return full
    q_limit, a_limit = _GIST[focus]
    head = [f"[#{turn.seq}] User: {_gist(turn.user_query, q_limit)}"]
    if turn.answer.strip():
        head.append(f"Assistant: {_gist(turn.answer, a_limit)}")
    arts = [render_exchange_artifact(art, focus) for art in turn.artifacts]
    for i, art in enumerate(turn.artifacts):
        if focus == "sql" and isinstance(art, SqlArtifact):
            cut = _with_sql_cut(head + arts[:i], art.sql, arts[i + 1 :], budget)
            if cut:
                return cut
            arts[i] = _cut_sql(art.sql, 0)
    for keep in range(len(turn.artifacts) - 1, -1, -1):  # artifacts one line each, then fewer
        out = _block(head + [a.one_line() for a in turn.artifacts[:keep]])
        if count_tokens(out) <= budget:
            return out
    query = " ".join(turn.user_query.split())
    return _longest(
        lambda n: (
            f"[#{turn.seq}] User: {truncate_to_tokens(query, n).rstrip()}{QUERY_CUT_MARKER}\n\n"
        ),
        count_tokens(query),
        budget,
    )


def _recent_parts(recent: Sequence[Exchange], focus: Focus, budget: int) -> list[str]:
    """The newest exchanges that fit `budget` (the newest always, cut when it alone is over),
    oldest first behind their header, and the line that counts the ones left out."""
    if not recent:
        return []
    header_cost = count_tokens(RECENT_HEADER)
    blocks: list[str] = []
    used = header_cost
    for turn in reversed(recent):
        block = render_exchange(turn, focus)
        cost = count_tokens(block)
        if used + cost + count_tokens(_omitted_note(recent, len(blocks) + 1)) > budget:
            break
        blocks.append(block)
        used += cost
    if not blocks:
        room = budget - header_cost - count_tokens(_omitted_note(recent))
        newest = fit_exchange(recent[-1], focus, room) if room > 0 else ""
        if not newest:
            note = _omitted_note(recent, 0)
            return [note] if count_tokens(note) <= budget else []
        blocks = [newest]
    note = _omitted_note(recent, len(blocks))
    return ([note] if note else []) + [RECENT_HEADER, *reversed(blocks)]


def render_conversation_context(
    ctx: ConversationContext, focus: Focus, max_tokens: int = DEFAULT_MAX_TOKENS
) -> str:
    """Render the view a node needs, never longer than `max_tokens` tokens."""
    if focus not in FOCUSES:
        raise ValueError(f"focus must be one of {', '.join(FOCUSES)}, not {focus!r}")
    if max_tokens < 0:
        raise ValueError("max_tokens must not be negative")
    parts: list[str] = []
    used = 0
    text = apply_recent(ctx.summary, ctx.recent)  # declared after the last fold: newest wins
    if text and text.strip():
        summary = _summary_part(text, max_tokens)
        cost = count_tokens(summary) if summary else 0
        if ctx.recent and cost:
            # Room for the newest exchange, unless that would leave the summary less than
            # half the budget.
            newest = RECENT_HEADER + render_exchange(ctx.recent[-1], focus)
            room = max_tokens - count_tokens(newest) - count_tokens(_omitted_note(ctx.recent))
            cap = max(room, min(cost, max_tokens // 2))
            if cap < cost:
                summary = _summary_part(text, cap)
                cost = count_tokens(summary) if summary else 0
        parts.append(summary)
        used = cost
    parts.extend(_recent_parts(ctx.recent, focus, max_tokens - used))
    return "".join(parts)
