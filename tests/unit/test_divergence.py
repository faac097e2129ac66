"""Replica groups from MindSpore's documented layouts, the fingerprint's sensitivity, and the naming rule."""

from __future__ import annotations

import mindspore as ms
import numpy as np
import pytest

from ms_exporter.config import ConfigError, load_config
from ms_exporter.core import catalogue as c
from ms_exporter.core.analysis.replicas import ParallelLayout, disagreeing, parallel_groups, read_layout, replica_group
from ms_exporter.core.output_layout import LayoutResolver
from ms_exporter.core.ranks import RankInfo
from ms_exporter.core.store import MetricStore
from ms_exporter.features.fingerprint import Fingerprints, fingerprint


def groups(layout: ParallelLayout, model_parallel: int | None = None) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for rank in range(layout.world_size):
        group, why = replica_group(rank, layout, model_parallel)
        assert group is not None, why
        found.setdefault(group, []).append(rank)
    return found


def test_groups_follow_the_layouts_mindspore_documents() -> None:
    assert groups(ParallelLayout("data_parallel", 8)) == {"0": list(range(8))}
    # dp 2 x mp 4: ranks 0-3 hold the 4 shards of replica 0, ranks 4-7 those of replica 1.
    assert groups(ParallelLayout("semi_auto_parallel", 8), model_parallel=4) == {
        "0": [0, 4],
        "1": [1, 5],
        "2": [2, 6],
        "3": [3, 7],
    }
    # 2 pipeline stages of 4 ranks, each dp 2 x mp 2.
    assert groups(ParallelLayout("semi_auto_parallel", 8, stages=2), model_parallel=2) == {
        "0": [0, 2],
        "1": [1, 3],
        "2": [4, 6],
        "3": [5, 7],
    }
    # dataset_strategy ((4, 1), (4, 1)) splits the batch 4 ways: mp = 8 / 4.
    assert groups(ParallelLayout("auto_parallel", 8, data_parallel=4)) == {"0": [0, 2, 4, 6], "1": [1, 3, 5, 7]}


def members(layout: ParallelLayout, kind: str, model_parallel: int | None = None) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for rank in range(layout.world_size):
        group = parallel_groups(rank, layout, model_parallel).get(kind)
        if group is not None:
            found.setdefault(group, []).append(rank)
    return found


def test_stages_and_model_copies_follow_the_same_layouts() -> None:
    # 2 pipeline stages of 4 ranks, each dp 2 x mp 2: copy 0 is ranks 0, 1 of stage 0 and 4, 5 of stage 1.
    layout = ParallelLayout("semi_auto_parallel", 8, stages=2)
    assert members(layout, "stage", 2) == {"0": [0, 1, 2, 3], "1": [4, 5, 6, 7]}
    assert members(layout, "replica", 2) == {"0": [0, 1, 4, 5], "1": [2, 3, 6, 7]}
    # dp 2 x mp 4 in one stage: no stage group, copies of 4.
    assert members(ParallelLayout("semi_auto_parallel", 8), "stage", 4) == {}
    assert members(ParallelLayout("semi_auto_parallel", 8), "replica", 4) == {"0": [0, 1, 2, 3], "1": [4, 5, 6, 7]}
    # A copy of one rank is the rank; one copy is the whole job: neither is a group. Nor is anything unknown.
    assert parallel_groups(3, ParallelLayout("data_parallel", 8)) == {}
    assert parallel_groups(3, ParallelLayout("semi_auto_parallel", 8, stages=2), 4) == {"stage": "0"}
    assert parallel_groups(3, ParallelLayout("semi_auto_parallel", 8)) == {}
    assert parallel_groups(3, ParallelLayout("stand_alone", 8)) == {}


@pytest.mark.parametrize(
    ("layout", "model_parallel", "reason"),
    [
        (ParallelLayout("data_parallel", 1), None, "one rank"),
        (ParallelLayout("stand_alone", 8), None, "train apart"),
        (ParallelLayout("semi_auto_parallel", 8), None, "set divergence.model_parallel"),
        (ParallelLayout("semi_auto_parallel", 8, stages=3), 2, "do not split into 3 pipeline stages"),
        (ParallelLayout("semi_auto_parallel", 8), 3, "does not divide"),
        (ParallelLayout("semi_auto_parallel", 8, stages=2), 4, "no other rank holds the same shards"),
    ],
)
def test_no_group_where_there_are_no_replicas_or_the_layout_does_not_say(
    layout: ParallelLayout, model_parallel: int | None, reason: str
) -> None:
    group, why = replica_group(0, layout, model_parallel)
    assert group is None and reason in why


def test_the_layout_is_read_from_mindspores_context() -> None:
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL)
    try:
        assert read_layout(4) == ParallelLayout("data_parallel", 4, 1, None)
        ms.set_auto_parallel_context(
            parallel_mode=ms.ParallelMode.SEMI_AUTO_PARALLEL, pipeline_stages=2, dataset_strategy=((2, 1), (2, 1))
        )
        assert read_layout(8) == ParallelLayout("semi_auto_parallel", 8, 2, 2)
    finally:
        ms.reset_auto_parallel_context()
    assert read_layout(1).mode == "stand_alone"


def test_the_fingerprint_sees_a_change_of_one_element_by_one_millionth() -> None:
    rng = np.random.default_rng(0)
    weights = [rng.normal(0, 0.02, shape).astype(np.float32) for shape in ((64, 64), (64,), (1000, 64))]
    parameters = [ms.Parameter(ms.Tensor(w), name=f"p{i}") for i, w in enumerate(weights)]
    same = [ms.Parameter(ms.Tensor(w.copy()), name=f"q{i}") for i, w in enumerate(weights)]
    assert fingerprint(parameters) == fingerprint(same)
    for index in range(3):
        moved = [w.copy() for w in weights]
        moved[index].flat[7] *= 1 + 1e-6
        assert moved[index].flat[7] != weights[index].flat[7]  # representable in float32
        changed = [ms.Parameter(ms.Tensor(w), name=f"m{i}") for i, w in enumerate(moved)]
        assert fingerprint(changed) != fingerprint(parameters)
    assert fingerprint(parameters[::-1]) != fingerprint(parameters)  # order is part of it


def test_the_naming_rule() -> None:
    assert disagreeing({0: (300, 1.0), 1: (300, 1.0), 2: (300, 2.0)}) == {2}
    assert disagreeing({0: (300, 1.0), 1: (300, 2.0)}) == {0, 1}  # two that differ: both
    assert disagreeing({0: (300, 1.0), 1: (300, 1.0), 2: (300, 2.0), 3: (300, 2.0)}) == {0, 1, 2, 3}
    assert disagreeing({0: (300, 1.0), 1: (300, 1.0), 2: (300, 1.0)}) == set()
    assert disagreeing({0: (400, 2.0), 1: (300, 1.0), 2: (300, 1.0)}) == set()  # not all at one step yet
    assert disagreeing({0: (300, 1.0)}) == set()


def test_divergence_settings_are_checked() -> None:
    with pytest.raises(ConfigError, match=r"monitor_config.divergence.every_n_steps: must be an integer from 1"):
        load_config({"divergence": {"every_n_steps": 0}})
    assert load_config({"divergence": {"model_parallel": 4}}).divergence.model_parallel == 4


def weights() -> ms.Parameter:
    """A parameter whose values the test changes between fingerprints."""
    return ms.Parameter(ms.Tensor(np.zeros(4, np.float32)), name="w")


def test_a_reading_pairs_each_fingerprint_with_its_own_step() -> None:
    """A scrape reads the fingerprint, then its step; a fingerprint taken in between must not pair the old value
    with the new step (that pair would look like a rank that left its group)."""
    store = MetricStore()
    config = load_config({"divergence": {"replica_group": "0", "every_n_steps": 100}}).divergence
    fingerprints = Fingerprints(store, config, RankInfo(0, 0, 2, "node"), LayoutResolver())
    parameter = weights()
    network = type("Network", (), {"trainable_params": lambda self: [parameter]})()
    fingerprints.on_train_begin({"train_network": network, "cur_step_num": 0})
    assert store.series_of(c.PARAM_FINGERPRINT) == ()  # nothing before the first fingerprint
    assert fingerprints.next_step == 100
    fingerprints.take(100, None)
    old = store.value_of(c.PARAM_FINGERPRINT)
    ms.ops.assign(parameter, ms.Tensor(np.array([1, 0, 0, 0], np.float32)))
    fingerprints.take(200, None)  # between this reader's two reads
    assert store.value_of(c.PARAM_FINGERPRINT_STEP) == 100  # the step of the value it read
    assert store.value_of(c.PARAM_FINGERPRINT) != old and store.value_of(c.PARAM_FINGERPRINT_STEP) == 200
    assert fingerprints.next_step == 300


def test_the_fingerprint_step_carries_the_cells_overflow_flag_and_norm_where_it_reports_them() -> None:
    store = MetricStore()
    config = load_config({"divergence": {"replica_group": "g"}}).divergence
    fingerprints = Fingerprints(store, config, RankInfo(0, 0, 2, "node"), LayoutResolver())
    parameter = weights()
    fingerprints.on_train_begin({"train_network": type("N", (), {"trainable_params": lambda self: [parameter]})()})
    loss = ms.Tensor(0.5, ms.float32)
    fingerprints.take(100, (loss, ms.Tensor(True), ms.Tensor(1024.0, ms.float32)))  # a loss-scale cell's outputs
    assert store.value_of(c.PARAM_FINGERPRINT_OVERFLOW) == 1.0
    assert store.series_of(c.PARAM_FINGERPRINT_GRAD_NORM) == ()  # this cell never reports a norm: no series
    fingerprints.take(200, (loss, ms.Tensor(False), ms.Tensor(1024.0, ms.float32)))
    assert store.value_of(c.PARAM_FINGERPRINT_OVERFLOW) == 0.0
    assert [dict(s.labels) for s in store.series_of(c.PARAM_FINGERPRINT_OVERFLOW)] == [{"replica_group": "g"}]
