"""Node-scoped views of a ConversationContext under a token budget.

`render_conversation_context(ctx, focus, max_tokens)` is pure and deterministic. The output is
built from parts that each start with a non-space character and end with a newline; tiktoken's
pre-tokenizer never merges text across such a boundary, so the token count of the output is
exactly the sum of the parts' counts (the property tests check this against a full count).
That lets the budget be enforced exactly without re-tokenizing the whole output.

Oldest exchanges are dropped first; the summary always survives. It is cut (with a visible
marker) when it alone exceeds the budget, or when keeping it whole would leave no room for the
newest exchange; it then still keeps at least half the budget.

Nothing a user wrote can pose as a line of the view's structure: a line at column 0 is one of
the view's own (`Conversation summary:`, `Recent exchanges (oldest first):`, `[#n] User: ...`,
`Assistant: ...`, an artifact line), and user text follows such a prefix flattened to one line,
or is indented (the summary, verbatim SQL).
"""

from __future__ import annotations

from typing import Literal

from memory_core.artifacts import SqlArtifact, indent_block
from memory_core.context import ConversationContext, Exchange
from memory_core.tokens import count_tokens, truncate_to_tokens

Focus = Literal["brief", "sql", "visualizations"]
FOCUSES: tuple[Focus, ...] = ("brief", "sql", "visualizations")
DEFAULT_MAX_TOKENS = 2000
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
    for art in turn.artifacts:
        sql = isinstance(art, SqlArtifact)
        expand = (focus == "sql" and sql) or (focus == "visualizations" and not sql)
        lines.append(art.expanded() if expand else art.one_line())
    return "\n".join(lines) + "\n\n"


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
    header = "Recent exchanges (oldest first):\n"
    header_cost = count_tokens(header)
    if ctx.summary and ctx.summary.strip():
        summary = _summary_part(ctx.summary, max_tokens)
        cost = count_tokens(summary) if summary else 0
        if ctx.recent and cost:
            # Room for the newest exchange, unless that would leave the summary less than
            # half the budget.
            room = max_tokens - header_cost - count_tokens(render_exchange(ctx.recent[-1], focus))
            cap = max(room, min(cost, max_tokens // 2))
            if cap < cost:
                summary = _summary_part(ctx.summary, cap)
                cost = count_tokens(summary) if summary else 0
        parts.append(summary)
        used = cost
    kept: list[str] = []
    for turn in reversed(ctx.recent):
        block = render_exchange(turn, focus)
        cost = count_tokens(block)
        if used + header_cost + cost > max_tokens:
            break
        kept.append(block)
        used += cost
    if kept:
        omitted = len(ctx.recent) - len(kept)
        note = f"({omitted} older exchanges omitted)\n" if omitted else ""
        if note and used + header_cost + count_tokens(note) <= max_tokens:
            parts.append(note)
        parts.append(header)
        parts.extend(reversed(kept))
    return "".join(parts)
