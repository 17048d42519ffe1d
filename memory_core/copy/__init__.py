"""The working copy: a thread's memory in Redis, what nodes read, and read-your-writes.

- `working_copy.py`: the Redis layout (summary cursor + unfolded turns under one hash tag) and
  the scripts that change it atomically.
- `cache_state.py`: the errors that degrade a read to Postgres and the copies to mend.
- `context.py` and `views.py`: `ConversationContext` and the node-scoped views of it under a
  token budget (`render_conversation_context`).
- `read_wait.py`: a read that waits for a given enqueued turn (`TurnNotReady`).
- `settings_check.py`: processes that disagree on the copy's settings notice each other.

The class that drives all of it, `RedisConversationMemory`, is `memory_core.conversation_memory`.
"""
