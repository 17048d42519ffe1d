"""The lower bound of a first read: what any `get_context` hit must pay, whoever writes it.

A hit returns a `ConversationContext` built from the copy's JSON. `materialize` does the least
any reader can do with the same bytes: decode them into plain dicts, lists and strings
(msgspec's untyped decoder, the fastest we ship), with no types, no checks and no objects of
our own. It is not used by the product; it shows, in the same run as the figure, how much of
the first read is the JSON itself rather than the typed records and our code
(docs/BENCHMARKS.md, "Where the time goes").
"""

from __future__ import annotations

from typing import Any

import msgspec

from memory_core.copy.context import ConversationContext

_UNTYPED = msgspec.json.Decoder()


def materialize(doc: bytes) -> Any:
    """The context a copy's JSON document holds, as plain Python values (see above)."""
    return _UNTYPED.decode(doc)


def holds(doc: bytes, ctx: ConversationContext) -> bool:
    """Does `doc` decode to `ctx` (the floor decodes the same context the hit returns)?"""
    return msgspec.convert(materialize(doc), ConversationContext) == ctx
