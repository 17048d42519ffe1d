"""Runnable examples built on agent memory (not shipped in the wheel)."""
