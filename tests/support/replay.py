"""Replaying a hypothesis state machine's steps, as hypothesis prints a falsifying example.

`RuleBasedStateMachine` takes no `@example`: a sequence that once found a defect is pinned as
a replay instead. `replay` calls the named rules in order on a fresh machine and checks every
invariant before the first step and after each one, then tears the machine down, as
hypothesis's own run does. A rule that draws from `st.data()` is given a `Drawn`.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

from hypothesis.stateful import RuleBasedStateMachine

# The attributes hypothesis's @rule and @invariant set on a method (hypothesis.stateful).
_RULE = "hypothesis_stateful_rule"
_INVARIANT = "hypothesis_stateful_invariant"

Step = tuple[str, dict[str, Any]]


def step(rule: str, **arguments: Any) -> Step:
    return rule, arguments


class Drawn:
    """What a rule's `data.draw(...)` returns, in order: a replay's fixed choices."""

    def __init__(self, *values: Any) -> None:
        self.values = list(values)

    def draw(self, strategy: Any, label: Any = None) -> Any:
        return self.values.pop(0)


def replay(machine: RuleBasedStateMachine, steps: Sequence[Step]) -> None:
    cls = type(machine)
    invariants = [
        getattr(machine, name)
        for name, method in inspect.getmembers(cls, inspect.isfunction)
        if getattr(method, _INVARIANT, None) is not None
    ]
    # Were hypothesis to rename its marker, the replay would check nothing: refuse instead.
    assert invariants, f"{cls.__name__}: no invariants found"
    try:
        for check in invariants:
            check()
        for name, arguments in steps:
            assert getattr(getattr(cls, name, None), _RULE, None) is not None, (
                f"{cls.__name__}.{name} is not a rule"
            )
            getattr(machine, name)(**arguments)
            for check in invariants:
                check()
    finally:
        machine.teardown()
