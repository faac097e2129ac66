"""data_quality: the batch's statistics against hand-computed values, baselines and streaks, the list of a drop's
batches, the on_batch hook through the callback (names, sink mode, a failing part), and the config's checks. A real
training: tests/integration/test_data_quality.py."""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

import mindspore as ms
import numpy as np
import pytest

from ms_exporter import TrainingMonitor
from ms_exporter.actions.low_batches import SkippedBatchList
from ms_exporter.actions.skipped_batches import SkippedBatches, sample_hash
from ms_exporter.config import ConfigError, DataQualityConfig, load_config
from ms_exporter.core import catalogue as c
from ms_exporter.core.probe import Probe
from ms_exporter.core.store import MetricStore
from ms_exporter.probes.data_quality import DataQualityProbe, class_ids, entropy_bits
from tests.support.cb_params import context

NAMES = ("input_ids", "attention_mask", "label")
TRAINING = {"dataset_sink_mode": False, "batch_num": 10, "cur_epoch_num": 1}


def section(**settings: Any) -> DataQualityConfig:
    return load_config({"data_quality": {"enable": True, **settings}}).data_quality


def probe(store: MetricStore, batch_list: Any = None, **settings: Any) -> DataQualityProbe:
    made = DataQualityProbe(store, section(**settings), "attention_mask", "input_ids", batch_list)
    made.on_train_begin(TRAINING)
    return made


def gauge(store: MetricStore, family: c.MetricFamily, **labels: str) -> float | None:
    """The series' value, None while it does not exist (no invented values)."""
    found = [s for s in store.series_of(family) if dict(s.labels) == labels]
    return found[0].value if found else None


def batch(labels: list[int], lengths: list[int] | None = None, width: int = 6, seed: int = 0) -> list[ms.Tensor]:
    """input_ids (distinct random ids 1-99, padded with 0 past each length), attention_mask, label."""
    rng = np.random.default_rng(seed)
    lengths = lengths if lengths is not None else [width] * len(labels)
    ids = rng.integers(1, 100, size=(len(labels), width)).astype(np.int32)
    mask = (np.arange(width)[None, :] < np.array(lengths)[:, None]).astype(np.int32)
    return [ms.Tensor(ids * mask), ms.Tensor(mask), ms.Tensor(np.array(labels, np.int32))]


BALANCED = [0, 1, 2, 3]  # 2 bits
ONE_CLASS = [2, 2, 2, 2]  # 0 bits


# -- the statistics ------------------------------------------------------------------------------------------------


def test_entropy_against_hand_computed_values() -> None:
    assert entropy_bits(np.array([0, 1, 2, 3])) == 2.0
    assert entropy_bits(np.array([5, 5, 9, 9])) == 1.0
    # 3/4 and 1/4: -(0.75 log2 0.75 + 0.25 log2 0.25)
    assert entropy_bits(np.array([0, 0, 0, 1])) == pytest.approx(0.8112781244591328, abs=1e-15)
    assert entropy_bits(np.array([7, 7, 7])) == 0.0 and math.copysign(1, entropy_bits(np.array([7]))) == 1
    # Class ids beyond what one count array holds are counted by sorting: the same answer.
    assert entropy_bits(np.array([0, 2**40, 2**40, 3])) == 1.5


def test_class_ids_read_the_label_forms_training_data_has() -> None:
    assert class_ids(np.array([1, -100, 2, -100])).tolist() == [1, 2]  # an ignore index is no label
    one_hot = np.array([[0, 1, 0], [1, 0, 0], [0.1, 0.2, 0.7]], np.float32)
    assert class_ids(one_hot).tolist() == [1, 0, 2]
    assert class_ids(np.array([[1.0], [0.0], [1.0]], np.float32)).tolist() == [1, 0, 1]  # labels stored as floats
    assert class_ids(np.array([0.25, 1.5], np.float32)) is None  # regression targets: no classes
    assert class_ids(np.array([True, False])).tolist() == [True, False]
    assert class_ids(np.array(["a", "b"])) is None


def test_lengths_padding_duplicates_empty_and_out_of_vocab_from_the_mask() -> None:
    store = MetricStore()
    dq = probe(store, label_column="label", vocab_size=100)
    columns = batch([0, 1, 0, 1], lengths=[6, 3, 0, 3])
    ids = columns[0].asnumpy().copy()
    ids[0, 5] = 100  # an id at vocab_size, one below 0 in the text and one in the padding (not counted)
    ids[1, 0] = -7
    ids[2, 4] = -1
    ids[3] = ids[1]  # the 4th sample repeats the 2nd
    columns[0] = ms.Tensor(ids)
    dq.on_batch(1, columns, NAMES)
    assert gauge(store, c.DATA_SEQUENCE_LENGTH) == 3.0  # (6 + 3 + 0 + 3) / 4
    assert gauge(store, c.DATA_PADDING_RATIO) == 0.5  # 12 of 24 positions
    assert gauge(store, c.DATA_EMPTY_SAMPLES) == 1
    assert gauge(store, c.DATA_DUPLICATE_SAMPLES) == 1  # the empty sample is counted as empty, not as a duplicate
    assert gauge(store, c.DATA_OUT_OF_VOCAB) == 3  # 100 in sample 0, -7 in samples 1 and 3; not the -1 of padding
    assert gauge(store, c.DATA_CHECKED_SAMPLES) == 4
    assert gauge(store, c.DATA_LABEL_ENTROPY) == 1.0
    histogram = store.get(c.DATA_SEQUENCE_LENGTH_DISTRIBUTION.name)
    assert histogram is not None
    buckets, count, total = histogram.histogram().cumulative()
    assert count == 4 and total == 12
    assert dict(buckets)[1.0] == 1 and dict(buckets)[4.0] == 3 and dict(buckets)[8.0] == 4


def test_without_a_mask_pad_id_says_what_padding_is_and_without_either_nothing_is_invented(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ids = np.array([[5, 6, 0, 0], [0, 0, 0, 0], [5, 6, 0, 0], [0, 0, 0, 0]], np.int32)
    columns = [ms.Tensor(ids), ms.Tensor(np.array([1, 1, 1, 1], np.int32))]
    store = MetricStore()
    probe(store, pad_id=0).on_batch(1, columns, ("input_ids", "label"))
    assert gauge(store, c.DATA_SEQUENCE_LENGTH) == 1.0
    assert gauge(store, c.DATA_PADDING_RATIO) == 0.75
    # Two empty samples, and one that repeats another: empty samples are not duplicates of each other.
    assert (gauge(store, c.DATA_EMPTY_SAMPLES), gauge(store, c.DATA_DUPLICATE_SAMPLES)) == (2, 1)
    unknown = MetricStore()
    with caplog.at_level(logging.INFO, logger="ms_exporter"):
        probe(unknown).on_batch(1, columns, ("input_ids", "label"))
    assert "no pad_id is set" in caplog.text
    for family in (c.DATA_SEQUENCE_LENGTH, c.DATA_PADDING_RATIO, c.DATA_EMPTY_SAMPLES, c.DATA_LABEL_ENTROPY):
        assert gauge(unknown, family) is None, family.name  # not measured, so no series (not a 0)
    assert gauge(unknown, c.DATA_DUPLICATE_SAMPLES) == 2  # rows are compared whole: the all-zero ones repeat
    assert gauge(unknown, c.DATA_OUT_OF_VOCAB) is None  # no vocab_size


def test_the_token_column_is_found_and_columns_may_be_given_by_position() -> None:
    floats = ms.Tensor(np.ones((2, 3), np.float32))  # a 2-D feature matrix holds no tokens
    tokens = ms.Tensor(np.array([[1, 2, 0], [3, 0, 0]], np.int32))
    labels = ms.Tensor(np.array([[1, 0], [1, 0]], np.int32))  # 2-D integers, but the labels
    store = MetricStore()
    probe(store, label_column=2, pad_id=0).on_batch(1, [floats, tokens, labels], ())
    assert gauge(store, c.DATA_SEQUENCE_LENGTH) == 1.5  # from column 1, found without names
    assert gauge(store, c.DATA_LABEL_ENTROPY) == 1.0
    named = MetricStore()
    probe(named, token_column="b", pad_id=0).on_batch(
        1, [tokens, ms.Tensor(np.array([[4, 4, 4], [0, 0, 0]]))], ("a", "b")
    )
    assert gauge(named, c.DATA_SEQUENCE_LENGTH) == 1.5 and gauge(named, c.DATA_EMPTY_SAMPLES) == 1


def test_a_column_the_dataset_does_not_have_is_said_once(caplog: pytest.LogCaptureFixture) -> None:
    store = MetricStore()
    dq = probe(store, label_column="labels")
    with caplog.at_level(logging.INFO, logger="ms_exporter"):
        dq.on_batch(1, batch(BALANCED), NAMES)
        dq.on_train_begin(TRAINING)
        dq.on_batch(2, batch(BALANCED), NAMES)
    assert caplog.text.count("data_quality.label_column 'labels' is not a column of the dataset") == 1
    assert "['input_ids', 'attention_mask', 'label']" in caplog.text
    assert gauge(store, c.DATA_LABEL_ENTROPY) is None and gauge(store, c.DATA_SEQUENCE_LENGTH) == 6


def test_every_n_steps_measures_the_first_batch_then_every_nth() -> None:
    store = MetricStore()
    dq = probe(store, label_column="label", every_n_steps=3)
    for step in range(1, 11):
        dq.on_batch(step, batch(BALANCED), NAMES)
    assert gauge(store, c.DATA_CHECKED_SAMPLES) == 4 * 4  # steps 1, 4, 7 and 10


# -- baselines and streaks -----------------------------------------------------------------------------------------


def test_the_baseline_is_the_median_of_the_first_batches_and_its_series_come_with_it() -> None:
    store = MetricStore()
    dq = probe(store, label_column="label", baseline_steps=3)
    for step, labels in enumerate(([0, 1, 2, 3], [0, 0, 1, 1], [0, 0, 0, 1]), start=1):  # 2, 1, 0.811 bits
        assert gauge(store, c.DATA_QUALITY_BASELINE, quantity=c.LABEL_ENTROPY) is None
        dq.on_batch(step, batch(labels), NAMES)
    assert gauge(store, c.DATA_QUALITY_BASELINE, quantity=c.LABEL_ENTROPY) == 1.0  # the median
    assert gauge(store, c.DATA_QUALITY_BASELINE, quantity=c.SEQUENCE_LENGTH) == 6.0
    assert gauge(store, c.DATA_QUALITY_LOW_STREAK, quantity=c.LABEL_ENTROPY) == 0
    assert gauge(store, c.DATA_QUALITY_LOW, quantity=c.LABEL_ENTROPY) == 0


def test_a_drop_is_streak_low_batches_in_a_row_and_a_dip_is_not() -> None:
    store = MetricStore()
    dq = probe(store, label_column="label", baseline_steps=2, streak=3, drop_ratio=0.5)

    def state() -> tuple[float | None, float | None]:
        return (
            gauge(store, c.DATA_QUALITY_LOW_STREAK, quantity=c.LABEL_ENTROPY),
            gauge(store, c.DATA_QUALITY_LOW, quantity=c.LABEL_ENTROPY),
        )

    seen = []
    # Baseline 2 bits: 1 bit is not low (not below 0.5 x 2), 0.811 and 0 are.
    plan = [BALANCED, BALANCED, ONE_CLASS, ONE_CLASS, BALANCED, [0, 0, 1, 1], [0, 0, 0, 1], ONE_CLASS, ONE_CLASS]
    for step, labels in enumerate(plan, start=1):
        dq.on_batch(step, batch(labels), NAMES)
        seen.append(state())
    assert seen[2:] == [(1, 0), (2, 0), (0, 0), (0, 0), (1, 0), (2, 0), (3, 1)]
    dq.on_batch(10, batch(BALANCED), NAMES)
    assert state() == (0, 0)
    assert gauge(store, c.DATA_QUALITY_LOW, quantity=c.SEQUENCE_LENGTH) == 0  # the lengths never moved


def test_the_sequence_length_drops_on_its_own() -> None:
    store = MetricStore()
    dq = probe(store, baseline_steps=1, streak=2)
    dq.on_batch(1, batch(BALANCED, lengths=[6, 6, 6, 6]), NAMES)
    dq.on_batch(2, batch(BALANCED, lengths=[2, 2, 3, 1]), NAMES)
    dq.on_batch(3, batch(BALANCED, lengths=[2, 2, 2, 2]), NAMES)
    assert gauge(store, c.DATA_QUALITY_LOW, quantity=c.SEQUENCE_LENGTH) == 1
    assert gauge(store, c.DATA_QUALITY_LOW, quantity=c.LABEL_ENTROPY) is None  # no label_column


# -- the list: a drop's batches, never a dip's --------------------------------------------------------------------


class Listed:
    """A BatchList that keeps what it is given (the real one is tested below)."""

    def __init__(self) -> None:
        self.entries: list[dict[str, Any]] = []
        self.flushed = 0
        self.full = False

    def identify(
        self, step: int, epoch: int, position: int | None, columns: Any, details: dict[str, Any]
    ) -> dict[str, Any]:
        return {"step": step, "epoch": epoch, "position": position, **details}

    def add(self, entries: list[dict[str, Any]]) -> None:
        self.entries += entries

    def flush(self) -> None:
        self.flushed += 1


def test_a_drop_lists_its_streak_and_what_follows_a_dip_lists_nothing() -> None:
    listed = Listed()
    dq = probe(MetricStore(), listed, label_column="label", baseline_steps=2, streak=3)
    plan = [BALANCED, BALANCED, ONE_CLASS, ONE_CLASS, BALANCED, ONE_CLASS, ONE_CLASS, ONE_CLASS, ONE_CLASS, BALANCED]
    for step, labels in enumerate(plan, start=1):
        dq.on_batch(step, batch(labels), NAMES)
    assert [entry["step"] for entry in listed.entries] == [6, 7, 8, 9]  # the dip of steps 3-4 is not listed
    first = listed.entries[0]
    assert first["reason"] == "data_quality" and (first["epoch"], first["position"]) == (1, 6)
    assert first["quantities"] == {c.LABEL_ENTROPY: {"value": 0.0, "baseline": 2.0}}
    dq.on_train_end(10, True)
    assert listed.flushed == 1


def test_the_list_file_holds_the_drop_with_rollbacks_hashes_and_stops_at_max_listed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store = MetricStore()
    failures: list[BaseException] = []
    real = SkippedBatchList(tmp_path, 3, 3, store, failures.append)
    dq = probe(store, real, label_column="label", baseline_steps=1, streak=2)
    batches = {step: batch(BALANCED if step == 1 else ONE_CLASS, seed=step) for step in range(1, 7)}
    with caplog.at_level(logging.WARNING, logger="ms_exporter"):
        for step, columns in batches.items():
            dq.on_batch(step, columns, NAMES)
        dq.on_train_end(6, True)
    listed = SkippedBatches(tmp_path).read()
    assert [entry["step"] for entry in listed] == [2, 3, 4]  # max_listed 3
    assert caplog.text.count("data_quality has listed 3 batches") == 1
    assert gauge(store, c.DATA_LISTED_BATCHES) == 3 and failures == []
    rows = [tensor.asnumpy() for tensor in batches[2]]
    assert listed[0]["sample_hashes"] == [sample_hash([column[i] for column in rows]) for i in range(4)]
    assert listed[0]["rank"] == 3 and listed[0]["reason"] == "data_quality"


def test_a_list_that_cannot_be_written_is_counted_not_raised(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("a file where save_dir should be a directory\n")
    failures: list[BaseException] = []
    real = SkippedBatchList(blocked, 0, 10, MetricStore(), failures.append)
    real.add([{"step": 1}])
    real.flush()
    assert len(failures) == 1


# -- through the callback ------------------------------------------------------------------------------------------


def monitor(tmp_path: Path, **data_quality: Any) -> TrainingMonitor:
    return TrainingMonitor(
        port=0, backend="local", save_dir=str(tmp_path), data_quality={"enable": True, **data_quality}
    )


def test_the_callback_hands_the_batch_and_its_column_names_at_step_begin(tmp_path: Path) -> None:
    watcher = monitor(tmp_path, label_column="label", baseline_steps=1)
    try:
        watcher.on_train_begin(context(0, 0.0))
        for step in (1, 2):
            columns = batch(BALANCED if step == 1 else ONE_CLASS)
            watcher.on_train_step_begin(context(step, 1.0, element=columns))
            # Measured at step begin: the value is there before the step ends or is published.
            expected = 2.0 if step == 1 else 0.0
            assert gauge(watcher.store, c.DATA_LABEL_ENTROPY) == expected
            watcher.on_train_step_end(context(step, 1.0, element=columns))
        watcher.on_train_end(context(2, 0.0))
        # The fake dataset names its columns input_ids, attention_mask, label: the mask was found by name.
        assert gauge(watcher.store, c.DATA_PADDING_RATIO) == 0.0
        assert gauge(watcher.store, c.ERRORS, component="data_quality") == 0  # shown from the start
    finally:
        watcher.close()


def test_sink_mode_gets_no_batch_and_one_info_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    watcher = monitor(tmp_path, label_column="label")
    try:
        with caplog.at_level(logging.INFO, logger="ms_exporter"):
            for _ in range(2):  # two training calls: said once
                watcher.on_train_begin(context(0, 0.0, sink_size=10))
                for sink in (1, 2):
                    # In sink mode the element is no batch of data (the data sits in the device queue).
                    element = batch(ONE_CLASS)
                    watcher.on_train_step_begin(context(sink * 10, 1.0, sink_size=10, element=element))
                    watcher.on_train_step_end(context(sink * 10, 1.0, sink_size=10, element=element))
                watcher.on_train_end(context(20, 0.0, sink_size=10))
    finally:
        watcher.close()
    assert caplog.text.count("data_quality measures nothing in dataset sink mode") == 1
    assert gauge(watcher.store, c.DATA_CHECKED_SAMPLES) is None
    assert gauge(watcher.store, c.DATA_LABEL_ENTROPY) is None


def test_a_step_without_a_batch_measures_nothing(tmp_path: Path) -> None:
    watcher = monitor(tmp_path, label_column="label")
    try:
        watcher.on_train_begin(context(0, 0.0))
        watcher.on_train_step_begin(context(1, 1.0))  # a script's own run_context: no train_dataset_element
        watcher.on_train_step_end(context(1, 1.0))
    finally:
        watcher.close()
    assert gauge(watcher.store, c.DATA_CHECKED_SAMPLES) is None
    assert gauge(watcher.store, c.ERRORS, component="data_quality") == 0


class Failing(Probe):
    name = "failing_batches"

    def __init__(self) -> None:
        self.calls = 0

    def on_batch(self, step: int, columns: Any, names: tuple[str, ...]) -> None:
        self.calls += 1
        raise RuntimeError("cannot read this batch")


def test_a_part_that_fails_on_batches_is_counted_and_left_out_after_three(tmp_path: Path) -> None:
    failing = Failing()
    watcher = TrainingMonitor(
        port=0,
        backend="local",
        save_dir=str(tmp_path),
        data_quality={"enable": True, "label_column": "label"},
        probes=[failing],
    )
    try:
        watcher.on_train_begin(context(0, 0.0))
        for step in range(1, 6):
            columns = batch(BALANCED)
            watcher.on_train_step_begin(context(step, 1.0, element=columns))
            watcher.on_train_step_end(context(step, 1.0, element=columns))
    finally:
        watcher.close()
    assert failing.calls == 3
    assert gauge(watcher.store, c.ERRORS, component="failing_batches") == 3
    assert gauge(watcher.store, c.COMPONENT_DISABLED, component="failing_batches") == 1
    assert gauge(watcher.store, c.DATA_CHECKED_SAMPLES) == 5 * 4  # the data_quality probe went on


def test_off_by_default_and_nothing_registered(tmp_path: Path) -> None:
    watcher = TrainingMonitor(port=0, backend="local", save_dir=str(tmp_path))
    try:
        assert watcher.config.data_quality.enable is False
        assert not any(isinstance(part, DataQualityProbe) for part in watcher.parts)
        assert watcher.store.get(c.DATA_LABEL_ENTROPY.name) is None
    finally:
        watcher.close()


# -- the config ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("settings", "problem"),
    [
        (
            {"label_column": 1.5},
            "data_quality.label_column: must be a column name (a non-empty string) or its position",
        ),
        ({"token_column": -1}, "data_quality.token_column: must be a column name"),
        (
            {"label_column": "x", "token_column": "x"},
            "data_quality.token_column: must be another column than label_column",
        ),
        ({"drop_ratio": 1}, "data_quality.drop_ratio: must be a number between 0 and 1 (exclusive)"),
        ({"streak": 0}, "data_quality.streak: must be an integer from 1 to 1000000"),
        ({"pad_id": "0"}, "data_quality.pad_id: must be an integer from -2147483648 to 2147483647"),
        ({"vocab_size": 0}, "data_quality.vocab_size: must be an integer from 1 to 1000000000"),
        ({"every_n_steps": 0}, "data_quality.every_n_steps: must be an integer from 1 to 1000000"),
        ({"lable_column": "label"}, "data_quality.lable_column: unknown key"),
    ],
)
def test_config_errors_name_the_key(settings: dict[str, Any], problem: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config({"data_quality": {"enable": True, **settings}})
    assert any(p.startswith(f"monitor_config.{problem}") for p in info.value.problems), info.value.problems


def test_the_defaults_come_from_the_thresholds() -> None:
    from ms_exporter.core.thresholds import DATA_QUALITY_DROP_RATIO, DATA_QUALITY_STREAK

    config = load_config({}).data_quality
    assert (config.drop_ratio, config.streak) == (DATA_QUALITY_DROP_RATIO, DATA_QUALITY_STREAK) == (0.5, 5)
    assert json.loads(json.dumps(load_config({}).to_dict()["data_quality"]))["list_batches"] is False
