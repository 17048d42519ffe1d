"""The fidelity report: one dict per conversation, the aggregate rows, and its table forms.

Three aggregates (`AGGREGATES`): the tuning set (the conversations the instruction detector
was tuned on, so optimistic), the held-out set (never tuned against) and overall (all of them).
Pure functions over plain data: the runner builds the per-conversation dicts, the command
prints `table_rows` (a rich table), `markdown` (docs) or the whole report as JSON.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from memory_core.copy.views import Focus
from memory_core.eval.corpus import Conversation
from memory_core.eval.scoring import ViewScore, probe_matches

FOCI: tuple[Focus, ...] = ("brief", "sql")
AGGREGATES = (("tuning", "tuning"), ("holdout", "held-out"), ("overall", "overall"))  # key, label
COLUMNS = (
    "conversation",
    "turns",
    "folds",
    "established",
    "kept brief",
    "kept sql",
    "kept both",
    "in summary text",
    "superseded",
    "current brief",
    "current sql",
    "per-question",
    "false standing",
    "summary tokens / bound",
)


def conversation_row(
    conv: Conversation,
    scores: Mapping[Focus, ViewScore],
    summary_text: str,
    **measured: Any,
) -> dict[str, Any]:
    """One conversation's figures; `measured` holds what the run observed (thread_id, folds,
    last_seq, summary_tokens, summary_bound, ...)."""
    established = [f.id for f in conv.established]
    brief, sql = scores["brief"], scores["sql"]
    both = [i for i in established if i in brief.kept and i in sql.kept]
    in_text = [f.id for f in conv.established if probe_matches(f.probe, summary_text)]
    return {
        "name": conv.name,
        "holdout": conv.holdout,
        "turns": len(conv.turns),
        **measured,
        "established": len(established),
        "kept": {"brief": len(brief.kept), "sql": len(sql.kept), "both": len(both)},
        "kept_in_summary_text": len(in_text),
        "not_in_summary_text": [i for i in established if i not in in_text],
        "superseded": len(conv.superseded),
        "wrongly_current": {"brief": len(brief.current), "sql": len(sql.current)},
        "missed": {"brief": brief.missed, "sql": sql.missed},
        "current": {"brief": brief.current, "sql": sql.current},
        "round": conv.round,
        "per_question": len(conv.per_question),
        # in either view: a choice the brief or the sql view presents as standing
        "false_standing": sorted(set(brief.false_standing) | set(sql.false_standing)),
    }


def _pct(part: int, whole: int) -> float:
    return round(100.0 * part / whole, 1) if whole else 0.0


def overall(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    established = sum(r["established"] for r in rows)
    superseded = sum(r["superseded"] for r in rows)
    kept = {k: sum(r["kept"][k] for r in rows) for k in (*FOCI, "both")}
    current = {k: sum(r["wrongly_current"][k] for r in rows) for k in FOCI}
    return {
        "conversations": len(rows),
        "turns": sum(r["turns"] for r in rows),
        "folds": sum(r["folds"] for r in rows),
        "fold_failures": sum(r["fold_failures"] for r in rows),
        "established": established,
        "kept": kept,
        "kept_pct": {k: _pct(v, established) for k, v in kept.items()},
        "kept_in_summary_text": sum(r["kept_in_summary_text"] for r in rows),
        "superseded": superseded,
        "wrongly_current": current,
        "wrongly_current_pct": {k: _pct(v, superseded) for k, v in current.items()},
        "per_question": (per_question := sum(r["per_question"] for r in rows)),
        "false_standing": (false := sum(len(r["false_standing"]) for r in rows)),
        "false_standing_pct": _pct(false, per_question),
        "max_summary_tokens": max((r["summary_tokens"] for r in rows), default=0),
        "all_summaries_within_bound": all(r["summary_tokens"] <= r["summary_bound"] for r in rows),
        "all_reached_last_turn": all(r["last_seq"] == r["turns"] for r in rows),
    }


def aggregates(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The report's aggregate entries: `tuning`, `holdout` and `overall` (every row), and
    `rounds`: each round of writing on its own (held-out rounds stay apart)."""
    rounds = sorted({r["round"] for r in rows})
    return {
        "tuning": overall([r for r in rows if not r["holdout"]]),
        "holdout": overall([r for r in rows if r["holdout"]]),
        "overall": overall(rows),
        "rounds": {str(n): overall([r for r in rows if r["round"] == n]) for n in rounds},
    }


def _cell(part: int, whole: int, digits: int = 0) -> str:
    return f"{part}/{whole} ({_pct(part, whole):.{digits}f}%)" if whole else "-"


def _conversation_cells(r: dict[str, Any]) -> list[str]:
    est, sup = r["established"], r["superseded"]
    return [
        r["name"],
        str(r["turns"]),
        str(r["folds"]),
        str(est),
        *(_cell(r["kept"][k], est) for k in (*FOCI, "both")),
        _cell(r["kept_in_summary_text"], est),
        str(sup),
        *(_cell(r["wrongly_current"][k], sup) for k in FOCI),
        str(r["per_question"]),
        _cell(len(r["false_standing"]), r["per_question"]),
        f"{r['summary_tokens']} / {r['summary_bound']}",
    ]


def _aggregate_cells(label: str, o: dict[str, Any], bound: int) -> list[str]:
    est, sup = o["established"], o["superseded"]
    return [
        f"{label} ({o['conversations']})",
        str(o["turns"]),
        str(o["folds"]),
        str(est),
        *(_cell(o["kept"][k], est, 1) for k in (*FOCI, "both")),
        _cell(o["kept_in_summary_text"], est, 1),
        str(sup),
        *(_cell(o["wrongly_current"][k], sup, 1) for k in FOCI),
        str(o["per_question"]),
        _cell(o["false_standing"], o["per_question"], 1),
        f"max {o['max_summary_tokens']} / {bound}",
    ]


def aggregate_rows(report: dict[str, Any]) -> list[list[str]]:
    """The aggregate rows: each round when the run had more than one, tuning and held-out
    when it had any of them, overall always."""
    bound = report["summary_bound"]
    rounds = report.get("rounds", {})
    rows = [_aggregate_cells(f"round {n}", o, bound) for n, o in rounds.items()]
    rows = rows if len(rounds) > 1 else []
    return rows + [
        _aggregate_cells(label, report[key], bound)
        for key, label in AGGREGATES
        if key == "overall" or report.get(key, {}).get("conversations")
    ]


def table_rows(report: dict[str, Any]) -> list[list[str]]:
    """The table's rows: one per conversation, then the aggregate rows (overall last)."""
    return [_conversation_cells(r) for r in report["conversations"]] + aggregate_rows(report)


def headline(report: dict[str, Any]) -> str:
    prompts = ", ".join(report["summary_prompts"]) or "none"
    said = report.get("instructions", "detected")
    return (
        f"instructions: {said}; "
        f"summaries: {report['summaries']} (summary_prompt: {prompts}); views brief and sql at "
        f"{report['view_max_tokens']} tokens; stored summary bound {report['summary_bound']} "
        f"tokens (MEMORY_SUMMARY_MAX_TOKENS={report['summary_max_tokens']})"
    )


def markdown(report: dict[str, Any]) -> str:
    lines = [
        headline(report),
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "|".join("---" if i == 0 else "--:" for i in range(len(COLUMNS))) + "|",
    ]
    for row in map(_conversation_cells, report["conversations"]):
        lines.append("| " + " | ".join(row) + " |")
    for row in aggregate_rows(report):
        lines.append("| " + " | ".join(f"**{c}**" for c in row) + " |")
    return "\n".join(lines) + "\n"
