"""Gradient, loss-scale and LayerNorm probes fed with hand-made outputs (real training is in integration)."""

from __future__ import annotations

import logging
import math

import mindspore as ms
import numpy as np
import pytest
from mindspore.train.callback import _InternalCallbackParam

from ms_exporter.config import GradNormConfig, LayerNormConfig
from ms_exporter.core.compat import zip_strict
from ms_exporter.core.output_layout import LayoutResolver
from ms_exporter.core.sample import StepSample
from ms_exporter.core.store import MetricStore
from ms_exporter.probes.grad_norm import GradNormProbe, LayerIndex, layer_of
from ms_exporter.probes.layernorm import LayerNormProbe, spread_evenly
from ms_exporter.probes.loss_scale import LossScaleProbe

NAMES = ["embed.table", "block.0.attn.weight", "block.0.attn.bias", "block.1.attn.weight", "head.weight", "head.bias"]


class Param:
    """A real Parameter whose values the test changes in place, as the optimizer does (ops.assign)."""

    def __init__(self, name: str, values: np.ndarray | None = None) -> None:
        self.name = name
        initial = values if values is not None else np.ones(2, np.float32)
        self.parameter = ms.Parameter(ms.Tensor(np.asarray(initial, np.float32)), name=name)

    @property
    def values(self) -> np.ndarray:
        return np.array(self.parameter.asnumpy())

    @values.setter
    def values(self, values: np.ndarray) -> None:
        ms.ops.assign(self.parameter, ms.Tensor(np.asarray(values, np.float32)))


class Weights:
    def __init__(self, names: list[str]) -> None:
        self.params = [Param(n) for n in names]
        self.weights = [p.parameter for p in self.params]


def params(step: int, train_network: object = None) -> _InternalCallbackParam:
    cb = _InternalCallbackParam()
    cb.cur_step_num = step
    cb.train_network = train_network if train_network is not None else Weights(NAMES)
    return cb


def at(step: int, outputs: object, resolver: LayoutResolver) -> StepSample:
    return StepSample(step, 1, 1, 0.5, 0.01, None, 1, 0, 0.0, 0.0, outputs, resolver.resolve(outputs))


def series(store: MetricStore, name: str) -> dict[str, float]:
    family = store.get(name)
    return {dict(s.labels).get("layer", ""): s.value for s in family.children()} if family else {}


def test_layer_grouping_and_watch_patterns() -> None:
    assert layer_of("encoder.layers.0.norm1.gamma") == "encoder.layers.0.norm1"
    assert layer_of("position") == "position"
    index = LayerIndex(NAMES, ("block\\.1", "head"), max_watched=5)
    assert index.watched == ["block.1.attn", "head"]
    assert index.layers["block.0.attn"] == [1, 2]
    norms = dict(zip_strict(index.layer_names, index.layer_norms(np.array([1.0, 3.0, 4.0, 0.0, 6.0, 8.0]))))
    assert norms == {"embed": 1.0, "block.0.attn": 5.0, "block.1.attn": 0.0, "head": 10.0}


def test_a_pattern_that_matches_nothing_is_named_with_the_nearest_layers(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="ms_exporter")
    LayerIndex(NAMES, ("block\\.1", "head\\.weight", "blocks.1.attn"), max_watched=5)
    warned = [record.getMessage() for record in caplog.records]
    assert len(warned) == 1, warned  # a parameter's name (head.weight) is a match too
    assert "'blocks.1.attn' matches no layer" in warned[0] and "block.1.attn" in warned[0].split("nearest")[1]
    caplog.clear()
    LayerIndex([], ("encoder.layer.11",), max_watched=5)  # no parameter names known: nothing to say
    assert not caplog.records


def test_sampling_every_n_steps_top_k_and_zero_layers() -> None:
    store = MetricStore()
    probe = GradNormProbe(
        store, GradNormConfig(every_n_steps=2, layers=("block\\.1",), top_k=2, max_series=4, clip=4.0)
    )
    resolver = LayoutResolver()
    probe.on_train_begin(params(0))
    # (loss, overflow, scale, lr, global_norm, local_norms, sizes): the 7-tuple of MindSpore Transformers.
    first = np.array([1.0, 3.0, 4.0, 0.0, 6.0, 8.0])
    for step in (1, 2, 3):
        probe.on_step(at(step, (0.5, False, 1.0, 1e-3, 12.0, first, None), resolver))
    assert store.get("mindspore_train_grad_norm").series().value == 12.0  # reported, not recomputed
    assert store.get("mindspore_train_grad_norm_distribution").histogram().cumulative()[1] == 1  # step 2 only
    assert store.get("mindspore_train_grad_norm_clipped_total").series().value == 1
    assert series(store, "mindspore_train_layer_grad_norm") == {"block.1.attn": 0.0, "head": 10.0, "block.0.attn": 5.0}
    assert series(store, "mindspore_train_layer_grad_zero_total") == {"block.1.attn": 1}
    # The top two change: block.0.attn drops out and its series is removed.
    later = np.array([9.0, 0.0, 0.0, 2.0, 6.0, 8.0])
    probe.on_step(at(4, (0.5, False, 1.0, 1e-3, 12.0, later, None), resolver))
    assert series(store, "mindspore_train_layer_grad_norm") == {"block.1.attn": 2.0, "head": 10.0, "embed": 9.0}
    assert series(store, "mindspore_train_layer_grad_zero_total") == {"block.1.attn": 1}


def test_norms_from_a_gradient_dict() -> None:
    store = MetricStore()
    probe = GradNormProbe(store, GradNormConfig(every_n_steps=1, top_k=1, max_series=2))
    probe.on_train_begin(params(0))
    grads = {name: ms.Tensor(np.full(4, 0.5 * (i + 1), np.float32)) for i, name in enumerate(NAMES)}
    probe.on_step(at(1, (0.5, grads), LayoutResolver()))
    expected = math.sqrt(sum(4 * (0.5 * (i + 1)) ** 2 for i in range(len(NAMES))))
    assert store.get("mindspore_train_grad_norm").series().value == pytest.approx(expected)
    assert set(series(store, "mindspore_train_layer_grad_norm")) == {"head"}


def test_loss_scale_from_outputs_and_overflow_counting() -> None:
    store = MetricStore()
    probe = LossScaleProbe(store, every_n_steps=10)
    resolver = LayoutResolver()
    probe.on_train_begin(params(0))
    probe.on_step(at(1, (0.5, np.bool_(False), np.float32(1024.0)), resolver))
    assert store.get("mindspore_train_loss_scale").series().value == 1024.0
    probe.on_step(at(2, (0.5, np.bool_(False), np.float32(2048.0)), resolver))  # not sampled, no overflow
    assert store.get("mindspore_train_loss_scale").series().value == 1024.0
    probe.on_step(at(3, (0.5, np.bool_(True), np.float32(512.0)), resolver))  # overflow: read now
    assert store.get("mindspore_train_loss_scale").series().value == 512.0
    assert store.get("mindspore_train_overflow_steps_total").series().value == 1


def test_scalar_outputs_export_no_gradient_series() -> None:
    store = MetricStore()
    probe = GradNormProbe(store, GradNormConfig())
    scale = LossScaleProbe(store, 10)
    probe.on_train_begin(params(0))
    scale.on_train_begin(params(0))
    for step in range(1, 21):
        sample = at(step, np.float32(0.5), LayoutResolver())
        probe.on_step(sample)
        scale.on_step(sample)
    assert store.get("mindspore_train_grad_norm").children() == []
    assert store.get("mindspore_train_loss_scale") is None


class Norm:
    def __init__(self, name: str, values: np.ndarray) -> None:
        self.param = Param(name, values)
        self.gamma = self.param.parameter


class LayerNorm(Norm):
    pass


class Net:
    def __init__(self, cells: list) -> None:
        self._cells = cells

    def cells_and_names(self) -> list:
        return [(str(i), c) for i, c in enumerate(self._cells)]


def test_layernorm_mean_std_and_drift_over_window() -> None:
    store = MetricStore()
    norm = LayerNorm("enc.norm1.gamma", np.array([1.0, 1.0, 1.0, 1.0]))
    probe = LayerNormProbe(store, LayerNormConfig(every_n_steps=1, window=3))
    probe.on_train_begin(params(0, Net([norm, object()])))
    assert series(store, "mindspore_train_layernorm_scale_mean") == {}  # nothing measured before the first step
    resolver = LayoutResolver()
    for step in range(1, 4):
        probe.on_step(at(step, 0.5, resolver))
    assert series(store, "mindspore_train_layernorm_scale_drift_ratio") == {"enc.norm1": 0.0}
    norm.param.values = np.array([1.0, 2.0, 3.0, 2.0])  # mean 2: doubled
    probe.on_step(at(4, 0.5, resolver))
    assert series(store, "mindspore_train_layernorm_scale_mean") == {"enc.norm1": 2.0}
    assert series(store, "mindspore_train_layernorm_scale_std")["enc.norm1"] == pytest.approx(np.std([1, 2, 3, 2]))
    assert series(store, "mindspore_train_layernorm_scale_drift_ratio") == {"enc.norm1": 1.0}
    for step in range(5, 9):  # steady at the new mean: the window forgets the old one
        probe.on_step(at(step, 0.5, resolver))
    assert series(store, "mindspore_train_layernorm_scale_drift_ratio") == {"enc.norm1": 0.0}


def test_a_deep_model_has_max_layers_scales_watched_spread_over_its_depth() -> None:
    store = MetricStore()
    norms = [LayerNorm(f"blocks.{i}.norm.gamma", np.ones(4)) for i in range(10)]
    probe = LayerNormProbe(store, LayerNormConfig(every_n_steps=1, max_layers=4))
    probe.on_train_begin(params(0, Net(norms)))
    probe.on_step(at(1, 0.5, LayoutResolver()))
    watched = {"blocks.0.norm", "blocks.3.norm", "blocks.6.norm", "blocks.9.norm"}
    for family in ("mean", "std", "drift_ratio"):
        assert set(series(store, f"mindspore_train_layernorm_scale_{family}")) == watched


def test_spread_evenly_keeps_order_ends_and_small_lists() -> None:
    assert spread_evenly(list(range(5)), 5) == [0, 1, 2, 3, 4]
    assert spread_evenly(list(range(5)), 9) == [0, 1, 2, 3, 4]
    assert spread_evenly(list(range(65)), 3) == [0, 32, 64]
    assert spread_evenly(list(range(65)), 1) == [64]
    assert len(set(spread_evenly(list(range(25)), 24))) == 24


def test_the_grad_norm_cell_marks_its_outputs_for_the_layout_resolver() -> None:
    from ms_exporter.cells.train_cells import GradNormTrainOneStepCell
    from ms_exporter.core.output_layout import NORMS_WHEN_MEASURED

    assert getattr(GradNormTrainOneStepCell, NORMS_WHEN_MEASURED) is True
    resolver = LayoutResolver()
    resolver.bind(object())  # any other cell: a 3-tuple is (loss, overflow, scale)
    assert resolver.resolve((0.5, False, 1.0)).scale == 2
    resolver.bind(GradNormTrainOneStepCell.__new__(GradNormTrainOneStepCell))
    layout = resolver.resolve((0.5, 1.0, [1.0]))
    assert (layout.global_norm, layout.parameter_norms, layout.measured_by_cell) == (1, 2, True)


def test_weight_norms_are_read_as_the_sampled_step_ends_not_when_published() -> None:
    """The publisher hands a second's steps over at once: a norm read then would be the newest weights' for every
    sample in the batch."""
    from ms_exporter.probes.weight_norm import WeightNormProbe

    store = MetricStore()
    probe = WeightNormProbe(store, GradNormConfig(every_n_steps=2, layers=("head",)))
    network = Weights(NAMES)
    head = next(p for p in network.params if p.name == "head.weight")
    probe.on_train_begin(params(0, network))
    for step in (1, 2, 3, 4):
        head.values = np.full(2, float(step), np.float32)  # the optimizer's update of this step
        probe.on_step_end(step, None)
    assert series(store, "mindspore_train_weight_norm") == {}  # nothing published yet
    probe.on_step(at(2, np.float32(0.5), LayoutResolver()))  # head.weight (2, 2) at step 2, head.bias (1, 1)
    assert series(store, "mindspore_train_weight_norm")["head"] == pytest.approx(math.sqrt(2 * 2.0**2 + 2))
    probe.on_step(at(4, np.float32(0.5), LayoutResolver()))
    assert series(store, "mindspore_train_weight_norm")["head"] == pytest.approx(math.sqrt(2 * 4.0**2 + 2))
