"""`Record`: the base of the values memory hands out (`ConversationContext`, `Exchange`, the
artifacts).

They are msgspec Structs, immutable and typed, for two reasons (issue 35):

- **Decoding.** A working copy's document goes from JSON bytes to typed objects in C, in one
  pass that checks every field's type (a 40-turn context in ~60 µs, against ~190 µs for the
  pydantic models they were).
- **The garbage collector.** `gc=False`: the collector does not track them, so a service
  holding the contexts of many agents does not make every full collection walk ~690 objects
  per context (docs/OPERATIONS.md, "Garbage-collector pauses"). Such a Struct must never take
  part in a reference cycle; records only hold strings, numbers, ids, times, lists and other
  records.

Agents used them as pydantic models; the methods they called keep their names and meaning:
`model_dump(mode="python" | "json")`, `model_dump_json(indent=None)`, `model_validate(obj)`,
`model_validate_json(data)`, `model_copy(update=None)`. A value that does not fit raises
`msgspec.ValidationError` (a `ValueError`) naming the field's path.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from functools import lru_cache
from typing import Any, Literal, Self

import msgspec

_KEEP = (uuid.UUID, datetime)  # what pydantic's python mode leaves as is


@lru_cache(maxsize=32)  # one per record class: a handful
def _decoder(cls: type[Record]) -> msgspec.json.Decoder[Any]:
    return msgspec.json.Decoder(cls)


_ENCODER = msgspec.json.Encoder()
_PLAIN = msgspec.json.Decoder()


class Record(msgspec.Struct, frozen=True, gc=False, kw_only=True):
    """An immutable, typed value with pydantic's method names (see the module docstring)."""

    def model_dump(self, *, mode: Literal["python", "json"] = "python") -> dict[str, Any]:
        """Its fields as a dict, records within as dicts; `json`: what its JSON decodes to
        (ids and times as strings, tuples as lists)."""
        if mode == "json":
            out: dict[str, Any] = _PLAIN.decode(_ENCODER.encode(self))
            return out
        out = msgspec.to_builtins(self, builtin_types=_KEEP)
        return out

    def model_dump_json(self, *, indent: int | None = None) -> str:
        raw = _ENCODER.encode(self)
        return (msgspec.json.format(raw, indent=indent) if indent else raw).decode()

    def model_copy(self, *, update: dict[str, Any] | None = None) -> Self:
        return msgspec.structs.replace(self, **(update or {}))

    @classmethod
    def model_validate(cls, obj: Any) -> Self:
        """From a dict as `model_dump` gives it (either mode), or an instance as it is."""
        if isinstance(obj, cls):
            return obj
        return msgspec.convert(obj, cls, strict=False)

    @classmethod
    def model_validate_json(cls, data: str | bytes) -> Self:
        return _decoder(cls).decode(data)


def as_tuples(record: Record, *fields: str) -> None:
    """Make `fields` tuples (for `__post_init__`): a tuple of strings, numbers or records is one
    the collector stops tracking at its first collection, where a list stays tracked."""
    for name in fields:
        value = getattr(record, name)
        if type(value) is not tuple:
            msgspec.structs.force_setattr(record, name, tuple(value))


def encode(value: Any) -> bytes:
    """`value` (records, lists of them) as JSON bytes."""
    return _ENCODER.encode(value)
