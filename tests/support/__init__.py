"""Helpers shared by tests (imported explicitly, never from conftest)."""
