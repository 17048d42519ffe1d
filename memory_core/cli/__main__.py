"""`python -m memory_core.cli`: the same as `agent-memory`."""

from memory_core.cli import main

main()
