"""`top`'s rows: what the table shows for each rank, pure functions of its parsed samples and the previous poll."""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from ms_exporter.core import catalogue
from ms_exporter.core.analysis.replicas import disagreeing
from ms_exporter.core.analysis.slowness import culprits, relative_scores
from ms_exporter.core.catalogue import (
    PROJECT_CYCLE_MEDIAN,
    PROJECT_WAIT_MEDIAN,
    RANK_CYCLE_MEAN,
    RANK_DEVICE_TEMPERATURE,
    RANK_WAIT_MEAN,
)
from ms_exporter.core.device.reading import HOST
from ms_exporter.core.stall import STALE_SECONDS, Stall, stall_of
from ms_exporter.core.thresholds import DEFAULTS
from ms_exporter.core.verdicts import DEVICE_HOT, MEMORY_GROWTH, STRAGGLER
from ms_exporter.tools.rank_samples import RankSamples
from ms_exporter.tools.targets import Target
from ms_exporter.tools.top import formats

# A counter that went up (a threshold breach, a non-finite loss) stays in the alerts column this long, so that
# an episode is not a flash of one refresh.
ALERT_HOLD_SECONDS = 60.0
LOCAL_GRADIENTS = "sdc local_gradients"  # a local gradient norm outlier (docs/sdc.md#local-gradients)
# Ranks of a synchronous job have step cycles within a few percent of each other; among the ranks this close to
# the longest cycle, the one with the largest data-wait share is the one the others wait for.
SYNC_TOLERANCE = 0.10
# The memory column's kind (catalogue.MEMORY_IN_USE_ORDER: in use on the device, else the host's) and its short name.
_MEMORY_SHORT = {
    catalogue.DEVICE_ALLOCATED: "dev",
    catalogue.DEVICE_RESERVED: "dev-res",
    catalogue.HOST_RSS: "rss",
    catalogue.DEVICE_PEAK: "dev-peak",
}


def stall_text(stall: Stall) -> str:
    """The alerts column's words for a stall: capitals past the hang deadline (red), else lower case (amber)."""
    where = f" in {stall.phase}" if stall.phase else ""
    if stall.past_deadline and stall.deadline is not None:
        return f"STALLED {formats.age(stall.seconds)}{where}, past deadline {formats.age(stall.deadline)}"
    limit = f", deadline {formats.age(stall.deadline)}" if stall.deadline is not None else ""
    return f"stalled {formats.age(stall.seconds)}{where}{limit}"


@dataclass(frozen=True)
class Slowness:
    """What a rank's fail-slow detector says (docs/failslow.md): its own work per step and clean cycle (seconds),
    whether a slowdown is flagged, and the onset step and size of the current or last one."""

    own: float
    cycle: float
    flagged: bool
    onset: float | None
    size: float | None


@dataclass(frozen=True)
class Row:
    """What the table shows for one rank (or one unreachable target, with `error` set)."""

    target: str
    rank: str | None
    project: str | None
    step: float | None = None
    loss: float | None = None
    loss_smoothed: float | None = None
    tokens_per_second: float | None = None
    mfu: float | None = None  # model FLOPs utilisation, where the rank knows its device's peak
    step_seconds: float | None = None
    wait_seconds: float | None = None  # data wait per step, as the straggler rule counts it
    grad_norm: float | None = None
    memory_bytes: float | None = None
    memory_kind: str | None = None
    age_seconds: float | None = None
    alerts: tuple[str, ...] = ()
    error: str | None = None
    slowest: bool = False
    phase: str | None = None  # mindspore_train_phase: compile, step, data_wait, eval, ..., ended
    fingerprint: tuple[str, float, float] | None = None  # (replica group, step, value) of the last fingerprint
    # The replica checks' checksums of that fingerprint step: ((kind, bucket), value), in order.
    checksums: tuple[tuple[tuple[str, str], float], ...] = ()
    # The rank's hottest accelerator (device, °C), else its host's where the kernel has a sensor.
    temperature: tuple[str, float] | None = None
    # The devices held down for heat or power now; () none is, None where no device reports throttling.
    throttled: tuple[str, ...] | None = None
    utilization: tuple[str, float] | None = None  # the busiest accelerator (device, 0-1), else the host's CPUs
    stall: Stall | None = None  # no step for longer than a few cycles: the last step's values are stale
    node: str | None = None  # the host the rank runs on (mindspore_train_info's node)
    slowness: Slowness | None = None
    # The groups of ranks it works in, (kind, group): node, pipeline stage, model copy (parallel_group_info).
    groups: tuple[tuple[str, str], ...] = ()

    @property
    def ended(self) -> bool:
        """The rank said its training ended normally (its endpoint may be gone since)."""
        return self.phase == catalogue.ENDED

    @property
    def critical(self) -> bool:
        """Red: the loss is not finite now, or the rank is stalled past its hang deadline."""
        nonfinite = self.loss is not None and not math.isfinite(self.loss)
        return nonfinite or (self.stall is not None and self.stall.past_deadline)

    @property
    def cycle_seconds(self) -> float | None:
        """Step time plus data wait: the rank's whole time per step."""
        if self.step_seconds is None:
            return None
        return self.step_seconds + (self.wait_seconds or 0.0)


@dataclass(frozen=True)
class History:
    """What one rank's previous poll left behind for the next: counters for deltas, and held alerts."""

    duration: tuple[float, float] | None = None  # step duration (_sum, _count)
    wait_sum: float | None = None
    step_seconds: float | None = None
    wait_seconds: float | None = None
    counters: dict[str, float] = field(default_factory=dict)
    held: dict[str, float] = field(default_factory=dict)  # alert -> shown until (unix seconds)
    row: Row | None = None  # what this poll showed: an ended rank keeps its last row once its endpoint goes


def build_row(
    target: str,
    project: str,
    rank: str,
    samples: RankSamples,
    history: History | None,
    now: float,
    stale_seconds: float = STALE_SECONDS,
    hold_seconds: float = ALERT_HOLD_SECONDS,
) -> tuple[Row, History]:
    """One rank's row from its samples and its previous poll (None on the first), and the history for the next.

    Step time and data wait are means over the steps since the previous poll (from the histograms' _sum and
    _count), the last such mean when no step ended in between, and the mean over the whole run on the first poll
    or after the counters went back (a restarted rank).
    """
    duration_sum = samples.value(catalogue.STEP_DURATION.sum)
    duration_count = samples.value(catalogue.STEP_DURATION.count)
    duration = None if duration_sum is None or duration_count is None else (duration_sum, duration_count)
    wait_sum = samples.value(catalogue.DATA_WAIT.sum)
    step_seconds, wait_seconds = _step_means(duration, wait_sum, history)

    counters = _counters(samples)
    held = _held(counters, history, now, hold_seconds)
    loss = samples.value(catalogue.LOSS.name)
    timestamp = samples.value(catalogue.LAST_STEP_TIMESTAMP.name)
    age = max(0.0, now - timestamp) if timestamp is not None else None
    phases = samples.by_label(catalogue.PHASE.name, "phase")
    phase = next((name for name, value in phases.items() if value == 1), None)
    call = _call_seconds(step_seconds, wait_seconds, duration_count, samples.value(catalogue.DATA_WAIT.count))
    stall = stall_of(
        age,
        phase,
        call,
        samples.value(catalogue.PHASE_SECONDS.name),
        samples.value(catalogue.HANG_DEADLINE.name),
        ended=phase == catalogue.ENDED,
        at_latest=stale_seconds,
    )
    temperature = _highest(samples.by_label(catalogue.DEVICE_TEMPERATURE.name, "device"))
    throttled = _throttled(samples)
    alerts = _alerts(samples, loss, held, stall, temperature, throttled)
    memory_bytes, memory_kind = _memory_in_use(samples)

    row = Row(
        target=target,
        rank=rank,
        project=project,
        step=samples.value(catalogue.GLOBAL_STEP.name),
        loss=loss,
        loss_smoothed=samples.value(catalogue.LOSS_SMOOTHED.name),
        tokens_per_second=samples.value(catalogue.TOKENS_PER_SECOND.name),
        mfu=samples.value(catalogue.MFU.name),
        step_seconds=step_seconds,
        wait_seconds=wait_seconds,
        grad_norm=samples.value(catalogue.GRAD_NORM.name),
        memory_bytes=memory_bytes,
        memory_kind=memory_kind,
        age_seconds=age,
        alerts=tuple(alerts),
        phase=phase,
        fingerprint=_fingerprint(samples),
        checksums=_checksums(samples),
        temperature=temperature,
        throttled=throttled,
        utilization=_highest(samples.by_label(catalogue.DEVICE_UTILIZATION.name, "device")),
        stall=stall,
        node=next(iter(samples.by_label(catalogue.INFO.name, "node")), None),
        slowness=_slowness(samples),
        groups=_parallel_groups(samples),
    )
    return row, History(duration, wait_sum, step_seconds, wait_seconds, counters, held, row)


def _counters(samples: RankSamples) -> dict[str, float]:
    """The counters whose rise `top` holds as an alert for a while: breaches, non-finite losses, local gradient
    outliers."""
    counters = {
        f"breach {metric}": value for metric, value in samples.by_label(catalogue.BREACHES.name, "metric").items()
    }
    nonfinite = samples.value(catalogue.NONFINITE_LOSS.name)
    if nonfinite is not None:
        counters["non-finite loss"] = nonfinite
    local_outliers = samples.by_label(catalogue.LOCAL_GRAD_OUTLIERS.name, "replica_group")
    if local_outliers:
        counters[LOCAL_GRADIENTS] = sum(local_outliers.values())
    return counters


def _held(counters: dict[str, float], history: History | None, now: float, hold_seconds: float) -> dict[str, float]:
    """The alerts still held (alert -> until): those held before, and each counter that rose since the last poll."""
    held = {alert: until for alert, until in (history.held.items() if history else ()) if until > now}
    if history is not None:  # on the first poll a counter above 0 is history, not news
        for alert, value in counters.items():
            if value > history.counters.get(alert, 0.0):
                held[alert] = now + hold_seconds
    return held


def _alerts(
    samples: RankSamples,
    loss: float | None,
    held: dict[str, float],
    stall: Stall | None,
    temperature: tuple[str, float] | None,
    throttled: tuple[str, ...] | None,
) -> list[str]:
    """The row's alerts, in the order `top` shows them."""
    alerts: list[str] = []
    if loss is not None and not math.isfinite(loss):
        alerts.append(f"loss {formats.number(loss)}")
    elif "non-finite loss" in held:
        alerts.append("non-finite loss")
    if stall is not None:
        alerts.append(stall_text(stall))
    alerts.extend(sorted(alert for alert in held if alert.startswith("breach ")))
    if LOCAL_GRADIENTS in held:
        alerts.append(LOCAL_GRADIENTS)
    disabled = samples.by_label(catalogue.COMPONENT_DISABLED.name, "component")
    alerts.extend(f"{component} disabled" for component, value in sorted(disabled.items()) if value >= 1)
    alerts.extend(_memory_growth(samples))
    if (
        temperature is not None
        and temperature[0] != HOST
        and DEVICE_HOT.holds({RANK_DEVICE_TEMPERATURE: temperature[1]})
    ):
        alerts.append(f"{temperature[0]} hot {temperature[1]:.0f}C")
    alerts.extend(f"{device} throttled" for device in throttled or ())
    return alerts


def _memory_in_use(samples: RankSamples) -> tuple[float | None, str | None]:
    """The memory in use the row shows (bytes, its short kind): the first kind MEMORY_IN_USE_ORDER finds."""
    memory = samples.by_label(catalogue.MEMORY_BYTES.name, "kind")
    for kind in catalogue.MEMORY_IN_USE_ORDER:
        if kind in memory:
            return memory[kind], _MEMORY_SHORT[kind]
    return None, None


def _parallel_groups(samples: RankSamples) -> tuple[tuple[str, str], ...]:
    pairs = samples.by_labels(catalogue.PARALLEL_GROUP_INFO.name, "kind", "group")
    return tuple(sorted((kind, group) for kind, group in pairs))


def _slowness(samples: RankSamples) -> Slowness | None:
    own, cycle = samples.value(catalogue.OWN_WORK.name), samples.value(catalogue.CLEAN_CYCLE.name)
    if own is None or cycle is None:
        return None
    flagged = samples.value(catalogue.FAILSLOW.name) == 1.0
    return Slowness(
        own,
        cycle,
        flagged,
        samples.value(catalogue.FAILSLOW_ONSET_STEP.name),
        samples.value(catalogue.FAILSLOW_SIZE.name),
    )


def _call_seconds(
    step_seconds: float | None, wait_seconds: float | None, steps: float | None, waits: float | None
) -> float | None:
    """The time between two step ends the rank reports: step time plus data wait, per step, times the steps a hook
    call covers (1; the sink size in sink mode, where one data wait is observed per call). None before a step."""
    if step_seconds is None:
        return None
    per_call = steps / (waits + 1) if steps and waits is not None else 1.0
    return (step_seconds + (wait_seconds or 0.0)) * max(1.0, per_call)


def _memory_growth(samples: RankSamples) -> list[str]:
    """MindSporeTrainingMemoryGrowth's condition, per memory kind, with its default thresholds: grown more than
    `memory_growth_ratio` over the post-warm-up baseline and still growing (faster than `memory_growth_rate`)."""
    ratios = samples.by_label(catalogue.MEMORY_GROWTH_RATIO.name, "kind")
    rates = samples.by_label(catalogue.MEMORY_GROWTH_RATE.name, "kind")
    return [
        f"memory +{ratio:.0%} {_MEMORY_SHORT.get(kind, kind)}"
        for kind, ratio in sorted(ratios.items())
        if MEMORY_GROWTH.holds(
            {catalogue.MEMORY_GROWTH_RATIO.name: ratio, catalogue.MEMORY_GROWTH_RATE.name: rates.get(kind, 0.0)}
        )
    ]


def _highest(by_device: Mapping[str, float]) -> tuple[str, float] | None:
    """The accelerator with the highest value, else the host's value (a CPU-only rank), else None."""
    accelerators = {device: value for device, value in by_device.items() if device != HOST and math.isfinite(value)}
    if accelerators:
        device = max(accelerators, key=lambda name: (accelerators[name], name))
        return device, accelerators[device]
    host = by_device.get(HOST)
    return None if host is None or not math.isfinite(host) else (HOST, host)


def _throttled(samples: RankSamples) -> tuple[str, ...] | None:
    devices = sorted(samples.by_label(catalogue.DEVICE_THROTTLED.name, "device"))
    if not devices:
        return None
    return tuple(
        device
        for device in devices
        if any(
            samples.value(catalogue.DEVICE_THROTTLED.name, device=device, reason=reason) == 1
            for reason in catalogue.HEAT_POWER_REASONS
        )
    )


def _step_means(
    duration: tuple[float, float] | None, wait_sum: float | None, history: History | None
) -> tuple[float | None, float | None]:
    """(step time, data wait) per step; data wait is None when the rank does not export it."""
    if duration is None:
        return None, None
    total, count = duration
    if history is not None and history.duration is not None:
        before_total, before_count = history.duration
        if count > before_count:
            steps = count - before_count
            wait = None if wait_sum is None else max(0.0, wait_sum - (history.wait_sum or 0.0)) / steps
            return (total - before_total) / steps, wait
        if count == before_count and history.step_seconds is not None:
            return history.step_seconds, history.wait_seconds
    if count > 0:
        return total / count, None if wait_sum is None else wait_sum / count
    return None, None


def down_row(target: Target, error: str) -> Row:
    return Row(target=target.url, rank=target.rank, project=target.project, error=error)


def gone_rows(url: str, histories: Mapping[tuple[str, str, str], History], error: str) -> list[Row] | None:
    """The rows of a target that no longer answers, when every rank it served had ended normally: their last
    rows, marked as ended with the endpoint gone. None when it did not end (the target is down)."""
    last = [history.row for key, history in histories.items() if key[0] == url and history.row is not None]
    if not last or not all(row.ended for row in last):
        return None
    return [replace(row, alerts=(f"ended; endpoint gone ({error})",), age_seconds=None) for row in last]


def _checksums(samples: RankSamples) -> tuple[tuple[tuple[str, str], float], ...]:
    found = samples.by_labels(catalogue.PARAM_CHECKSUM.name, "kind", "bucket")
    return tuple(sorted(((kind, bucket), value) for (kind, bucket), value in found.items()))


def _fingerprint(samples: RankSamples) -> tuple[str, float, float] | None:
    values = samples.by_label(catalogue.PARAM_FINGERPRINT.name, "replica_group")
    steps = samples.by_label(catalogue.PARAM_FINGERPRINT_STEP.name, "replica_group")
    group = next(iter(values), None)
    return None if group is None or group not in steps else (group, steps[group], values[group])


def mark_diverged(rows: Sequence[Row]) -> list[Row]:
    """Adds "diverged" to the alerts of the ranks MindSporeTrainingReplicaDivergence names, and "sdc <kind>/<bucket>"
    for each bucket MindSporeTrainingSilentDataCorruption names them for: per project and replica group (and kind and
    bucket), at a step every rank of the group reports (`replicas.disagreeing`, the alerts' rule)."""
    groups: dict[tuple[str | None, str, str, str], dict[int, tuple[float, float]]] = {}
    for index, row in enumerate(rows):
        if row.error is None and row.fingerprint is not None:
            group, step, value = row.fingerprint
            groups.setdefault((row.project, group, "", ""), {})[index] = (step, value)
            for (kind, bucket), checksum in row.checksums:
                groups.setdefault((row.project, group, kind, bucket), {})[index] = (step, checksum)
    said: dict[int, list[str]] = {}
    for (_, _, kind, bucket), members in sorted(groups.items(), key=lambda item: str(item[0])):
        for index in disagreeing(members):
            said.setdefault(index, []).append(f"sdc {kind}/{bucket}" if kind else "diverged")
    return [replace(row, alerts=(*row.alerts, *said.get(index, ()))) for index, row in enumerate(rows)]


def mark_slowest(rows: Sequence[Row], tolerance: float = SYNC_TOLERANCE) -> list[Row]:
    """Marks, per project, the rank the job waits for (with at least two ranks that report a step time).

    That is the rank with the longest step cycle (step time + data wait); among ranks whose cycle is within
    `tolerance` of the longest, the one with the largest data-wait share. Ranks that do not synchronise run at
    their own pace, and the slow one has the longest cycle. Ranks that meet in a collective every step all have
    the same cycle: the slow one arrives late because of work between steps, so its step is short and its data
    wait long, while the others' steps grow by the time they wait for it. This picks one rank even when none is
    far off; a rank that MindSporeTrainingStraggler would page for (`verdicts.STRAGGLER`, the record the rule is
    written from, with the alert's default thresholds) also gets "straggler" in its alerts.
    """
    by_project: dict[str | None, list[int]] = {}
    for index, row in enumerate(rows):
        if row.error is None and row.cycle_seconds is not None:
            by_project.setdefault(row.project, []).append(index)
    chosen: set[int] = set()
    stragglers: set[int] = set()
    for indices in by_project.values():
        if len(indices) < 2:
            continue
        cycles = {i: rows[i].cycle_seconds or 0.0 for i in indices}
        waits = {i: rows[i].wait_seconds or 0.0 for i in indices}
        longest = max(cycles.values())
        candidates = [i for i in indices if cycles[i] >= (1.0 - tolerance) * longest]
        chosen.add(max(candidates, key=lambda i: (_wait_share(rows[i]), cycles[i])))
        median_wait, median_cycle = statistics.median(waits.values()), statistics.median(cycles.values())
        job = {PROJECT_WAIT_MEDIAN: median_wait, PROJECT_CYCLE_MEDIAN: median_cycle}
        stragglers.update(
            i for i in indices if STRAGGLER.holds({**job, RANK_WAIT_MEAN: waits[i], RANK_CYCLE_MEAN: cycles[i]})
        )
    return [
        replace(row, slowest=index in chosen, alerts=(*row.alerts, "straggler") if index in stragglers else row.alerts)
        for index, row in enumerate(rows)
    ]


def mark_failslow(rows: Sequence[Row], alert_below: float = DEFAULTS.failslow_relative) -> list[Row]:
    """Adds "fail-slow from step N (+x%)" to the alerts of the ranks MindSporeTrainingFailSlow names: per project,
    a rank its own detector flagged whose relative score (`slowness.relative_scores`, the recording rule's formula)
    is under `alert_below`. Where every rank of a group (its node, pipeline stage or model copy; the largest first)
    is named, each says "fail-slow <kind> <group>": the group is the culprit (`slowness.culprits`)."""
    by_project: dict[str | None, list[int]] = {}
    for index, row in enumerate(rows):
        if row.error is None and row.slowness is not None:
            by_project.setdefault(row.project, []).append(index)
    said: dict[int, str] = {}
    for indices in by_project.values():
        slowness = [rows[i].slowness for i in indices]
        scores = relative_scores([s.own for s in slowness if s], [s.cycle for s in slowness if s])
        named = [i for i, s, score in zip(indices, slowness, scores) if s and s.flagged and score < alert_below]
        groups = _groups(rows, indices)
        # Largest first; of groups with the same ranks, the node (a host's fault is the one an operator drains).
        ordered = sorted(groups, key=lambda key: (-len(groups[key]), key[0] != "node", key))
        names: dict[tuple[int, ...], tuple[str, str]] = {}
        for key in ordered:
            names.setdefault(tuple(sorted(groups[key])), key)
        for members in culprits(named, [groups[key] for key in ordered]):
            for i in members:
                s = rows[i].slowness
                since = f" from step {s.onset:.0f}" if s and s.onset is not None else ""
                size = f" (+{s.size:.0%})" if s and s.size is not None and len(members) == 1 else ""
                where = " {} {}".format(*names[members]) if len(members) > 1 else ""
                said[i] = f"fail-slow{where}{since}{size}"
    return [replace(row, alerts=(*row.alerts, said[i])) if i in said else row for i, row in enumerate(rows)]


def _groups(rows: Sequence[Row], indices: Sequence[int]) -> dict[tuple[str, str], list[int]]:
    """(kind, group) -> the indices of its ranks: each rank's node and the groups its monitor published."""
    groups: dict[tuple[str, str], list[int]] = {}
    for i in indices:
        keys = set(rows[i].groups)
        node = rows[i].node
        if node is not None:
            keys.add(("node", node))
        for key in keys:
            groups.setdefault(key, []).append(i)
    return groups


def _wait_share(row: Row) -> float:
    cycle = row.cycle_seconds
    return (row.wait_seconds or 0.0) / cycle if cycle else 0.0


def sort_key(row: Row) -> tuple[bool, str, int, str, str]:
    """By project and rank; targets that never said which rank they are (down URLs) last."""
    rank = row.rank if row.rank is not None else ""
    return (row.rank is None, row.project or "", int(rank) if rank.isdigit() else sys.maxsize, rank, row.target)
