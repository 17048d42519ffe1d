"""The replay of pinned state-machine sequences checks what hypothesis's own run checks."""

from __future__ import annotations

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from tests.support.replay import Drawn, replay, step


class Counter(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.n, self.checked, self.torn_down = 0, 0, False

    @rule(by=st.integers(1, 3))
    def add(self, by: int) -> None:
        self.n += by

    @rule(data=st.data())
    def add_drawn(self, data: st.DataObject) -> None:
        self.n += data.draw(st.integers(1, 3))

    def not_a_rule(self) -> None:
        self.n = 0

    @invariant()
    def below_five(self) -> None:
        self.checked += 1
        assert self.n < 5, self.n

    def teardown(self) -> None:
        self.torn_down = True


def test_every_invariant_runs_before_and_after_each_step() -> None:
    machine = Counter()
    replay(machine, [step("add", by=1), step("add_drawn", data=Drawn(2))])
    assert (machine.n, machine.checked, machine.torn_down) == (3, 3, True)


def test_a_step_that_breaks_an_invariant_fails_the_replay_and_tears_down() -> None:
    machine = Counter()
    with pytest.raises(AssertionError, match="5"):
        replay(machine, [step("add", by=3), step("add", by=2), step("add", by=1)])
    assert machine.n == 5 and machine.torn_down


def test_only_rules_can_be_replayed() -> None:
    with pytest.raises(AssertionError, match="not_a_rule is not a rule"):
        replay(Counter(), [step("not_a_rule")])
