"""`TurnSnapshot`: what an agent hands over at finalize, validated before anything is written.

Size limits (documented in the README; a violation names the field):

| field            | limit                                   |
|------------------|-----------------------------------------|
| owner_id         | 1..255 characters, not only whitespace   |
| user_query       | 1..8 000 characters                     |
| answer           | 100 000 characters                      |
| sql              | 20 statements, each 1..50 000 characters |
| visualizations   | 50 objects                              |
| dashboards       | 20 objects                              |
| response_payload | 1 MiB as JSON, nested at most 64 deep    |
| standing_instructions | 20 entries, one per subject, one line each:  |
|                  | subject 1..80 characters (no `():`), text 1..200 or null |
| the whole        | 4 Mi characters of text (strings, keys, numbers), checked first |

The whole-snapshot bound is checked before any other validation, in one pass that stops as
soon as the bound is passed: 50 visualizations with 1 MiB of `options` each (which memory
discards anyway) are refused in milliseconds, for in-process saves and jobs alike.

An owner id is an identity: one made of whitespace alone (`" "`, `"\t\u3000"`: Unicode's
whitespace, as `str.strip` knows it) would be shared by every caller whose id came out blank,
so it is refused like an empty one. Ids are compared exactly: `"alice "` is not `"alice"`.

No text anywhere may hold NUL characters or lone UTF-16 surrogates: Postgres cannot store
them, so they are rejected up front instead of failing half-way through a write.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    StrictInt,
    StrictStr,
    field_validator,
)

MAX_PAYLOAD_BYTES = 1024 * 1024
MAX_SNAPSHOT_CHARS = 4 * 1024 * 1024
# Deeper JSON would exhaust the recursion of the validators and encoders (a RecursionError
# escaped validation, so the job was neither rejected nor saved); real payloads nest < 20.
MAX_JSON_DEPTH = 64


def _check_text(value: str) -> str:
    if "\x00" in value:
        raise ValueError("must not contain NUL characters")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError("must be valid Unicode (no lone surrogates)") from exc
    return value


class SnapshotTooLarge(ValueError):
    """The snapshot as a whole is over `MAX_SNAPSHOT_CHARS`."""


def check_snapshot_size(value: Any, limit: int = MAX_SNAPSHOT_CHARS) -> None:
    """Refuse a snapshot whose text totals more than `limit` characters, cheaply.

    One iterative pass over the raw JSON-like value that stops as soon as the total passes
    the limit (so its cost is bounded by the limit) or the nesting passes `MAX_JSON_DEPTH`
    (left to the field validators, which name the field).
    """
    total = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        kind = type(item)  # exact types first: isinstance against the Mapping ABC is slow
        if kind is str:
            total += len(item) + 2
        elif kind is dict:
            total += _mapping(stack, item, depth)
        elif kind is list:
            if depth < MAX_JSON_DEPTH:
                stack.extend((v, depth + 1) for v in item)
        elif kind is int or kind is float or kind is bool or item is None:
            total += 8
        elif isinstance(item, str):
            total += len(item) + 2
        elif isinstance(item, Mapping):
            total += _mapping(stack, item, depth)
        elif isinstance(item, list | tuple):
            if depth < MAX_JSON_DEPTH:
                stack.extend((v, depth + 1) for v in item)
        else:
            total += 8
        if total > limit:
            raise SnapshotTooLarge(
                f"invalid turn snapshot: more than {limit} characters of text in all; "
                "the whole snapshot is bounded (README, input limits)"
            )


def _mapping(stack: list[tuple[Any, int]], item: Mapping[Any, Any], depth: int) -> int:
    """Push a mapping's values for `check_snapshot_size`; the size of its keys."""
    if depth >= MAX_JSON_DEPTH:
        return 0
    size = 0
    for k, v in item.items():
        size += len(k) + 3 if isinstance(k, str) else 8
        stack.append((v, depth + 1))
    return size


_INT64 = 2**63
_UNBOUNDED = MAX_PAYLOAD_BYTES + 1  # "may be over": the exact size decides


def _check_json(value: Any, depth: int = 0) -> int:
    """Walk a JSON-like value: every string (keys too) must be storable text, every number
    JSON (no NaN or Infinity), every object a dict with string keys. Returns an upper bound
    of its size as `json.dumps` writes it (ASCII escapes, `", "` and `": "` separators), so
    the exact size is only computed when the bound passes the limit: one walk, not two, for
    a payload of ordinary size (issue 35).

    Messages name what is wrong but never the keys or values: they are user content.
    """
    if depth > MAX_JSON_DEPTH:
        raise ValueError(f"nested more than {MAX_JSON_DEPTH} levels deep")
    if isinstance(value, str):
        return _text_size(value, f"a string at depth {depth}")
    if isinstance(value, dict):
        size = 2
        for k, v in value.items():
            if not isinstance(k, str):
                raise ValueError(f"object keys must be strings (at depth {depth})")
            size += _text_size(k, f"a key at depth {depth}") + 4 + _check_json(v, depth + 1)
        return size
    if isinstance(value, list | tuple):
        return 2 + sum(_check_json(v, depth + 1) + 2 for v in value)
    return _scalar_size(value, depth)


def _scalar_size(value: Any, depth: int) -> int:
    """A number, a bool or null: checked, and an upper bound of its size as JSON."""
    if value is None or isinstance(value, bool):
        return 5
    if isinstance(value, int):
        return 20 if -_INT64 <= value < _INT64 else _UNBOUNDED
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("not valid JSON: Out of range float values are not JSON compliant")
        return 24  # the longest repr of a finite float
    # A Mapping that is not a dict among them: json.dumps would raise TypeError past the
    # validators (found by the walk's merge: save_session_to_thread_safe raised it).
    raise ValueError(f"{type(value).__name__} at depth {depth} is not JSON")


def _text_size(text: str, where: str) -> int:
    """`_check_text`, naming where; an upper bound of the string's size as JSON."""
    try:
        _check_text(text)
    except ValueError as exc:
        raise ValueError(f"{where} {exc}") from None
    return (6 if text.isascii() else 12) * len(text) + 2  # \uXXXX; a surrogate pair


def _json_object(value: dict[str, Any]) -> dict[str, Any]:
    if _check_json(value) <= MAX_PAYLOAD_BYTES:
        return value
    try:
        size = len(json.dumps(value, allow_nan=False).encode("utf-8"))
    except ValueError as exc:  # e.g. an int of more digits than Python converts to text
        raise ValueError(f"not valid JSON: {exc}") from None
    if size > MAX_PAYLOAD_BYTES:
        raise ValueError(f"is {size} bytes as JSON; the limit is {MAX_PAYLOAD_BYTES}")
    return value


Text = Annotated[StrictStr, AfterValidator(_check_text)]


def is_blank(value: str) -> bool:
    """An id that names nobody: empty, or Unicode whitespace only."""
    return not value.strip()


def can_own(owner_id: object) -> bool:
    """Whether a snapshot could carry `owner_id`: text, not blank, no NUL, encodable. An id
    that cannot owns nothing: reads, deletes and forgets answer as for a stranger."""
    if not isinstance(owner_id, str) or is_blank(owner_id) or "\x00" in owner_id:
        return False
    try:
        owner_id.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _check_owner(value: str) -> str:
    if is_blank(value):
        raise ValueError("must not be blank (whitespace only)")
    return value


ObjectId = StrictInt | Annotated[StrictStr, Field(max_length=255), AfterValidator(_check_text)]


class _RedashObject(BaseModel):
    # Live Redash objects carry many more fields; memory keeps only what it describes.
    model_config = ConfigDict(extra="ignore", frozen=True)


class VisualizationIn(_RedashObject):
    id: ObjectId
    type: Annotated[Text, Field(min_length=1, max_length=100)]
    name: Annotated[Text, Field(max_length=1000)] = ""
    options: Annotated[dict[str, Any], AfterValidator(_json_object)] = Field(default_factory=dict)


class WidgetVisualizationIn(_RedashObject):
    # Only the id is derived into the dashboard's artifact; it was unchecked (a list or a
    # float crashed finalize, a NUL made Postgres refuse it: a retry loop).
    id: ObjectId | None = None


class WidgetIn(_RedashObject):
    visualization_id: ObjectId | None = None
    visualization: WidgetVisualizationIn | None = None


class DashboardIn(_RedashObject):
    id: ObjectId
    name: Annotated[Text, Field(max_length=1000)] = ""
    widgets: Annotated[list[WidgetIn], Field(max_length=500)] = Field(default_factory=list)


MAX_DECLARED = 20
SUBJECT_MAX_CHARS = 80
DECLARED_MAX_CHARS = 200
# Line breaks of every kind and other C0/C1 controls: a declared line stays one line.
_NOT_ONE_LINE = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def _one_line(value: str) -> str:
    if _NOT_ONE_LINE.search(value):
        raise ValueError("must be one line (no line breaks or control characters)")
    value = value.strip()
    if not value:
        raise ValueError("must not be blank")
    return value


def _subject(value: str) -> str:
    if any(c in value for c in "():"):
        raise ValueError("must not contain '(', ')' or ':'")
    return value


def subject_key(subject: str) -> str:
    """Subjects compare case-insensitively, runs of spaces as one."""
    return " ".join(subject.casefold().split())


class StandingInstructionIn(BaseModel):
    """A standing instruction the agent declares: the user set it for the rest of the thread.
    `text` null withdraws the subject."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    subject: Annotated[
        Text,
        Field(min_length=1, max_length=SUBJECT_MAX_CHARS),
        AfterValidator(_one_line),
        AfterValidator(_subject),
    ]
    text: (
        Annotated[
            Text, Field(min_length=1, max_length=DECLARED_MAX_CHARS), AfterValidator(_one_line)
        ]
        | None
    )


class TurnSnapshot(BaseModel):
    """One completed user-query -> answer turn, as handed over at finalize."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    session_id: UUID
    thread_id: UUID
    owner_id: Annotated[Text, Field(min_length=1, max_length=255), AfterValidator(_check_owner)]
    agent_type: Literal["chat", "copilot"]
    user_query: Annotated[Text, Field(min_length=1, max_length=8000)]
    answer: Annotated[Text, Field(max_length=100_000)] = ""
    sql: Annotated[
        list[Annotated[Text, Field(min_length=1, max_length=50_000)]], Field(max_length=20)
    ] = Field(default_factory=list)
    visualizations: Annotated[list[VisualizationIn], Field(max_length=50)] = Field(
        default_factory=list
    )
    dashboards: Annotated[list[DashboardIn], Field(max_length=20)] = Field(default_factory=list)
    response_payload: Annotated[dict[str, Any], AfterValidator(_json_object)] = Field(
        default_factory=dict
    )
    completed_at: AwareDatetime = Field(default_factory=lambda: datetime.now(UTC))
    # None: the agent declares nothing and memory detects instructions in the words; a list
    # (empty too): what the agent declares stands, verbatim, newest wording per subject.
    standing_instructions: (
        Annotated[list[StandingInstructionIn], Field(max_length=MAX_DECLARED)] | None
    ) = None

    @field_validator("session_id", "thread_id", mode="before")
    @classmethod
    def _uuid_text(cls, v: Any) -> Any:
        # Only canonical UUID strings (or UUID objects): no ints, bytes or braces.
        if isinstance(v, UUID):
            return v
        if not isinstance(v, str) or len(v) != 36:
            raise ValueError("must be a UUID string like 1b4e28ba-2fa1-11d2-883f-0016d3cca427")
        return v

    @field_validator("user_query")
    @classmethod
    def _not_blank(cls, v: str) -> str:
        if not v.strip():
            raise ValueError("must not be blank")
        return v

    @field_validator("standing_instructions")
    @classmethod
    def _one_per_subject(
        cls, v: list[StandingInstructionIn] | None
    ) -> list[StandingInstructionIn] | None:
        keys = [subject_key(d.subject) for d in v or []]
        if len(set(keys)) != len(keys):
            raise ValueError("names a subject more than once; one entry per subject")
        return v

    @field_validator("completed_at")
    @classmethod
    def _utc(cls, v: datetime) -> datetime:
        try:
            return v.astimezone(UTC)
        except OverflowError:  # e.g. 0001-01-01T00:00:00+01:00: no UTC equivalent
            raise ValueError("is out of range once converted to UTC") from None
