"""How each built-in probe is made from the configuration: the builders core/registry.py names, one per probe.

A builder returns the probe in a list, or an empty list when the configuration switches it off. The `metrics`
group of a registry entry has already been checked when its builder runs (`groups` in core/registry.py); a probe
with a section of its own (hang, flops, grad_norm, layernorm) checks that section here.
"""

from __future__ import annotations

from ms_exporter.config import MonitorConfig
from ms_exporter.core.part import PartContext
from ms_exporter.core.probe import Probe
from ms_exporter.probes.activations import ActivationsProbe
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
from ms_exporter.probes.slowness import SlownessProbe
from ms_exporter.probes.step_time import StepTimeProbe
from ms_exporter.probes.throughput import ThroughputProbe
from ms_exporter.probes.update_ratio import UpdateRatioProbe
from ms_exporter.probes.weight_norm import WeightNormProbe


def identity(context: PartContext) -> list[Probe]:
    """mindspore_train_info and the world size, written once: no probe follows the steps for them."""
    import mindspore

    config: MonitorConfig = context.config
    device_target = str(mindspore.get_context("device_target"))
    publish_identity(context.store, context.rank, device_target, mindspore.__version__, config.tags)
    return []


def progress(context: PartContext) -> list[Probe]:
    return [ProgressProbe(context.store)]


def hang_deadline(context: PartContext) -> list[Probe]:
    config: MonitorConfig = context.config
    return [HangDeadlineProbe(context.store, config.hang, context.phases)] if config.hang.enable else []


def loss(context: PartContext) -> list[Probe]:
    return [LossProbe(context.store, context.config.loss_window)]


def learning_rate(context: PartContext) -> list[Probe]:
    return [LearningRateProbe(context.store, context.config.pure_lr_schedules)]


def step_time(context: PartContext) -> list[Probe]:
    return [StepTimeProbe(context.store)]


def slowness(context: PartContext) -> list[Probe]:
    config: MonitorConfig = context.config
    if not config.failslow.enable:
        return []
    return [SlownessProbe(context.store, context.rank, config.divergence.model_parallel)]


def throughput(context: PartContext) -> list[Probe]:
    config: MonitorConfig = context.config
    return [ThroughputProbe(context.store, config.wants("samples_per_second"), config.wants("tokens_per_second"))]


def mfu(context: PartContext) -> list[Probe]:
    config: MonitorConfig = context.config
    return [MfuProbe(context.store, config.flops, context.rank.world_size)] if config.flops.enable else []


def loss_scale(context: PartContext) -> list[Probe]:
    return [LossScaleProbe(context.store, context.config.grad_norm.every_n_steps)]


def grad_norm(context: PartContext) -> list[Probe]:
    config: MonitorConfig = context.config
    return [GradNormProbe(context.store, config.grad_norm)] if config.grad_norm.enable else []


def weight_norm(context: PartContext) -> list[Probe]:
    config: MonitorConfig = context.config
    return [WeightNormProbe(context.store, config.grad_norm)] if config.weight_norm else []


def update_ratio(context: PartContext) -> list[Probe]:
    config: MonitorConfig = context.config
    return [UpdateRatioProbe(context.store, config.update_ratio)] if config.update_ratio.enable else []


def activations(context: PartContext) -> list[Probe]:
    config: MonitorConfig = context.config
    return [ActivationsProbe(context.store, config.activations)] if config.activations.enable else []


def layernorm(context: PartContext) -> list[Probe]:
    config: MonitorConfig = context.config
    return [LayerNormProbe(context.store, config.layernorm)] if config.layernorm.enable else []


def memory(context: PartContext) -> list[Probe]:
    config: MonitorConfig = context.config
    return [MemoryProbe(context.store, config.warmup_steps, config.memory_window, config.memory_interval)]


def evaluation(context: PartContext) -> list[Probe]:
    return [EvalProbe(context.store)]
