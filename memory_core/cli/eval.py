"""`agent-memory eval fidelity`: do standing instructions survive folding?

Plays the scripted analytics conversations of memory_core/eval/conversations/ (or of a folder
given with `--conversations`, in the same format) through a real worker (the demo's services
and worker) and scores the `brief` and `sql` views after the last fold: per conversation, then
for the tuning set, the held-out set and overall. Progress goes to stderr; the table,
`--markdown` or `--json` to stdout. The figures are the result: exit 0 whenever the
eval ran, 1 with one line on stderr when a step failed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from memory_core.cli.errors import fail, stops_what_it_started

eval_app = typer.Typer(help="Evaluations of what memory keeps.", no_args_is_help=True)


def _one_line(exc: BaseException) -> str:
    line = (str(exc).strip().splitlines() or [""])[0]
    from memory_core.cli.demo import DemoError

    return line if isinstance(exc, DemoError) else f"{type(exc).__name__}: {line}"


@eval_app.command("schema")
def schema_cmd() -> None:
    """Print the JSON Schema of a conversation file (memory_core/eval/conversations/schema.json).

    For an editor that checks YAML against a schema while a conversation is written; the eval
    validates every file against the same models when it loads them.
    """
    from memory_core.eval.files import schema_text

    typer.echo(schema_text(), nl=False)


@eval_app.command("fidelity")
@stops_what_it_started
def fidelity_cmd(
    limit: Annotated[
        int | None,
        typer.Option(
            min=1,
            help="Only the first N conversations (the tuning set, rounds 1 to 3, each "
            "shortest first; then the held-out set).",
        ),
    ] = None,
    conversations: Annotated[
        Path | None,
        typer.Option(
            "--conversations",
            file_okay=False,
            exists=True,
            help="A folder of conversation files (NN-<name>.yaml, the format of "
            "memory_core/eval/conversations/) to play instead of the shipped corpus.",
        ),
    ] = None,
    declared: Annotated[
        bool,
        typer.Option(
            "--declared",
            help="Agents that declare: every turn sends the instructions it applies as "
            "standing_instructions (the default: agents that send nothing, memory detects).",
        ),
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="The report as JSON on stdout.")] = False,
    markdown: Annotated[
        bool, typer.Option("--markdown", help="The table as Markdown, for docs/BENCHMARKS.md.")
    ] = False,
) -> None:
    """Play scripted analytics conversations through a real worker and score the views.

    Which standing instructions reach the brief and sql views after the last fold, and which
    replaced ones wrongly remain current; the stored summary against its bound. Aggregates for
    the tuning set, the held-out set (never tuned against) and overall.
    """
    from rich.console import Console

    from memory_core.eval import CorpusError, corpus
    from memory_core.eval.runner import run_fidelity

    if as_json and markdown:
        fail("choose one of --json and --markdown")
    try:
        played = corpus(conversations.resolve() if conversations else None, declared)[:limit]
    except CorpusError as exc:
        fail(f"eval corpus: {exc}")
    progress = Console(stderr=True, highlight=False)
    try:
        data_dir = Path.cwd() / ".agent-memory" / "eval"
        report = run_fidelity(progress, data_dir, played, declared=declared)
    except KeyboardInterrupt:
        fail("eval interrupted")
    except Exception as exc:
        fail(f"eval failed: {_one_line(exc)}")
    _print_report(report, as_json=as_json, markdown=markdown)


def _print_report(report: dict[str, Any], *, as_json: bool, markdown: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    from memory_core.eval.report import COLUMNS, headline, table_rows
    from memory_core.eval.report import markdown as as_markdown

    if as_json:
        typer.echo(json.dumps(report, indent=2))
        return
    if markdown:
        typer.echo(as_markdown(report), nl=False)
        return
    table = Table(*COLUMNS, title="Context fidelity after the last fold")
    for row in table_rows(report):
        table.add_row(*row)
    out = Console(highlight=False)
    if not out.is_terminal:  # a pipe or a file: room for every column
        out.width = max(out.width, 170)
    out.print(headline(report), markup=False)
    out.print(table)
