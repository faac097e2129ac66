"""The update-ratio probe: ||w - w_before|| / ||w|| per layer between samples, the extremes and the median."""

from __future__ import annotations

import math

import mindspore as ms
import numpy as np
import pytest
from mindspore.train.callback import _InternalCallbackParam

from ms_exporter.config import ConfigError, UpdateRatioConfig, load_config
from ms_exporter.core import catalogue as c
from ms_exporter.core.device import device_reductions
from ms_exporter.core.sample import StepSample
from ms_exporter.core.store import MetricStore
from ms_exporter.probes.update_ratio import UpdateRatioProbe


class Param:
    """A real Parameter whose values the test changes in place, as the optimizer does (ops.assign)."""

    def __init__(self, name: str, values: list[float]) -> None:
        self.parameter = ms.Parameter(ms.Tensor(np.asarray(values, np.float32)), name=name)

    @property
    def values(self) -> np.ndarray:
        return np.array(self.parameter.asnumpy())

    @values.setter
    def values(self, values: np.ndarray) -> None:
        ms.ops.assign(self.parameter, ms.Tensor(np.asarray(values, np.float32)))


class Network:
    def __init__(self, weights: list[Param]) -> None:
        self.weights = [w.parameter for w in weights]


def begin(probe: UpdateRatioProbe, weights: list[Param], step: int = 0) -> None:
    cb = _InternalCallbackParam()
    cb.cur_step_num = step
    cb.train_network = Network(weights)
    probe.on_train_begin(cb)


def at(probe: UpdateRatioProbe, step: int) -> None:
    """Step `step` ends and is published."""
    probe.on_step_end(step, None)
    probe.on_step(StepSample(step, 1, 1, 0.5, 0.01, None, 1, 0, 0.0, 0.0))


def ratios(store: MetricStore) -> dict[str, float]:
    return {dict(s.labels)["layer"]: s.value for s in store.series_of(c.LAYER_UPDATE_RATIO)}


def test_the_ratio_is_the_layers_move_over_its_size_and_a_frozen_layer_is_zero() -> None:
    store = MetricStore()
    probe = UpdateRatioProbe(store, UpdateRatioConfig(every_n_steps=10, layers=("head", "body")))
    head = Param("head.weight", [3.0, 4.0])
    body_w, body_b = Param("body.weight", [1.0, 0.0]), Param("body.bias", [0.0, 1.0])
    begin(probe, [head, body_w, body_b])
    at(probe, 1)
    assert ratios(store) == {}  # the first sample has nothing to compare with
    # In place, as the optimizer writes a CPU Parameter: the kept copy must not move with it.
    body_w.values += np.float32(0.5)
    for step in range(2, 10):
        at(probe, step)  # between samples: nothing read
    assert ratios(store) == {}
    at(probe, 10)
    found = ratios(store)
    assert found["head"] == 0.0
    # body moved by ||(0.5, 0.5)|| against ||(1.5, 0.5, 0, 1)||
    assert found["body"] == pytest.approx(math.sqrt(0.5) / math.sqrt(1.5**2 + 0.5**2 + 1.0))
    assert store.value_of(c.UPDATE_RATIO_MEDIAN) == pytest.approx(found["body"] / 2)


def test_the_least_and_most_moved_layers_besides_the_watched_and_stale_ones_removed() -> None:
    store = MetricStore()
    probe = UpdateRatioProbe(store, UpdateRatioConfig(every_n_steps=1, layers=("l0",), top_k=1, max_series=3))
    weights = [Param(f"l{i}.weight", [1.0]) for i in range(5)]
    begin(probe, weights)
    at(probe, 1)
    for i, w in enumerate(weights):
        w.values += np.float32(0.1 * i)  # l4 moves most, l1 least of the others
    at(probe, 2)
    assert set(ratios(store)) == {"l0", "l1", "l4"}
    weights[2].values += np.float32(10.0)  # now l2 moves most
    weights[1].values += np.float32(0.01)
    for w in (weights[3], weights[4]):
        w.values += np.float32(0.2)
    at(probe, 3)
    assert set(ratios(store)) == {"l0", "l1", "l2"}  # l4 left the extremes: no longer exported


def test_a_layer_of_zeros_has_no_ratio_and_a_new_training_call_starts_over() -> None:
    store = MetricStore()
    probe = UpdateRatioProbe(store, UpdateRatioConfig(every_n_steps=1, layers=("z", "a")))
    zero, moving = Param("z.weight", [0.0, 0.0]), Param("a.weight", [1.0, 1.0])
    begin(probe, [zero, moving])
    at(probe, 1)
    moving.values += np.float32(1.0)
    at(probe, 2)
    assert set(ratios(store)) == {"a"}
    begin(probe, [zero, moving], step=2)  # Model.train again: compare from its own first sample
    moving.values += np.float32(5.0)
    at(probe, 3)
    assert ratios(store)["a"] == pytest.approx(1.0 / 2.0)  # unchanged: no comparison across the calls yet


def test_the_section_is_checked_and_sets_the_alert_threshold() -> None:
    from ms_exporter.config.alert_thresholds import thresholds_of

    config = load_config({"update_ratio": {"enable": True, "frozen_fraction": 0.05}})
    assert config.update_ratio.enable and thresholds_of(config).update_ratio_frozen_fraction == 0.05
    with pytest.raises(ConfigError, match=r"update_ratio\.frozen_fraction: must be a number greater than 0"):
        load_config({"update_ratio": {"frozen_fraction": 0}})
    with pytest.raises(ConfigError, match=r"update_ratio\.top_k: the top_k smallest and largest must fit"):
        load_config({"update_ratio": {"top_k": 11, "max_series": 20}})


def test_samples_published_together_compare_the_weights_each_step_ended_with() -> None:
    """The publisher hands a second's steps over at once: the weights are copied as each step ends."""
    store = MetricStore()
    probe = UpdateRatioProbe(store, UpdateRatioConfig(every_n_steps=2, layers=("a",)))
    weights = Param("a.weight", [1.0])
    begin(probe, [weights])
    for step in (1, 2):
        probe.on_step_end(step, None)
        weights.values += np.float32(1.0)
    assert ratios(store) == {}  # nothing published yet
    for step in (1, 2):
        probe.on_step(StepSample(step, 1, 1, 0.5, 0.01, None, 1, 0, 0.0, 0.0))
    assert ratios(store) == {"a": pytest.approx(1.0 / 2.0)}  # 1 -> 2 at the two step ends, not 3 -> 3 now


def test_a_large_weight_is_read_at_sketch_size_positions_and_its_ratio_estimated_within_the_stated_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    rng = np.random.default_rng(11)
    values = rng.normal(0, 1, 200_000).astype(np.float32)
    moved = values + rng.normal(0, 0.01, values.size).astype(np.float32)
    exact = float(np.linalg.norm((moved - values).astype(np.float64)) / np.linalg.norm(moved.astype(np.float64)))
    store = MetricStore()
    probe = UpdateRatioProbe(store, UpdateRatioConfig(every_n_steps=1, layers=("big",), sketch_size=1024))
    big = Param("big.weight", values.tolist())
    begin(probe, [big])
    read: list[int] = []
    original = ms.Tensor.asnumpy
    # What an accelerator moves: compiled, not read in place as on the CPU target.
    monkeypatch.setattr(device_reductions, "read_in_place", False)

    def counted(tensor: ms.Tensor) -> np.ndarray:
        array = original(tensor)
        read.append(array.nbytes)
        return array

    monkeypatch.setattr(ms.Tensor, "asnumpy", counted)
    at(probe, 1)
    monkeypatch.setattr(ms.Tensor, "asnumpy", original)
    big.values = moved
    at(probe, 2)
    assert read == [4 * 1024]  # one transfer of the positions' values, not the 800 kB weight
    stated = 1 / math.sqrt(2 * 1024)
    assert ratios(store)["big"] == pytest.approx(exact, rel=3 * stated)
