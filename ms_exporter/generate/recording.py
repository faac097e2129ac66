"""The recording rules as records: per-rank means and per-project sums, medians and ratios that the alerts and the
dashboard read by name (core/catalogue.py names them)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ms_exporter.core import catalogue as c
from ms_exporter.core.thresholds import DEFAULTS, Thresholds
from ms_exporter.generate.alerts.alert import number
from ms_exporter.generate.device_exporters import (
    EXPORTERS,
    HEAT_POWER_BITS,
    LINK_UP,
    DeviceExporter,
)
from ms_exporter.generate.timing import Timing


@dataclass(frozen=True)
class Recording:
    record: str
    expr: str


def recording_rules(w: Timing, t: Thresholds = DEFAULTS) -> tuple[Recording, ...]:
    """Every recording rule, in the order the rules file lists them."""
    step_mean, wait_mean, cycle_mean = c.RANK_STEP_MEAN, c.RANK_WAIT_MEAN, c.RANK_CYCLE_MEAN
    return (
        Recording(c.PROJECT_LOSS_MEAN, f"avg by (project) ({c.LOSS.name})"),
        Recording(c.PROJECT_LOSS_MIN, f"min by (project) ({c.LOSS.name})"),
        Recording(c.PROJECT_LOSS_MAX, f"max by (project) ({c.LOSS.name})"),
        Recording(c.PROJECT_TOKENS_PER_SECOND, f"sum by (project) ({c.TOKENS_PER_SECOND.name})"),
        Recording(c.PROJECT_SAMPLES_PER_SECOND, f"sum by (project) ({c.SAMPLES_PER_SECOND.name})"),
        Recording(
            step_mean,
            f"rate({c.STEP_DURATION.sum}[{w.rate_window}]) / rate({c.STEP_DURATION.count}[{w.rate_window}])",
        ),
        Recording(c.PROJECT_STEP_MAX, f"max by (project) ({step_mean})"),
        Recording(c.PROJECT_STEP_MEDIAN, f"quantile by (project) (0.5, {step_mean})"),
        Recording(c.PROJECT_RANKS_REPORTING, f"count by (project) ({c.INFO.name})"),
        # Per step, not per wait: in sink mode one wait covers a whole sink of steps.
        Recording(
            wait_mean, f"rate({c.DATA_WAIT.sum}[{w.rate_window}]) / rate({c.STEP_DURATION.count}[{w.rate_window}])"
        ),
        # Step plus data wait: a rank's whole time per step. Equal on every rank of a synchronous job.
        Recording(cycle_mean, f"{step_mean} + {wait_mean}"),
        Recording(c.RANK_RELATIVE_SLOWNESS, _relative_slowness()),
        Recording(c.PROJECT_GROUP_FAILSLOW, _group_failslow()),
        Recording(c.PROJECT_WAIT_MEDIAN, f"quantile by (project) (0.5, {wait_mean})"),
        Recording(c.PROJECT_CYCLE_MEDIAN, f"quantile by (project) (0.5, {cycle_mean})"),
        # From the run's totals, which go on across a restart where the process's own counters start again: the
        # time between a process's last scrape and its end, and the next one's start, is in the next reading.
        Recording(c.PROJECT_GOODPUT_1H, _goodput("1h")),
        Recording(c.PROJECT_GOODPUT_24H, _goodput("24h")),
        Recording(c.RANK_REPLICAS_AGREEING, _agreeing(c.PARAM_FINGERPRINT.name, "fingerprint", _REPLICAS)),
        Recording(
            c.RANK_CHECKSUMS_AGREEING, _agreeing(c.PARAM_CHECKSUM.name, "checksum", f"{_REPLICAS}, kind, bucket")
        ),
        Recording(c.PROJECT_MODEL_FLOPS, f"sum by (project) ({c.MODEL_FLOPS_PER_SECOND.name})"),
        # The job's MFU: the model FLOPs of the ranks that know their peak, over the sum of those peaks.
        Recording(
            c.PROJECT_MFU,
            f"sum by (project) ({c.MODEL_FLOPS_PER_SECOND.name} and on (job, instance) {c.MFU.name})"
            f" / sum by (project) ({c.PEAK_FLOPS.name} and on (job, instance) {c.MFU.name})",
        ),
        Recording(c.PROJECT_MFU_MEAN, f"avg by (project) ({c.MFU.name})"),
        *device_rules(t),
    )


def _goodput(window: str) -> str:
    """A project's productive share of its run time over `window`."""
    return (
        f'sum by (project) (increase({c.RUN_TIME_SECONDS.name}{{bucket="{c.PRODUCTIVE}"}}[{window}]))'
        f" / sum by (project) (increase({c.RUN_TIME_SECONDS.name}[{window}]))"
    )


_REPLICAS = "project, replica_group"


def _agreeing(value: str, label: str, group: str) -> str:
    """Per rank (and per bucket, where `group` names one), the share of its replica group whose `value` (a
    fingerprint, a bucket's checksum) equals its own, at the group's latest fingerprint step, and only while every
    rank of the group reports that step (a rank still at an earlier step is not compared with ranks past it).
    count_values turns the value into the label `label`, so that ranks can be matched by it; the recorded series drop
    it again (a new value every comparison would be a new series)."""
    step = c.PARAM_FINGERPRINT_STEP.name
    at_latest = (
        f"({value} and on (job, instance) ({step} == on ({_REPLICAS}) group_left () max by ({_REPLICAS}) ({step})))"
    )
    compared = f"({at_latest} and on ({group}) (count by ({group}) ({at_latest}) == count by ({group}) ({value})))"
    return (
        f'sum without ({label}) (count_values without () ("{label}", {compared}) * on ({group}, '
        f'{label}) group_left () count_values by ({group}) ("{label}", {compared}))'
        f" / on ({group}) group_left () count by ({group}) ({compared})"
    )


# -- a rank's devices (docs/hardware.md#joining-the-device-exporters) ----------------------------------------------
_RANK_DEVICE = "project, rank, device"


def device_rules(t: Thresholds) -> tuple[Recording, ...]:
    """Each accelerator quantity per (project, rank, device): the rank's own reading where it has one, else
    npu-exporter's or dcgm-exporter's reading of the same device; then each device's state, from those. The state
    comes last: a group evaluates its rules in order, so it reads this evaluation's values."""
    return (
        Recording(
            c.RANK_DEVICE_TEMPERATURE,
            _ours_else_theirs(_own("max", c.DEVICE_TEMPERATURE.name), "max", lambda e: _keyed(e, e.temperature)),
        ),
        Recording(
            c.RANK_DEVICE_POWER,
            _ours_else_theirs(_own("max", c.DEVICE_POWER.name), "max", lambda e: _keyed(e, e.power)),
        ),
        Recording(
            c.RANK_DEVICE_UTILIZATION,
            _ours_else_theirs(
                _own("max", c.DEVICE_UTILIZATION.name),
                "max",
                lambda e: _keyed(e, e.utilization_percent),
                scale=" / 100",
            ),
        ),
        Recording(c.RANK_DEVICE_THROTTLED, _ours_else_theirs(_own_throttled(), "max", _throttled)),
        Recording(
            c.RANK_DEVICE_ECC_ERRORS,
            _ours_else_theirs(
                _own("max", c.DEVICE_ECC_UNCORRECTED.name), "max", lambda e: _keyed(e, e.ecc_uncorrected)
            ),
        ),
        # npu-exporter's link status is 1 up, 0 down, -1 where hccn_tool failed (no reading: left out).
        Recording(
            c.RANK_DEVICE_LINK_UP,
            _ours_else_theirs(
                _own("min", c.DEVICE_LINK_UP.name),
                "min",
                lambda e: e.link_status and f"{_keyed(e, e.link_status)} >= 0",
                scale=f" == bool {LINK_UP}",
            ),
        ),
        Recording(c.RANK_DEVICE_STATE, _state(t)),
    )


def _own(aggregation: str, family: str) -> str:
    return f"{aggregation} by ({_RANK_DEVICE}) ({_accelerators(family)})"


def _accelerators(family: str, matcher: str = "") -> str:
    """The rank's own series of its accelerators: the host's CPUs are no device the exporters read, and their
    temperature is not held to an accelerator's threshold (the dashboard shows them from the rank's series)."""
    return f'{family}{{device!="host"{matcher}}}'


def _keyed(exporter: DeviceExporter, name: str | None) -> str | None:
    """The exporter's series that name their device by its key label (npu-exporter leaves vdie_id empty on some
    chips: those join no rank)."""
    return name and f'{name}{{{exporter.key}!=""}}'


def _own_throttled() -> str:
    """1 while any heat or power reason holds; 0 where the reader names only others (an idle GPU)."""
    throttled, reasons = c.DEVICE_THROTTLED.name, "|".join(c.HEAT_POWER_REASONS)
    heat_or_power = _accelerators(throttled, f', reason=~"{reasons}"')
    return f"max by ({_RANK_DEVICE}) ({heat_or_power} or 0 * {_accelerators(throttled)})"


def _throttled(exporter: DeviceExporter) -> str | None:
    """1 while the exporter's clock-event mask has a heat or power bit set (PromQL has no bitwise and: bit b of a mask
    m is floor(m / b) % 2); the mask under either of its field names."""
    if not exporter.throttle_masks:
        return None
    mask = " or ".join(str(_keyed(exporter, name)) for name in exporter.throttle_masks)
    bits = " + ".join(f"floor(({mask}) / {bit}) % 2" for bit in HEAT_POWER_BITS)
    return f"clamp_max({bits}, 1)"


def _ours_else_theirs(
    ours: str, aggregation: str, series: Callable[[DeviceExporter], str | None], scale: str = ""
) -> str:
    """`ours` (labelled project, rank, device), and for each device it leaves out each exporter's reading (`series`,
    then `scale`), given to the ranks whose mindspore_train_device_info names the same device in the exporter's key
    label (renamed to ours where the exporter spells it in camelCase). One reading per device first, so that ranks
    sharing a device, or an exporter scraped twice, still join. A device the rank has no reading of (its reader is
    off, and its series left the page) takes the exporter's."""
    parts = [ours]
    for exporter in EXPORTERS:
        expr = series(exporter)
        if not expr:
            continue
        key = exporter.joins_as
        if exporter.key != key:
            expr = f'label_replace({expr}, "{key}", "$1", "{exporter.key}", "(.*)")'
        device = f"({aggregation} by ({key}) ({expr}){scale})"
        ranks = f'max by ({key}, {_RANK_DEVICE}) ({c.DEVICE_INFO.name}{{{key}!=""}})'
        parts.append(f"{aggregation} by ({_RANK_DEVICE}) ({ranks} * on ({key}) group_left () {device})")
    return f" or on ({_RANK_DEVICE}) ".join(parts)


def _state(t: Thresholds) -> str:
    """Per device, the first of DEVICE_STATES that holds, as the `state` label of a 1 (`or on` adds a device only
    where no earlier state named it; "healthy" is every device with a reading that none named)."""
    readings = " or ".join(
        (
            c.RANK_DEVICE_TEMPERATURE,
            c.RANK_DEVICE_POWER,
            c.RANK_DEVICE_UTILIZATION,
            c.RANK_DEVICE_THROTTLED,
            c.RANK_DEVICE_ECC_ERRORS,
            c.RANK_DEVICE_LINK_UP,
        )
    )
    holds = {
        "ecc_errors": f"{c.RANK_DEVICE_ECC_ERRORS} > 0",
        "link_down": f"{c.RANK_DEVICE_LINK_UP} == 0",
        "throttled": f"{c.RANK_DEVICE_THROTTLED} > 0",
        "hot": f"{c.RANK_DEVICE_TEMPERATURE} >= {number(t.device_hot_celsius)}",
        "healthy": f"group by ({_RANK_DEVICE}) ({readings})",
    }
    return f" or on ({_RANK_DEVICE}) ".join(
        f'label_replace(0 * ({holds[state]}) + 1, "state", "{state}", "", "")' for state in c.DEVICE_STATES
    )


def _group_failslow() -> str:
    """The share of each group's ranks flagged by their fail-slow detector, for groups of two or more ranks; a rank
    not judged yet counts as not flagged."""
    members = f"max by (project, rank, kind, group) ({c.PARALLEL_GROUP_INFO.name})"
    flagged = f"max by (project, rank) ({c.FAILSLOW.name})"
    return (
        f"sum by (project, kind, group) ({members} * on (project, rank) group_left () {flagged})"
        f" / (count by (project, kind, group) ({members}) > 1)"
    )


def _relative_slowness() -> str:
    """1 / (1 + (own - the project's least own) / the rank's clean cycle), per rank (core/analysis/slowness.py)."""
    own = f"max by (project, rank) ({c.OWN_WORK.name})"
    return (
        f"1 / (1 + clamp_min({own} - on (project) group_left () min by (project) ({c.OWN_WORK.name}), 0)"
        f" / max by (project, rank) ({c.CLEAN_CYCLE.name}))"
    )
