"""One measured quantity per module; each writes to the MetricStore only.

`build_probes` is the one place that decides which probes a configuration gets: adding a metric means its
family in ms_exporter/core/catalogue.py, a probe here (or a new series in an existing one), and a row in
docs/metrics.md.
"""

from __future__ import annotations

from dataclasses import dataclass

from ms_exporter.config import MonitorConfig
from ms_exporter.core.phases import PhaseClock
from ms_exporter.core.probe import Probe
from ms_exporter.core.ranks import RankInfo
from ms_exporter.core.store import MetricStore
from ms_exporter.probes.evaluation import EvalProbe
from ms_exporter.probes.grad_norm import GradNormProbe
from ms_exporter.probes.hang_deadline import HangDeadlineProbe
from ms_exporter.probes.identity import publish_identity
from ms_exporter.probes.layernorm import LayerNormProbe
from ms_exporter.probes.learning_rate import LearningRateProbe
from ms_exporter.probes.loss import LossProbe
from ms_exporter.probes.loss_scale import LossScaleProbe
from ms_exporter.probes.memory import MemoryProbe
from ms_exporter.probes.mfu import MfuProbe
from ms_exporter.probes.progress import ProgressProbe
from ms_exporter.probes.step_time import StepTimeProbe
from ms_exporter.probes.throughput import ThroughputProbe
from ms_exporter.probes.weight_norm import WeightNormProbe


@dataclass
class ProbeSet:
    """The step probes in the order they see each sample, plus the two that are driven from elsewhere."""

    step: list[Probe]
    memory: MemoryProbe | None  # host memory is sampled by the monitor's sampler thread
    eval: EvalProbe | None  # fed at evaluation end, not per step
    hang: HangDeadlineProbe | None = None  # its deadline is what the hang watchdog waits for


def build_probes(config: MonitorConfig, store: MetricStore, rank: RankInfo, phases: PhaseClock) -> ProbeSet:
    if config.wants("global_rank"):
        import mindspore

        publish_identity(store, rank, str(mindspore.get_context("device_target")), mindspore.__version__, config.tags)
    probes: list[Probe] = [ProgressProbe(store)]
    hang = HangDeadlineProbe(store, config.hang, phases) if config.hang.enable else None
    if hang is not None:
        probes.append(hang)
    if config.wants("loss"):
        probes.append(LossProbe(store, config.loss_window))
    if config.wants("lr"):
        probes.append(LearningRateProbe(store, config.pure_lr_schedules))
    if config.wants("step_time"):
        probes.append(StepTimeProbe(store))
    if config.wants("samples_per_second") or config.wants("tokens_per_second"):
        probes.append(ThroughputProbe(store, config.wants("samples_per_second"), config.wants("tokens_per_second")))
    if config.flops.enable:
        probes.append(MfuProbe(store, config.flops, rank.world_size))
    probes.append(LossScaleProbe(store, config.grad_norm.every_n_steps))
    if config.grad_norm.enable:
        probes.append(GradNormProbe(store, config.grad_norm))
    if config.weight_norm:
        probes.append(WeightNormProbe(store, config.grad_norm))
    if config.layernorm.enable:
        probes.append(LayerNormProbe(store, config.layernorm))
    memory = None
    if config.wants("memory_usage"):
        memory = MemoryProbe(store, config.warmup_steps, config.memory_window, config.memory_interval)
        probes.append(memory)
    return ProbeSet(probes, memory, EvalProbe(store) if config.wants("eval") else None, hang)
