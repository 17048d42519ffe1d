"""The lower bound of a first read: what any `get_context` hit must pay, whoever writes it.

A hit returns a `ConversationContext`: with 40 turns of three artifacts each, 161 model
objects, their UUIDs and datetimes. `materialize` builds exactly those objects from the same
JSON with the least work Python allows: pydantic-core's JSON decoder (the fastest we ship),
then the objects' state set directly, with no validation, no defaults, no copies. It is not
safe for input (it trusts every byte) and is not used by the product; it exists to show, in
the same run as the figure, how much of the first read is the price of the objects themselves
rather than of our code (docs/BENCHMARKS.md, "Where the time goes").
"""

from __future__ import annotations

from datetime import datetime
from typing import Any
from uuid import UUID

from pydantic import BaseModel
from pydantic_core import from_json

from memory_core.copy.context import ConversationContext, Exchange
from memory_core.write.artifacts import DashboardArtifact, SqlArtifact, VisualizationArtifact

_KINDS: dict[str, type[BaseModel]] = {
    "sql": SqlArtifact,
    "visualization": VisualizationArtifact,
    "dashboard": DashboardArtifact,
}
_new = object.__new__
_set = object.__setattr__


def _bare(cls: type[BaseModel], state: dict[str, Any]) -> Any:
    """A model instance holding `state` as is: what `model_construct` does, minus its loop
    over the fields (the state below is always complete)."""
    obj = _new(cls)
    _set(obj, "__dict__", state)
    _set(obj, "__pydantic_fields_set__", set(state))
    _set(obj, "__pydantic_extra__", None)
    _set(obj, "__pydantic_private__", None)
    return obj


def materialize(doc: bytes) -> ConversationContext:
    """The context a copy's JSON document holds, built without validation (see above)."""
    raw = from_json(doc)
    recent = []
    for turn in raw["recent"]:
        turn["session_id"] = UUID(turn["session_id"])
        turn["completed_at"] = datetime.fromisoformat(turn["completed_at"])
        turn["artifacts"] = [_bare(_KINDS[a["kind"]], a) for a in turn["artifacts"]]
        recent.append(_bare(Exchange, turn))
    raw["recent"] = recent
    raw["thread_id"] = UUID(raw["thread_id"])
    raw["missing_session_ids"] = [UUID(s) for s in raw.get("missing_session_ids", ())]
    return _bare(ConversationContext, raw)
