"""Artifacts: what a turn built, derived once at finalize from the live objects.

Stored in `thread_messages.artifacts` and read back as-is everywhere downstream.
Visualization and dashboard artifacts are compact descriptors, never raw configs.

Every descriptor field (names, types, chart kinds, column names, string ids) is flattened to
one line and length-bounded when derived: names may come from dashboards other users wrote,
and a newline in one must not put a line of its own into a view or a fold prompt. Rendering
flattens again (rows stored before this rule) and quotes names as JSON strings.

Each artifact is a `Record` (memory_core/records.py) tagged by its `kind` ("sql",
"visualization", "dashboard", "standing"): JSON names it in that key, and `art.kind` reads it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar, Literal

import msgspec

from memory_core.records import Record, as_tuples, encode

NAME_MAX_CHARS = 200
LABEL_MAX_CHARS = 100  # types, chart kinds, column names
ID_MAX_CHARS = 255  # string ids: the input limit, so an id is never cut
COLUMNS_MAX = 50
# Line breaks of every kind (what str.splitlines() splits on) and other C0/C1 controls.
_BREAKS = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]+")


def one_line(text: str, limit: int) -> str:
    """`text` on one line (runs of breaks, controls and spaces become one space), bounded."""
    flat = " ".join(_BREAKS.sub(" ", text).split())
    return flat if len(flat) <= limit else flat[: limit - 3].rstrip() + "..."


def _quoted(text: str) -> str:
    return json.dumps(one_line(text, NAME_MAX_CHARS), ensure_ascii=False)


def _label(value: object) -> str:
    return one_line(str(value), LABEL_MAX_CHARS)


def _id(value: int | str | None) -> int | str | None:
    return value if value is None or isinstance(value, int) else one_line(value, ID_MAX_CHARS)


class SqlArtifact(Record, tag_field="kind", tag="sql", frozen=True, kw_only=True, gc=False):
    kind: ClassVar[Literal["sql"]] = "sql"
    sql: str

    def one_line(self) -> str:
        flat = " ".join(self.sql.split())
        return f"SQL: {flat[:117] + '...' if len(flat) > 120 else flat}"

    def expanded(self) -> str:
        """The statement verbatim, every line indented two spaces: SQL is multi-line user
        text, and indented it cannot pose as a line of the view around it."""
        return "SQL:\n" + indent_block(self.sql)


class VisualizationArtifact(
    Record, tag_field="kind", tag="visualization", frozen=True, kw_only=True, gc=False
):
    kind: ClassVar[Literal["visualization"]] = "visualization"
    id: int | str | None = None
    type: str
    name: str
    chart: str | None = None
    x: tuple[str, ...] = ()
    y: tuple[str, ...] = ()
    series: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # Inline checks: a decode calls this for every record, and as_tuples' loop cost a
        # third of a 40-turn copy's decode; a decoded record's are tuples already.
        if type(self.x) is not tuple or type(self.y) is not tuple or type(self.series) is not tuple:
            as_tuples(self, "x", "y", "series")

    def one_line(self) -> str:
        vtype, chart = _label(self.type).lower(), _label(self.chart) if self.chart else None
        kind = f"{vtype}/{chart}" if chart else vtype
        return f"Visualization #{_id(self.id)} {_quoted(self.name)} ({kind})"

    def expanded(self) -> str:
        lines = [
            f"Visualization #{_id(self.id)} {_quoted(self.name)}",
            f"  type: {_label(self.type)}",
        ]
        if self.chart:
            lines.append(f"  chart: {_label(self.chart)}")
        for label, cols in (("x", self.x), ("y", self.y), ("series", self.series)):
            if cols:
                lines.append(f"  {label}: {', '.join(_label(c) for c in cols)}")
        return "\n".join(lines)


class DashboardArtifact(
    Record, tag_field="kind", tag="dashboard", frozen=True, kw_only=True, gc=False
):
    kind: ClassVar[Literal["dashboard"]] = "dashboard"
    id: int | str | None = None
    name: str
    widget_count: int = 0
    visualization_ids: tuple[int | str, ...] = ()

    def __post_init__(self) -> None:
        if type(self.visualization_ids) is not tuple:
            as_tuples(self, "visualization_ids")

    def one_line(self) -> str:
        return f"Dashboard #{_id(self.id)} {_quoted(self.name)} ({self.widget_count} widgets)"

    def expanded(self) -> str:
        vids = ", ".join(f"#{_id(v)}" for v in self.visualization_ids) or "none"
        return (
            f"Dashboard #{_id(self.id)} {_quoted(self.name)}\n"
            f"  widgets: {self.widget_count}\n  visualizations: {vids}"
        )


class Declared(Record, frozen=True, kw_only=True, gc=False):
    """One standing instruction an agent declared: `text` None withdraws its subject."""

    subject: str
    text: str | None = None


class StandingArtifact(
    Record, tag_field="kind", tag="standing", frozen=True, kw_only=True, gc=False
):
    """The standing instructions an agent declared in a turn (`standing_instructions` of the
    snapshot), verbatim. Present, even empty, it says the agent declares: memory does not
    look for instructions in the turn's words (memory_core/instructions/declared.py)."""

    kind: ClassVar[Literal["standing"]] = "standing"
    items: tuple[Declared, ...] = ()

    def __post_init__(self) -> None:
        if type(self.items) is not tuple:
            as_tuples(self, "items")

    def one_line(self) -> str:
        # Subjects only: a view puts the declared wording in its summary's section.
        if not self.items:
            return "Standing instructions: none declared"
        named = (_quoted(d.subject) + ("" if d.text else " withdrawn") for d in self.items)
        return "Standing instructions declared: " + ", ".join(named)

    def expanded(self) -> str:
        return self.one_line()


Artifact = SqlArtifact | VisualizationArtifact | DashboardArtifact | StandingArtifact


def artifacts_json(artifacts: Sequence[Artifact]) -> str:
    """A turn's artifacts as the JSON `thread_messages.artifacts` stores."""
    return encode(artifacts).decode()


def artifacts_from(value: Any) -> tuple[Artifact, ...]:
    """A turn's artifacts from what a row holds (JSON decoded to lists and dicts), typed and
    checked field by field; artifacts as they are."""
    return msgspec.convert(value or (), tuple[Artifact, ...])


def indent_block(text: str, prefix: str = "  ") -> str:
    """Every line of `text` (split on every kind of line break) behind `prefix`."""
    return "\n".join(prefix + line for line in text.splitlines() or [""])


# Redash CHART columnMapping roles we keep; anything else (yError, size, ...) is dropped.
_ROLES = ("x", "y", "series")


def describe_visualization(viz: Mapping[str, Any]) -> VisualizationArtifact:
    """A compact descriptor of a Redash visualization: never its raw `options`."""
    options = viz.get("options") or {}
    mapping = options.get("columnMapping") or {}
    cols: dict[str, list[str]] = {role: [] for role in _ROLES}
    if isinstance(mapping, Mapping):
        for column, role in mapping.items():
            # Free-form JSON: a role may be a list. Columns are bounded like every label.
            if isinstance(role, str) and role in cols and len(cols[role]) < COLUMNS_MAX:
                cols[role].append(_label(column))
    vtype = _label(viz.get("type") or "UNKNOWN")
    chart = options.get("globalSeriesType") if vtype.upper() == "CHART" else None
    return VisualizationArtifact(
        id=_id(viz.get("id")),
        type=vtype,
        name=one_line(str(viz.get("name") or ""), NAME_MAX_CHARS),
        chart=_label(chart) if chart else None,
        x=tuple(cols["x"]),
        y=tuple(cols["y"]),
        series=tuple(cols["series"]),
    )


def _widget_visualization_id(widget: Mapping[str, Any]) -> int | str | None:
    vid = widget.get("visualization_id")
    if vid is None and isinstance(widget.get("visualization"), Mapping):
        vid = widget["visualization"].get("id")
    return vid


def describe_dashboard(dash: Mapping[str, Any]) -> DashboardArtifact:
    widgets = dash.get("widgets") or []
    vids = tuple(
        v if isinstance(v, int) else one_line(v, ID_MAX_CHARS)
        for v in (_widget_visualization_id(w) for w in widgets)
        if v is not None
    )
    return DashboardArtifact(
        id=_id(dash.get("id")),
        name=one_line(str(dash.get("name") or ""), NAME_MAX_CHARS),
        widget_count=len(widgets),
        visualization_ids=tuple(dict.fromkeys(vids)),
    )


AnyArtifact = Artifact


def derive_artifacts(
    sql: Iterable[str],
    visualizations: Iterable[Mapping[str, Any]],
    dashboards: Iterable[Mapping[str, Any]],
    standing: Iterable[tuple[str, str | None]] | None = None,
) -> tuple[AnyArtifact, ...]:
    """Derive a turn's artifacts once, in a stable order: SQL, visualizations, dashboards,
    and the standing instructions the agent declared ((subject, text) pairs; None: it
    declares nothing, no artifact)."""
    out: list[AnyArtifact] = [SqlArtifact(sql=s) for s in sql if s.strip()]
    out.extend(describe_visualization(v) for v in visualizations)
    out.extend(describe_dashboard(d) for d in dashboards)
    if standing is not None:
        out.append(StandingArtifact(items=tuple(Declared(subject=s, text=t) for s, t in standing)))
    return tuple(out)
