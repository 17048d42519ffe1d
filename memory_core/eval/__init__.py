"""`agent-memory eval fidelity`: do standing instructions survive folding, and do replaced ones go?

corpus.py (the model of a scenario, its facts), filler.py (the turns between instructions and
the SQL every turn runs), scenarios_a..h.py (the twenty-four scripted analytics conversations
the instruction detector is tuned on), scenarios_i.py and scenarios_j.py (six held-out ones
that nobody tunes against), scoring.py (probes over a rendered view), runner.py (plays the corpus
through a real worker and scores the views after the last fold), report.py (the rows and the
tuning, held-out and overall aggregates).
"""

from __future__ import annotations

from functools import lru_cache

from memory_core.eval.corpus import Conversation, Fact
from memory_core.eval.filler import Script
from memory_core.eval.scenarios_a import SCENARIOS as _A
from memory_core.eval.scenarios_b import SCENARIOS as _B
from memory_core.eval.scenarios_c import SCENARIOS as _C
from memory_core.eval.scenarios_d import SCENARIOS as _D
from memory_core.eval.scenarios_e import SCENARIOS as _E
from memory_core.eval.scenarios_f import SCENARIOS as _F
from memory_core.eval.scenarios_g import SCENARIOS as _G
from memory_core.eval.scenarios_h import SCENARIOS as _H
from memory_core.eval.scenarios_i import SCENARIOS as _I
from memory_core.eval.scenarios_j import SCENARIOS as _J

# The tuning set (a..d shortest first, then e..f and g..h, each shortest first: `--limit 2` is
# the quickest smoke run), then the held-out set (i..j) shortest first.
SCENARIOS = _A + _B + _C + _D + _E + _F + _G + _H + _I + _J

__all__ = ["SCENARIOS", "Conversation", "Fact", "corpus"]


@lru_cache(maxsize=1)
def corpus() -> tuple[Conversation, ...]:
    """The built conversations, in SCENARIOS order (the same on every call and machine)."""
    return tuple(Script(s).build() for s in SCENARIOS)
