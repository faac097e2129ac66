"""Building a monitor's parts from its configuration: the one place that knows which part needs which.

TrainingMonitor forwards MindSpore's hooks to the list this returns and names no part itself. The probes and sinks
come from the registries (core/registry.py) plus whatever the caller handed in (`TrainingMonitor(probes=...,
sinks=...)`: a part, or a callable that takes the PartContext and returns one or a list). The whole features
(sampler, watchdog, actions, goodput, divergence) are built here when their settings switch them on.

The order of construction is the order in which families are registered, which is the order /metrics lists them:
keep it when adding a part (tests/integration/test_metrics_unchanged.py holds the page's shape).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from ms_exporter.actions.bit_flips import BitFlips
from ms_exporter.actions.runner import ActionRunner
from ms_exporter.config import ConfigError, MonitorConfig
from ms_exporter.core import catalogue, registry
from ms_exporter.core.errors import Breaker, ErrorSink
from ms_exporter.core.part import DebugPage, Part, PartContext, overrides
from ms_exporter.core.phases import PhaseClock
from ms_exporter.core.probe import Probe
from ms_exporter.core.ranks import RankInfo
from ms_exporter.core.sample import BatchCounter
from ms_exporter.core.sink import Sink
from ms_exporter.core.store import HistogramSeries, MetricStore
from ms_exporter.endpoint.pages import CHECKSUMS_PATH, STACKS_PATH
from ms_exporter.features.breach_watch import ThresholdWatcher
from ms_exporter.features.fingerprint import Fingerprints
from ms_exporter.features.goodput import Goodput
from ms_exporter.features.hardware.monitor import HardwareMonitor, component, join_labels
from ms_exporter.features.sampler import MemorySampler
from ms_exporter.features.watchdog import HangWatchdog
from ms_exporter.monitor.publisher import StepPublisher
from ms_exporter.monitor.writer_fallback import WriterFallback
from ms_exporter.probes import build_probes
from ms_exporter.probes.hang_deadline import HangDeadlineProbe
from ms_exporter.probes.memory import MemoryProbe
from ms_exporter.sinks import build_sinks, console
from ms_exporter.sinks.shared import series_budget

# What a caller may hand in for a probe or a sink: the part itself, or what builds it from the context.
Given = Any
Announce = Callable[[int, str, dict[str, Any]], None]
_Kind = TypeVar("_Kind")


@dataclass
class Assembly:
    """A monitor's parts, and the wiring the callback drives them with."""

    parts: list[Part]  # every part, in the order each hook reaches them
    sinks: list[Sink]
    publisher: StepPublisher
    errors: ErrorSink
    breaker: Breaker
    batch: BatchCounter
    hook_cost: dict[str, HistogramSeries]  # mindspore_exporter_callback_duration_seconds{hook}


def assemble(
    config: MonitorConfig,
    store: MetricStore,
    rank: RankInfo,
    phases: PhaseClock,
    announce: Announce,
    given_probes: Sequence[Given] = (),
    given_sinks: Sequence[Given] = (),
) -> Assembly:
    """Build every part `config` asks for, plus the given ones. Raises only ConfigError (a sink's missing extra);
    nothing it started outlives that."""
    errors = ErrorSink(store)
    breaker = Breaker(errors, store)
    context = PartContext(config, store, rank, phases, errors.absorb, breaker)
    series_budget.attach(store, config.series_profile, config.detail_ranks, rank.rank)  # before any reader starts
    probes = [*build_probes(context), *_made(given_probes, context, Probe)]
    actions = ActionRunner(config, store, rank, announce, probes) if config.actions.any else None
    hang = _first(probes, HangDeadlineProbe)
    memory = _first(probes, MemoryProbe)
    step_probes = [probe for probe in probes if overrides(probe, "on_step")]
    errors.expect(
        (
            "callback",
            "sampler",
            *(("watchdog",) if hang is not None else ()),
            *(probe.name for probe in step_probes),
            *(("actions",) if actions is not None else ()),
            *(("goodput",) if config.goodput.enable else ()),
            *(("divergence",) if config.divergence.enable else ()),
        )
    )
    breaker.show()
    hooks = store.register(catalogue.HOOK_DURATION)
    hook_cost = {hook: hooks.histogram(hook=hook) for hook in catalogue.HOOKS}
    thresholds = ThresholdWatcher(store, config.all_bounds(), config.warmup_steps, config.warn_warmup_steps)
    batch = BatchCounter(
        config.attention_mask_column,
        config.input_ids_column,
        config.flops.seq_len_column if config.flops.enable else None,
    )
    watchdog = None if hang is None else _hang_watchdog(context, hang, errors)
    goodput = None
    if config.goodput.enable:
        deadlines = hang.deadlines if hang is not None else None
        goodput = Goodput(config, store, phases, rank.rank, deadlines, lambda exc: errors.absorb("goodput", exc))
    fall_back = WriterFallback(context)
    context.fall_back = fall_back
    try:
        sinks = [*build_sinks(context), *_made(given_sinks, context, Sink)]
    except BaseException:  # the monitor is not constructed: nothing it started may outlive the error
        if goodput is not None:
            with contextlib.suppress(Exception):
                goodput.close()
        raise
    errors.expect(sink.name for sink in sinks)
    # After the expected ones: a run that did not ask for the line gets no error series for it until it fails.
    sinks += console.progress_line(context)
    publisher = StepPublisher(step_probes, thresholds, actions, sinks, batch, errors, breaker)
    fingerprints, flips = _replica_checks(context, publisher, announce) if config.divergence.enable else (None, None)
    sampler = None
    if memory is not None:
        sampler = MemorySampler(
            memory, config.memory_interval, breaker, thresholds.check_slow, lambda exc: errors.absorb("sampler", exc)
        )
    hardware = _hardware(config, store, rank, breaker)
    if hardware is not None:
        errors.expect(component(reader) for reader in hardware.readers)
    # Threads first (they stop first at the end), then what acts on the run before anything reads it (lr_backoff
    # wraps a schedule before the probes read it), the probes, the features, and the sinks last (goodput's last
    # save reaches the final push).
    features: list[Part | None] = [sampler, watchdog, hardware, actions, *probes, goodput, flips, fingerprints, *sinks]
    parts = [part for part in features if part is not None]
    fall_back.bind(parts, publisher)
    return Assembly(parts, sinks, publisher, errors, breaker, batch, hook_cost)


def _hang_watchdog(context: PartContext, hang: HangDeadlineProbe, errors: ErrorSink) -> HangWatchdog:
    """The thread that dumps the stacks of a phase past its deadline, and its debug page where asked."""
    config = context.config
    watchdog = HangWatchdog(
        context.phases,
        hang.current,
        context.store,
        config.save_dir,
        context.rank.rank,
        lambda exc: errors.absorb("watchdog", exc),
        config.hang.native_stacks,
        config.project,
    )
    if config.hang.debug_endpoint:
        context.debug_pages[STACKS_PATH] = DebugPage(
            lambda: watchdog.latest, "No hang dump yet: this rank has not outlasted a hang deadline"
        )
    return watchdog


def _replica_checks(
    context: PartContext, publisher: StepPublisher, announce: Announce
) -> tuple[Fingerprints, BitFlips | None]:
    """The replica fingerprints and checks, the drills' bit flips where allowed and asked for (built before the
    checks: they read the flipped bits), and the checks' debug page."""
    divergence = context.config.divergence
    fingerprints = Fingerprints(context.store, divergence, context.rank, publisher.layouts, announce)
    flips = None
    if divergence.allow_injection and divergence.inject_flips:
        flips = BitFlips(divergence.inject_flips, context.rank.rank)
    if divergence.check_every_step:
        context.debug_pages[CHECKSUMS_PATH] = DebugPage(
            fingerprints.checksums_page, "No replica checks yet: this rank has no replica group, or no step has ended"
        )
    return fingerprints, flips


def _hardware(config: MonitorConfig, store: MetricStore, rank: RankInfo, breaker: Breaker) -> HardwareMonitor | None:
    """The hardware monitor over every configured reader that finds a device here; None when none does. A reader
    whose builder fails is left out and counted (the others and the training go on)."""
    section = config.hardware
    if not section.enable:
        return None
    readers = []
    for name in section.readers:
        try:
            readers.extend(registry.READERS[name].build(section))
        except Exception as exc:
            breaker.failed(f"hardware.{name}", exc, 0, "the other readers and the training go on")
    if not readers:
        return None
    return HardwareMonitor(readers, store, section.interval, section.timeout, breaker, join_labels(rank.node))


def _made(given: Iterable[Given], context: PartContext, kind: type[_Kind]) -> list[_Kind]:
    """The handed-in parts of `kind`: each one as it is, or what its builder made of the context."""
    made: list[_Kind] = []
    for item in given:
        built = item if isinstance(item, kind) or not callable(item) else item(context)
        for part in built if isinstance(built, (list, tuple)) else (built,):
            if not isinstance(part, kind):
                what = "probes" if kind is Probe else "sinks"
                raise ConfigError(
                    [
                        f"{what}=: each item must be a {kind.__name__} or a callable that takes the PartContext and "
                        f"returns one (or a list of them), got {part!r}"
                    ]
                )
            made.append(part)
    return made


def _first(parts: Iterable[Any], kind: type[_Kind]) -> _Kind | None:
    return next((part for part in parts if isinstance(part, kind)), None)
