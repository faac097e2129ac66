"""The Grafana dashboard, built with the Grafana Foundation SDK's typed builders (panel and field names are checked
by types), and tested by evaluating every query against a real Prometheus.

The panels are records, row by row (generate/panels/); this module builds each through the SDK. `ms-exporter
dashboard -o deploy/grafana/dashboards/mindspore-training.json` writes the committed file; the SDK is the only writer
of its JSON, at the schema version the SDK targets.
"""

from __future__ import annotations

import itertools
import json
from typing import Any

from grafana_foundation_sdk.builders import common, dashboard, prometheus, statetimeline
from grafana_foundation_sdk.builders import stat as stat_panel
from grafana_foundation_sdk.builders import timeseries as timeseries_panel
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm

from ms_exporter.core import catalogue as c
from ms_exporter.core.compat import zip_strict
from ms_exporter.core.thresholds import DEFAULTS, Thresholds
from ms_exporter.generate.panels import rows
from ms_exporter.generate.panels.panel import SELECTOR, Panel, PhaseTimeline, Query, Stat, TimeSeries

DASHBOARD_FILE = "deploy/grafana/dashboards/mindspore-training.json"
UID = "ms-exporter-training"
DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")


def render_dashboard(thresholds: Thresholds = DEFAULTS) -> dict[str, Any]:
    """The dashboard as data; the dashed lines follow `thresholds` (thresholds_of(config) for a user's)."""
    board = (
        dashboard.Dashboard("MindSpore training")
        .uid(UID)
        .description("ms_exporter: loss, learning rate, throughput, gradients, memory and ranks of MindSpore jobs.")
        .tags(["mindspore", "training", "ms_exporter"])
        .timezone("browser")
        .editable()
        .refresh("10s")
        .time("now-1h", "now")
        .version(1)
    )
    # Rows and panels in order, each numbered; the SDK places them on Grafana's 24-column grid.
    ids = itertools.count(1)
    for row in rows(thresholds):
        board.with_row(dashboard.Row(row.title).id(next(ids)))
        for panel in row.panels:
            board.with_panel(_build(panel).id(next(ids)).span(panel.width).height(panel.height))
    board.with_variable(dashboard.DatasourceVariable("datasource").label("Data source").type("prometheus"))
    board.with_variable(
        dashboard.QueryVariable("project")
        .label("Project")
        .datasource(DATASOURCE)
        .query(f"label_values({c.INFO.name}, project)")
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .include_all(True)
        .multi(False)
        .sort(dm.VariableSort.ALPHABETICAL_ASC)
    )
    board.with_variable(
        dashboard.QueryVariable("rank")
        .label("Rank")
        .datasource(DATASOURCE)
        .query(f'label_values({c.INFO.name}{{project=~"$project"}}, rank)')
        .refresh(dm.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .include_all(True)
        .multi(True)
        .sort(dm.VariableSort.NUMERICAL_ASC)
    )
    plain: dict[str, Any] = json.loads(json.dumps(board.build(), cls=JSONEncoder))
    return plain


def _build(panel: Panel) -> Any:
    # isinstance, not `match`: the package, this module included, compiles on Python 3.9.
    if isinstance(panel, TimeSeries):
        return _timeseries(panel)
    if isinstance(panel, Stat):
        return _stat(panel)
    return _phase_timeline(panel)


def _targets(panel: Any, queries: tuple[Query, ...]) -> Any:
    for index, query in enumerate(queries):
        panel.with_target(
            prometheus.Dataquery().ref_id(chr(ord("A") + index)).expr(query.expr).legend_format(query.legend)
        )
    return panel


def _legend() -> common.VizLegendOptions:
    return common.VizLegendOptions().display_mode(cm.LegendDisplayMode.LIST).placement(cm.LegendPlacement.BOTTOM)


def _timeseries(record: TimeSeries) -> Any:
    panel = (
        timeseries_panel.Panel()
        .title(record.title)
        .description(record.description)
        .datasource(DATASOURCE)
        .unit(record.unit)
        .line_width(1)
        .fill_opacity(0)
        .legend(_legend())
        .tooltip(common.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI))
    )
    if record.stacked:
        panel.fill_opacity(60).stacking(common.StackingConfig().mode(cm.StackingMode.NORMAL).group("A"))
    # The alert's threshold as Grafana's thresholds, drawn dashed: green on the side the value should stay on.
    if record.above is not None or record.below is not None:
        limit = record.above if record.above is not None else record.below
        ok, bad = "green", "red"
        first, second = (ok, bad) if record.above is not None else (bad, ok)
        panel.thresholds(
            dashboard.ThresholdsConfig()
            .mode(dm.ThresholdsMode.ABSOLUTE)
            .steps([dm.Threshold(color=first, value=None), dm.Threshold(color=second, value=limit)])
        )
        panel.thresholds_style(common.GraphThresholdsStyleConfig().mode(cm.GraphTresholdsStyleMode.DASHED))
    return _targets(panel, record.queries)


def _phase_timeline(record: PhaseTimeline) -> Any:
    """Each rank's phase as its position in catalogue.PHASES (1-based), mapped back to its name and a colour."""
    terms = " + ".join(
        f'sum by (rank) ({c.PHASE.name}{{{SELECTOR}, phase="{name}"}}) * {index}'
        for index, name in enumerate(c.PHASES, start=1)
    )
    colours = ("purple", "orange", "green", "blue", "yellow", "red", "text")
    mappings: list[dm.ValueMapping] = [
        dm.ValueMap(options={str(index): dm.ValueMappingResult(text=name, color=colour, index=index - 1)})
        for index, (name, colour) in enumerate(zip_strict(c.PHASES, colours), start=1)
    ]
    panel = (
        statetimeline.Panel()
        .title(record.title)
        .description(record.description)
        .datasource(DATASOURCE)
        .unit("none")
        .mappings(mappings)
        .color_scheme(dashboard.FieldColor().mode(dm.FieldColorModeId.THRESHOLDS))
        .fill_opacity(80)
        .line_width(0)
        .show_value(cm.VisibilityMode.NEVER)
        .merge_values(True)
        .row_height(0.8)
        .legend(_legend())
    )
    return _targets(panel, (Query(terms, "rank {{rank}}"),))


def _stat(record: Stat) -> Any:
    panel = (
        stat_panel.Panel()
        .title(record.title)
        .description(record.description)
        .datasource(DATASOURCE)
        .unit(record.unit)
        .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False))
        .color_mode(cm.BigValueColorMode.VALUE)
        .graph_mode(cm.BigValueGraphMode.NONE)
    )
    return _targets(panel, (Query(record.expr, ""),))


def render_json(dashboard_json: dict[str, Any]) -> str:
    return json.dumps(dashboard_json, indent=2) + "\n"


def queries(dashboard_json: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) for every query of every panel."""
    return [
        (panel["title"], target["expr"]) for panel in dashboard_json["panels"] for target in panel.get("targets", [])
    ]
