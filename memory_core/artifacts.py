"""Artifacts: what a turn built, derived once at finalize from the live objects.

Stored in `thread_messages.artifacts` and read back as-is everywhere downstream.
Visualization and dashboard artifacts are compact descriptors, never raw configs.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter

_FROZEN = ConfigDict(frozen=True, extra="forbid")


class SqlArtifact(BaseModel):
    model_config = _FROZEN
    kind: Literal["sql"] = "sql"
    sql: str

    def one_line(self) -> str:
        flat = " ".join(self.sql.split())
        return f"SQL: {flat[:117] + '...' if len(flat) > 120 else flat}"

    def expanded(self) -> str:
        return f"SQL:\n{self.sql}"


class VisualizationArtifact(BaseModel):
    model_config = _FROZEN
    kind: Literal["visualization"] = "visualization"
    id: int | str | None = None
    type: str
    name: str
    chart: str | None = None
    x: list[str] = Field(default_factory=list)
    y: list[str] = Field(default_factory=list)
    series: list[str] = Field(default_factory=list)

    def one_line(self) -> str:
        kind = f"{self.type.lower()}/{self.chart}" if self.chart else self.type.lower()
        return f'Visualization #{self.id} "{self.name}" ({kind})'

    def expanded(self) -> str:
        lines = [f'Visualization #{self.id} "{self.name}"', f"  type: {self.type}"]
        if self.chart:
            lines.append(f"  chart: {self.chart}")
        for label, cols in (("x", self.x), ("y", self.y), ("series", self.series)):
            if cols:
                lines.append(f"  {label}: {', '.join(cols)}")
        return "\n".join(lines)


class DashboardArtifact(BaseModel):
    model_config = _FROZEN
    kind: Literal["dashboard"] = "dashboard"
    id: int | str | None = None
    name: str
    widget_count: int = 0
    visualization_ids: list[int | str] = Field(default_factory=list)

    def one_line(self) -> str:
        return f'Dashboard #{self.id} "{self.name}" ({self.widget_count} widgets)'

    def expanded(self) -> str:
        vids = ", ".join(f"#{v}" for v in self.visualization_ids) or "none"
        return (
            f'Dashboard #{self.id} "{self.name}"\n'
            f"  widgets: {self.widget_count}\n  visualizations: {vids}"
        )


Artifact = Annotated[
    SqlArtifact | VisualizationArtifact | DashboardArtifact, Field(discriminator="kind")
]
ARTIFACTS_ADAPTER: TypeAdapter[list[Artifact]] = TypeAdapter(list[Artifact])

# Redash CHART columnMapping roles we keep; anything else (yError, size, ...) is dropped.
_ROLES = ("x", "y", "series")


def describe_visualization(viz: Mapping[str, Any]) -> VisualizationArtifact:
    """A compact descriptor of a Redash visualization: never its raw `options`."""
    options = viz.get("options") or {}
    mapping = options.get("columnMapping") or {}
    cols: dict[str, list[str]] = {role: [] for role in _ROLES}
    if isinstance(mapping, Mapping):
        for column, role in mapping.items():
            if isinstance(role, str) and role in cols:  # free-form JSON: a role may be a list
                cols[role].append(str(column))
    vtype = str(viz.get("type") or "UNKNOWN")
    chart = options.get("globalSeriesType") if vtype.upper() == "CHART" else None
    return VisualizationArtifact(
        id=viz.get("id"),
        type=vtype,
        name=str(viz.get("name") or ""),
        chart=str(chart) if chart else None,
        **cols,
    )


def _widget_visualization_id(widget: Mapping[str, Any]) -> int | str | None:
    vid = widget.get("visualization_id")
    if vid is None and isinstance(widget.get("visualization"), Mapping):
        vid = widget["visualization"].get("id")
    return vid


def describe_dashboard(dash: Mapping[str, Any]) -> DashboardArtifact:
    widgets = dash.get("widgets") or []
    vids = [v for v in (_widget_visualization_id(w) for w in widgets) if v is not None]
    return DashboardArtifact(
        id=dash.get("id"),
        name=str(dash.get("name") or ""),
        widget_count=len(widgets),
        visualization_ids=list(dict.fromkeys(vids)),
    )


def derive_artifacts(
    sql: Iterable[str],
    visualizations: Iterable[Mapping[str, Any]],
    dashboards: Iterable[Mapping[str, Any]],
) -> list[SqlArtifact | VisualizationArtifact | DashboardArtifact]:
    """Derive a turn's artifacts once, in a stable order: SQL, visualizations, dashboards."""
    out: list[SqlArtifact | VisualizationArtifact | DashboardArtifact] = [
        SqlArtifact(sql=s) for s in sql if s.strip()
    ]
    out.extend(describe_visualization(v) for v in visualizations)
    out.extend(describe_dashboard(d) for d in dashboards)
    return out
