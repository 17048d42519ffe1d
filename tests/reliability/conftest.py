"""The reliability suite runs on a stack of its own (tests/fixtures/reliability.py)."""

from tests.fixtures.reliability import fresh_stack, stack

__all__ = ["fresh_stack", "stack"]
