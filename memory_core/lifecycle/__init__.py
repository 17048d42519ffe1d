"""A thread's life after its turns: archive, delete, forget an owner, retention.

- `threads.py`: the public calls (`list_threads`, `archive_thread`, `delete_thread`,
  `forget_owner`, `apply_retention`), re-exported by `memory_core`.
- `purge.py`: the one path every deletion takes, a batch per transaction.
- `checkpoints.py`: the LangGraph checkpointer and forgetting a conversation's runs.
- `trace_purge.py` and `trace_sweep.py`: deleting a thread's Langfuse traces, then again until
  nothing more can come.
"""
