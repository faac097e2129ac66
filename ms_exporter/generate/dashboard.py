"""The Grafana dashboard, built with the Grafana Foundation SDK's typed builders (panel and field names are checked
by types), and tested by evaluating every query against a real Prometheus.

`ms-exporter dashboard -o deploy/grafana/dashboards/mindspore-training.json` writes the committed file; the SDK is
the only writer of its JSON, at the schema version the SDK targets.
"""

from __future__ import annotations

import json
from typing import Any

from grafana_foundation_sdk.builders import common, dashboard, prometheus, statetimeline
from grafana_foundation_sdk.builders import stat as stat_panel
from grafana_foundation_sdk.builders import timeseries as timeseries_panel
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as cm
from grafana_foundation_sdk.models import dashboard as dm

from ms_exporter.core import catalogue as c
from ms_exporter.core.thresholds import DEFAULTS, Thresholds

DASHBOARD_FILE = "deploy/grafana/dashboards/mindspore-training.json"
UID = "ms-exporter-training"
SELECTOR = 'project=~"$project", rank=~"$rank"'
DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid="${datasource}")


class _Layout:
    """Rows and panels in order, each panel numbered; the SDK places them on Grafana's 24-column grid (every line
    of panels below fills exactly 24 columns)."""

    def __init__(self, board: dashboard.Dashboard) -> None:
        self._board = board
        self._id = 0

    def row(self, title: str) -> None:
        self._id += 1
        self._board.with_row(dashboard.Row(title).id(self._id))

    def add(self, panel: Any, width: int, height: int) -> None:
        self._id += 1
        self._board.with_panel(panel.id(self._id).span(width).height(height))


def _targets(panel: Any, queries: list[tuple[str, str]]) -> Any:
    for index, (expr, legend) in enumerate(queries):
        panel.with_target(prometheus.Dataquery().ref_id(chr(ord("A") + index)).expr(expr).legend_format(legend))
    return panel


def _legend() -> common.VizLegendOptions:
    return common.VizLegendOptions().display_mode(cm.LegendDisplayMode.LIST).placement(cm.LegendPlacement.BOTTOM)


def timeseries(
    title: str,
    unit: str,
    queries: list[tuple[str, str]],
    description: str = "",
    above: float | None = None,
    below: float | None = None,
    stacked: bool = False,
) -> Any:
    """A time series panel; `above`/`below` draw the alert threshold a value should stay under/over as a dashed
    line (Grafana's thresholds, the numbers from ms_exporter/core/thresholds.py); `stacked` fills the series one on
    top of the other."""
    panel = (
        timeseries_panel.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .line_width(1)
        .fill_opacity(0)
        .legend(_legend())
        .tooltip(common.VizTooltipOptions().mode(cm.TooltipDisplayMode.MULTI))
    )
    if stacked:
        panel.fill_opacity(60).stacking(common.StackingConfig().mode(cm.StackingMode.NORMAL).group("A"))
    if above is not None or below is not None:
        limit = above if above is not None else below
        ok, bad = "green", "red"
        first, second = (ok, bad) if above is not None else (bad, ok)
        panel.thresholds(
            dashboard.ThresholdsConfig()
            .mode(dm.ThresholdsMode.ABSOLUTE)
            .steps([dm.Threshold(color=first, value=None), dm.Threshold(color=second, value=limit)])
        )
        panel.thresholds_style(common.GraphThresholdsStyleConfig().mode(cm.GraphTresholdsStyleMode.DASHED))
    return _targets(panel, queries)


def phase_timeline(title: str, selector: str, description: str = "") -> Any:
    """A state timeline of each rank's phase: the phase's position in catalogue.PHASES (1-based) as the value,
    mapped back to its name and a colour; a rank that stands out in a hang is the row of another colour."""
    terms = " + ".join(
        f'sum by (rank) ({c.PHASE.name}{{{selector}, phase="{name}"}}) * {index}'
        for index, name in enumerate(c.PHASES, start=1)
    )
    colours = ("purple", "orange", "green", "blue", "yellow", "red", "text")
    mappings: list[dm.ValueMapping] = [
        dm.ValueMap(options={str(index): dm.ValueMappingResult(text=name, color=colour, index=index - 1)})
        for index, (name, colour) in enumerate(zip(c.PHASES, colours, strict=True), start=1)
    ]
    panel = (
        statetimeline.Panel()
        .title(title)
        .description(description)
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
    return _targets(panel, [(terms, "rank {{rank}}")])


def stat(title: str, unit: str, expr: str, description: str = "") -> Any:
    panel = (
        stat_panel.Panel()
        .title(title)
        .description(description)
        .datasource(DATASOURCE)
        .unit(unit)
        .reduce_options(common.ReduceDataOptions().calcs(["lastNotNull"]).fields("").values(False))
        .color_mode(cm.BigValueColorMode.VALUE)
        .graph_mode(cm.BigValueGraphMode.NONE)
    )
    return _targets(panel, [(expr, "")])


def render_dashboard(thresholds: Thresholds = DEFAULTS) -> dict[str, Any]:
    """The dashboard as data; the dashed lines follow `thresholds` (thresholds_of(config) for a user's)."""
    t = thresholds
    s = SELECTOR
    rate = "$__rate_interval"
    step_mean = c.RANK_STEP_MEAN
    wait_mean = c.RANK_WAIT_MEAN
    cycle_mean = c.RANK_CYCLE_MEAN
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
    layout = _Layout(board)

    layout.row("Overview")
    layout.add(stat("Global step", "none", f"max({c.GLOBAL_STEP.name}{{{s}}})"), 4, 4)
    layout.add(
        stat(
            "ETA",
            "s",
            f"(max({c.PLANNED_STEPS.name}{{{s}}}) - max({c.GLOBAL_STEP.name}{{{s}}}))"
            f" / clamp_min(avg(rate({c.STEPS.name}{{{s}}}[{rate}])), 1e-9)",
            "Time left in the current Model.train call at the current step rate.",
        ),
        4,
        4,
    )
    layout.add(
        stat(
            "Last step age",
            "s",
            f"max(time() - {c.LAST_STEP_TIMESTAMP.name}{{{s}}})",
            "Seconds since the slowest rank finished a step.",
        ),
        4,
        4,
    )
    layout.add(stat("Ranks reporting", "none", f"count({c.INFO.name}{{{s}}})"), 4, 4)
    layout.add(stat("World size", "none", f"max({c.WORLD_SIZE.name}{{{s}}})"), 4, 4)
    layout.add(
        stat("Alerts firing", "none", 'count(ALERTS{alertstate="firing", project=~"$project"}) or vector(0)'), 4, 4
    )

    layout.row("Loss")
    layout.add(
        timeseries("Loss per rank", "none", [(f"{c.LOSS.name}{{{s}}}", "rank {{rank}}")], above=t.loss_high), 8, 8
    )
    layout.add(
        timeseries("Smoothed loss", "none", [(f"{c.LOSS_SMOOTHED.name}{{{s}}}", "rank {{rank}}")], above=t.loss_high),
        8,
        8,
    )
    layout.add(
        timeseries(
            "Non-finite losses", "none", [(f"increase({c.NONFINITE_LOSS.name}{{{s}}}[{rate}])", "rank {{rank}}")]
        ),
        8,
        8,
    )

    layout.row("Learning rate")
    layout.add(
        timeseries("Learning rate", "none", [(f"{c.LEARNING_RATE.name}{{{s}}}", "rank {{rank}} {{group}}")]), 24, 7
    )

    layout.row("Actions")
    layout.add(
        timeseries(
            "Actions the monitor took",
            "none",
            [
                (f"increase({c.ACTIONS_TAKEN.name}{{{s}}}[{rate}])", "{{action}} rank {{rank}}"),
                (f"{c.LR_BACKOFF_FACTOR.name}{{{s}}}", "LR scale rank {{rank}}"),
            ],
            "monitor_config.actions: early stops, learning-rate back-offs (and the scale now on the LR), anomaly "
            f"snapshots ({c.LAST_SNAPSHOT_STEP.name} says which step is on disk), rollbacks.",
        ),
        10,
        7,
    )
    layout.add(
        timeseries(
            "Rollbacks and steps lost",
            "none",
            [
                (
                    f'increase({c.ACTIONS_TAKEN.name}{{{s},action=~"rollback|rollback_stop"}}[{rate}])',
                    "{{action}} rank {{rank}}",
                ),
                (f"increase({c.ROLLBACK_LOST_STEPS.name}{{{s}}}[{rate}])", "steps lost rank {{rank}}"),
            ],
            "actions.rollback: divergences rolled back to the last good state, the steps each undid, and a stop by the "
            "loop guard (docs/rollback.md).",
        ),
        7,
        7,
    )
    layout.add(
        timeseries(
            "Health score and last good step",
            "none",
            [
                (f"{c.HEALTH_SCORE.name}{{{s}}}", "health rank {{rank}}"),
                (
                    f"{c.GLOBAL_STEP.name}{{{s}}} - {c.LAST_GOOD_STEP.name}{{{s}}}",
                    "steps since the good state rank {{rank}}",
                ),
            ],
            "0 to 1: the worst of the smoothed-loss trend, gradient norm and memory growth terms; a good state is kept "
            "at or above actions.rollback.min_health. Steps since the good state: what a rollback now would undo.",
        ),
        7,
        7,
    )

    layout.row("Throughput")
    layout.add(
        timeseries(
            "Tokens per second",
            "suffix: tokens/s",
            [(f"{c.TOKENS_PER_SECOND.name}{{{s}}}", "rank {{rank}}")],
            below=t.tokens_per_second_low,
        ),
        6,
        8,
    )
    layout.add(
        timeseries(
            "Samples per second", "suffix: samples/s", [(f"{c.SAMPLES_PER_SECOND.name}{{{s}}}", "rank {{rank}}")]
        ),
        6,
        8,
    )
    step_buckets = f"sum by (le, rank) (rate({c.STEP_DURATION.bucket}{{{s}}}[{rate}]))"
    wait_buckets = f"sum by (le, rank) (rate({c.DATA_WAIT.bucket}{{{s}}}[{rate}]))"
    layout.add(
        timeseries(
            "Step time p50 / p95",
            "s",
            [
                (f"histogram_quantile(0.5, {step_buckets})", "p50 rank {{rank}}"),
                (f"histogram_quantile(0.95, {step_buckets})", "p95 rank {{rank}}"),
            ],
        ),
        6,
        8,
    )
    layout.add(
        timeseries(
            "Data wait p95",
            "s",
            [(f"histogram_quantile(0.95, {wait_buckets})", "rank {{rank}}")],
            "Time between steps: a stalled data loader shows here first.",
        ),
        6,
        8,
    )
    layout.add(
        timeseries(
            "Model FLOPs utilisation",
            "percentunit",
            [(f"{c.MFU.name}{{{s}}}", "rank {{rank}}"), (f'{c.PROJECT_MFU}{{project=~"$project"}}', "job {{project}}")],
            "Model FLOPs per second over the device's peak (docs/mfu.md): FLOPs per token from monitor_config.flops "
            f"(a model description, a stated figure, or 6N of the parameters: {c.FLOPS_INFO.name} says which), "
            "the peak from flops.peak_flops_per_device. Padding and recomputation are not counted as work.",
            below=t.mfu_low,
        ),
        12,
        8,
    )
    layout.add(
        timeseries(
            "Model FLOPs per second",
            "flops",
            [
                (f"{c.MODEL_FLOPS_PER_SECOND.name}{{{s}}}", "rank {{rank}}"),
                (f'{c.PROJECT_MODEL_FLOPS}{{project=~"$project"}}', "job {{project}}"),
            ],
            "Tokens per second times model FLOPs per token (forward and backward).",
        ),
        12,
        8,
    )

    layout.row("Gradients")
    layout.add(
        timeseries(
            "Global gradient norm", "none", [(f"{c.GRAD_NORM.name}{{{s}}}", "rank {{rank}}")], above=t.grad_norm_high
        ),
        6,
        8,
    )
    layout.add(
        timeseries(
            "Top layer gradient norms",
            "none",
            [(f"topk(5, {c.LAYER_GRAD_NORM.name}{{{s}}})", "{{layer}} rank {{rank}}")],
        ),
        6,
        8,
    )
    layout.add(
        timeseries(
            "Loss scale and overflows",
            "none",
            [
                (f"{c.LOSS_SCALE.name}{{{s}}}", "scale rank {{rank}}"),
                (f"increase({c.OVERFLOW_STEPS.name}{{{s}}}[{rate}])", "overflows rank {{rank}}"),
            ],
        ),
        6,
        8,
    )
    layout.add(
        timeseries(
            "LayerNorm scale drift",
            "percentunit",
            [(f"{c.LAYERNORM_DRIFT.name}{{{s}}}", "{{layer}} rank {{rank}}")],
            above=t.layernorm_drift,
        ),
        6,
        8,
    )

    layout.row("Hangs")
    layout.add(
        phase_timeline(
            "Phase per rank",
            s,
            "Where each rank is (docs/hangs.md). In a hang the ranks that wait sit in step, inside "
            "the collective; the rank they wait for is the row of another colour "
            "(MindSporeTrainingHang names it).",
        ),
        12,
        8,
    )
    layout.add(
        timeseries(
            "Time in phase and its deadline",
            "s",
            [
                (f"{c.PHASE_SECONDS.name}{{{s}}}", "in phase rank {{rank}}"),
                (f"{c.HANG_DEADLINE.name}{{{s}}}", "deadline rank {{rank}}"),
            ],
            "A rank whose time in its phase crosses its deadline is stalled (MindSporeTrainingStalled); the deadline "
            "is learned from the run's own step cycles.",
        ),
        6,
        8,
    )
    layout.add(
        timeseries(
            "Hangs suspected and stack dumps",
            "none",
            [
                (f"{c.HANG_SUSPECTED.name}{{{s}}}", "suspected rank {{rank}}"),
                (f"increase({c.HANG_DUMPS.name}{{{s}}}[{rate}])", "dumps rank {{rank}}"),
            ],
            "1 while a rank is past its hang deadline; its stacks are in save_dir/hang-rank*.txt and at "
            "/debug/stacks on its endpoint.",
        ),
        6,
        8,
    )

    layout.row("Goodput")
    spent = f"sum by (bucket) (rate({c.TIME_SECONDS.name}{{{s}}}[{rate}]))"
    layout.add(
        timeseries(
            "Where the time goes",
            "percentunit",
            [
                (
                    f"{spent} / ignoring (bucket) group_left () sum(rate({c.TIME_SECONDS.name}{{{s}}}[{rate}]))",
                    "{{bucket}}",
                )
            ],
            "Each bucket's share of the selected ranks' wall time (docs/goodput.md): productive is the steps that "
            "advance training; redo is steps done again after a restart.",
            stacked=True,
        ),
        12,
        8,
    )
    layout.add(
        timeseries(
            "Goodput",
            "percentunit",
            [
                (f'{c.PROJECT_GOODPUT_1H}{{project=~"$project"}}', "last hour {{project}}"),
                (f'{c.PROJECT_GOODPUT_24H}{{project=~"$project"}}', "last day {{project}}"),
            ],
            "Productive time over all time of every rank, from the run's totals (across restarts).",
            below=t.goodput_low,
        ),
        6,
        8,
    )
    layout.add(
        stat(
            "Restarts",
            "none",
            f"max({c.RESTARTS.name}{{{s}}})",
            "Processes of this run that came before the current ones (crashes and restarts).",
        ),
        3,
        4,
    )
    layout.add(
        stat(
            "Run goodput so far",
            "percentunit",
            f'sum({c.RUN_TIME_SECONDS.name}{{{s}, bucket="{c.PRODUCTIVE}"}}) / sum({c.RUN_TIME_SECONDS.name}{{{s}}})',
            "Productive time over all time of the whole run so far, every process of it.",
        ),
        3,
        4,
    )

    layout.row("Memory")
    layout.add(
        timeseries("Memory by kind", "bytes", [(f"{c.MEMORY_BYTES.name}{{{s}}}", "{{kind}} rank {{rank}}")]), 8, 8
    )
    layout.add(
        timeseries(
            "Growth over baseline",
            "percentunit",
            [(f"{c.MEMORY_GROWTH_RATIO.name}{{{s}}}", "{{kind}} rank {{rank}}")],
            above=t.memory_growth_ratio,
        ),
        8,
        8,
    )
    layout.add(
        timeseries("Growth rate", "Bps", [(f"{c.MEMORY_GROWTH_RATE.name}{{{s}}}", "{{kind}} rank {{rank}}")]), 8, 8
    )

    layout.row("Ranks")
    # In synchronous data parallel every rank's step cycle is the same and the ranks that wait for a slow one
    # show the long steps: the rank to look at is the one whose data wait is a large part of its cycle.
    layout.add(
        timeseries(
            "Data wait share of the step cycle",
            "percentunit",
            [(f"{wait_mean}{{{s}}} / {cycle_mean}{{{s}}}", "rank {{rank}}")],
            "The rank a synchronous job waits for has the high share (MindSporeTrainingStraggler).",
        ),
        8,
        8,
    )
    layout.add(
        timeseries(
            "Step cycle per rank (step + data wait)",
            "s",
            [(f"{cycle_mean}{{{s}}}", "rank {{rank}}")],
            "Equal on every rank of a synchronous job; a rank above the rest runs at its own, slower pace.",
        ),
        8,
        8,
    )
    layout.add(
        timeseries(
            "Mean step time and data wait per rank",
            "s",
            [(f"{step_mean}{{{s}}}", "step rank {{rank}}"), (f"{wait_mean}{{{s}}}", "data wait rank {{rank}}")],
            "A long step can be time spent waiting in a collective for another rank.",
        ),
        8,
        8,
    )
    layout.add(
        timeseries(
            "Replicas holding the same weights",
            "percentunit",
            [(f"{c.RANK_REPLICAS_AGREEING}{{{s}}}", "rank {{rank}} group {{replica_group}}")],
            "Per rank, the share of its replica group whose parameter fingerprint equals its own at the group's latest "
            "fingerprint step (docs/divergence.md): 100% while the replicas agree; the rank below the rest left its "
            "group (MindSporeTrainingReplicaDivergence). Jobs of one rank have no replicas and no series here.",
            below=1.0,
        ),
        24,
        6,
    )
    layout.add(
        timeseries(
            "Monitor cost p99 per hook",
            "s",
            [
                (
                    f"histogram_quantile(0.99, sum by (le, hook) (rate({c.HOOK_DURATION.bucket}{{{s}}}[{rate}])))",
                    "{{hook}}",
                )
            ],
        ),
        12,
        7,
    )
    layout.add(
        timeseries(
            "Monitor errors absorbed",
            "none",
            [(f"increase({c.ERRORS.name}{{{s}}}[{rate}])", "{{component}} rank {{rank}}")],
        ),
        12,
        7,
    )

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


def render_json(dashboard_json: dict[str, Any]) -> str:
    return json.dumps(dashboard_json, indent=2) + "\n"


def queries(dashboard_json: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) for every query of every panel."""
    return [
        (panel["title"], target["expr"]) for panel in dashboard_json["panels"] for target in panel.get("targets", [])
    ]
