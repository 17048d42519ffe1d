"""The write path: a finished turn becomes a durable row, then the working copy.

- `snapshot.py`: `TurnSnapshot`, what an agent hands over, validated before anything is written.
- `artifacts.py`: what a turn built (SQL, charts, dashboards), derived once at finalize.
- `session_handler.py`: the finalize core (`save_session_to_thread_safe`), shared by in-process
  agents and the `memory.finalize_turn` worker task; its docstring gives the order of effects.
- `claim.py`: the one upsert that creates the thread or bumps its seq under its row lock, sent
  as a single prebuilt statement (memory_core/io/fast_write.py).
- `enqueue.py`: handing the turn to a worker instead (`enqueue_turn`, `aenqueue_turn`).
"""
