"""`agent-memory eval fidelity`: do standing instructions survive folding, and do replaced ones go?

conversations/ (the thirty scripted analytics conversations, one YAML file each: twenty-four
the instruction detector is tuned on, in three rounds, then six held-out ones that nobody tunes
against; conversations/README.md says how they were written), files.py (loads and validates
them against their schema), corpus.py (the model of a scenario, its facts), filler.py (the turns
between instructions and the SQL every turn runs), scoring.py (probes over a rendered view),
runner.py (plays the corpus through a real worker and scores the views after the last fold),
report.py (the rows and the tuning, held-out and overall aggregates).
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

from memory_core.eval.corpus import Conversation, Fact, Scenario
from memory_core.eval.files import CONVERSATIONS, CorpusError, load
from memory_core.eval.filler import Script

__all__ = ["SCENARIOS", "Conversation", "CorpusError", "Fact", "corpus", "scenarios"]


@lru_cache(maxsize=4)
def scenarios(folder: Path | None = None) -> tuple[Scenario, ...]:
    """The conversation files of `folder` (default: the shipped corpus), validated, in the
    files' order: the tuning set by round, each shortest first (`--limit 2` is the quickest
    smoke run), then the held-out set, shortest first. A broken file raises
    `CorpusError`, one line naming the file and the field."""
    return load(folder or CONVERSATIONS)


@lru_cache(maxsize=4)
def corpus(folder: Path | None = None, declared: bool = False) -> tuple[Conversation, ...]:
    """The built conversations, in the files' order (the same on every call and machine).
    `declared`: the agent declares every instruction it applies (filler.py `declarations`)."""
    return tuple(Script(s, declared=declared).build() for s in scenarios(folder))


def __getattr__(name: str) -> Any:
    # SCENARIOS is loaded on first use, not at import: a broken file then fails the command
    # that reads the corpus, with its one-line error, not every import of the package.
    if name == "SCENARIOS":
        return scenarios()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
