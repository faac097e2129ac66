"""data_quality in real training: labels that turn to one class from a known step move the
series, the streak reaches the threshold and the low flag rises; MindSporeTrainingDataQualityDrop, run by Prometheus'
own engine (promtool) over what the rank served at each step, fires for that rank and quantity, and stays quiet for a
healthy run with a one-batch dip; the drop's batches are listed, and a second pass through SkipListedSamples leaves
them out."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import mindspore as ms
import mindspore.dataset as ds
import numpy as np
import pytest
import yaml
from mindspore import nn
from mindspore.train import Callback, Model

from ms_exporter import TrainingMonitor
from ms_exporter.actions.skipped_batches import SkipListedSamples, SkippedBatches, sample_hash
from ms_exporter.core import catalogue as c
from ms_exporter.generate.rules import render_rules, render_yaml
from tests.support.scrape import Scrape, scrape

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool is not installed"),
]

BATCH, SEQ, VOCAB, CLASSES = 16, 12, 50, 4
STEPS = 60
DROP_FROM = 31  # from this step's batch on, every label is class 0
STREAK, BASELINE_STEPS = 5, 10
PROJECT = "dq"
QUANTITIES = (c.LABEL_ENTROPY, c.SEQUENCE_LENGTH)


class Source:
    """Random-access samples (input_ids, label): ids 1 to VOCAB-1 padded with 0 to SEQ from a random length of 4 to
    SEQ; every batch holds each class BATCH / CLASSES times (2 bits), except the batches of `one_class` steps, whose
    labels are all 0 (0 bits). Samples are distinct: a listed one names no other."""

    def __init__(self, one_class: Iterable[int] = ()) -> None:
        rng = np.random.default_rng(0)
        count = STEPS * BATCH
        self.lengths = rng.integers(4, SEQ + 1, size=count)
        self.ids = rng.integers(1, VOCAB, size=(count, SEQ)).astype(np.int32)
        self.ids[np.arange(SEQ)[None, :] >= self.lengths[:, None]] = 0
        per_batch = np.repeat(np.arange(CLASSES), BATCH // CLASSES)
        self.labels = np.concatenate([rng.permutation(per_batch) for _ in range(STEPS)]).astype(np.int32)
        for step in one_class:
            self.labels[(step - 1) * BATCH : step * BATCH] = 0

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        return self.ids[index], self.labels[index]

    def __len__(self) -> int:
        return len(self.labels)

    def mean_length(self, step: int) -> float:
        return float(self.lengths[(step - 1) * BATCH : step * BATCH].mean())


class Classifier(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, 16)
        self.head = nn.Dense(16, CLASSES)

    def construct(self, ids: ms.Tensor) -> ms.Tensor:
        return self.head(self.embedding(ids).mean(axis=1))


class Scrapes(Callback):
    """Placed after the monitor: the rank's /metrics after each step (the probe measured the batch at step begin)."""

    def __init__(self, monitor: TrainingMonitor) -> None:
        self.monitor = monitor
        self.pages: dict[int, Scrape] = {}

    def on_train_step_end(self, run_context: Any) -> None:
        url = self.monitor.url
        assert url is not None
        self.pages[run_context.original_args().cur_step_num] = scrape(url)


def train(source: Any, save_dir: Path, list_batches: bool) -> tuple[TrainingMonitor, Scrapes]:
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    network = Classifier()
    loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")
    model = Model(network, loss, nn.Adam(network.trainable_params(), learning_rate=0.01))
    data = ds.GeneratorDataset(source, ["input_ids", "label"], shuffle=False).batch(BATCH)
    monitor = TrainingMonitor(
        port=0,
        project=PROJECT,
        save_dir=str(save_dir),
        web={"cache_seconds": 0, "max_requests_per_second": 0},  # a scrape after every step, each one fresh
        data_quality={
            "enable": True,
            "label_column": "label",
            "pad_id": 0,
            "vocab_size": VOCAB,
            "baseline_steps": BASELINE_STEPS,
            "streak": STREAK,
            "list_batches": list_batches,
        },
    )
    scrapes = Scrapes(monitor)
    try:
        model.train(1, data, callbacks=[monitor, scrapes], dataset_sink_mode=False)
    finally:
        monitor.close()
    return monitor, scrapes


def series(scrapes: Scrapes, family: c.MetricFamily, **labels: str) -> list[float | None]:
    """The value served after each step; None where the series did not exist (a flag before its baseline)."""
    values: list[float | None] = []
    for step in sorted(scrapes.pages):
        found = scrapes.pages[step].find(family.name, **labels)
        assert len(found) <= 1, (family.name, labels)
        values.append(found[0] if found else None)
    return values


def promtool_case(name: str, scrapes: Scrapes, fires: bool) -> dict[str, Any]:
    """What the rank served, one step every 10 s (the shipped evaluation interval), and whether the alert is
    expected at the end for label_entropy (and never for sequence_length)."""
    labels = f'job="mindspore", instance="localhost:19420", rank="0", project="{PROJECT}"'
    steps = sorted(scrapes.pages)
    inputs = []
    for quantity in QUANTITIES:
        for family in (c.DATA_QUALITY_LOW_STREAK, c.DATA_QUALITY_LOW):
            values = []
            for step in steps:
                found = scrapes.pages[step].find(family.name, quantity=quantity)
                values.append(f"{found[0]:g}" if found else "_")  # before the baseline: no series
            inputs.append({"series": f'{family.name}{{{labels}, quantity="{quantity}"}}', "values": " ".join(values)})
    expected = {
        "job": "mindspore",
        "instance": "localhost:19420",
        "rank": "0",
        "project": PROJECT,
        "quantity": c.LABEL_ENTROPY,
        "severity": "warning",
    }
    return {
        "name": name,
        "interval": "10s",
        "input_series": inputs,
        "alert_rule_test": [
            {
                "eval_time": f"{(len(steps) - 1) * 10}s",
                "alertname": "MindSporeTrainingDataQualityDrop",
                "exp_alerts": [{"exp_labels": expected}] if fires else [],
            }
        ],
    }


def promtool(cases: list[dict[str, Any]], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """The shipped rules (their annotations left out: promtool then compares who fires) over the cases."""
    rules = render_rules()
    for group in rules["groups"]:
        for rule in group["rules"]:
            rule.pop("annotations", None)
    (tmp_path / "rules.yml").write_text(render_yaml(rules))
    tests = {"rule_files": ["rules.yml"], "evaluation_interval": "10s", "tests": cases}
    (tmp_path / "data-quality.test.yml").write_text(yaml.safe_dump(tests, sort_keys=False))
    return subprocess.run(
        ["promtool", "test", "rules", "data-quality.test.yml"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_labels_that_turn_to_one_class_fire_the_alert_and_are_kept_out_on_a_second_pass(tmp_path: Path) -> None:
    dropping = Source(one_class=range(DROP_FROM, STEPS + 1))
    monitor, scrapes = train(dropping, tmp_path / "drop", list_batches=True)
    assert sorted(scrapes.pages) == list(range(1, STEPS + 1))
    # The series move: 2 bits while every batch is balanced, 0 once its labels are one class.
    entropy = series(scrapes, c.DATA_LABEL_ENTROPY)
    assert entropy == [2.0] * (DROP_FROM - 1) + [0.0] * (STEPS - DROP_FROM + 1)
    assert series(scrapes, c.DATA_SEQUENCE_LENGTH) == pytest.approx(
        [dropping.mean_length(step) for step in range(1, STEPS + 1)]
    )
    last = scrapes.pages[STEPS]
    lengths = np.median([dropping.mean_length(step) for step in range(1, BASELINE_STEPS + 1)])
    assert last.value(c.DATA_QUALITY_BASELINE.name, quantity=c.LABEL_ENTROPY) == 2.0
    assert last.value(c.DATA_QUALITY_BASELINE.name, quantity=c.SEQUENCE_LENGTH) == pytest.approx(lengths)
    # The streak counts the low batches from the drop on; the flag rises with the streak's fifth.
    streak = series(scrapes, c.DATA_QUALITY_LOW_STREAK, quantity=c.LABEL_ENTROPY)
    low = series(scrapes, c.DATA_QUALITY_LOW, quantity=c.LABEL_ENTROPY)
    after_baseline = range(BASELINE_STEPS, STEPS + 1)
    assert [streak[s - 1] for s in after_baseline] == [max(0, s - DROP_FROM + 1) for s in after_baseline]
    assert [low[s - 1] for s in after_baseline] == [float(s >= DROP_FROM + STREAK - 1) for s in after_baseline]
    assert streak[: BASELINE_STEPS - 1] == low[: BASELINE_STEPS - 1] == [None] * (BASELINE_STEPS - 1)  # no baseline yet
    assert set(series(scrapes, c.DATA_QUALITY_LOW, quantity=c.SEQUENCE_LENGTH)[BASELINE_STEPS - 1 :]) == {0.0}
    assert last.value(c.DATA_CHECKED_SAMPLES.name) == STEPS * BATCH
    for family in (c.DATA_DUPLICATE_SAMPLES, c.DATA_EMPTY_SAMPLES, c.DATA_OUT_OF_VOCAB):
        assert last.value(family.name) == 0, family.name
    # The drop's batches, listed by content: every one from the first low batch on.
    listed = SkippedBatches(tmp_path / "drop").read()
    assert [entry["step"] for entry in listed] == list(range(DROP_FROM, STEPS + 1))
    first = listed[0]
    assert (first["epoch"], first["position"], first["reason"], first["rank"]) == (1, DROP_FROM, "data_quality", 0)
    assert first["quantities"] == {c.LABEL_ENTROPY: {"value": 0.0, "baseline": 2.0}}
    samples = range((DROP_FROM - 1) * BATCH, DROP_FROM * BATCH)
    assert first["sample_hashes"] == [sample_hash(dropping[i]) for i in samples]
    assert monitor.store.value_of(c.DATA_LISTED_BATCHES) == STEPS - DROP_FROM + 1

    # A healthy run with one single-class batch: the streak reaches 1, the flag never rises, nothing is listed.
    dip = DROP_FROM + 10
    _, healthy = train(Source(one_class=[dip]), tmp_path / "healthy", list_batches=True)
    healthy_streak = series(healthy, c.DATA_QUALITY_LOW_STREAK, quantity=c.LABEL_ENTROPY)
    assert healthy_streak[dip - 1] == 1 and max(healthy_streak[BASELINE_STEPS - 1 :]) == 1
    assert set(series(healthy, c.DATA_QUALITY_LOW, quantity=c.LABEL_ENTROPY)[BASELINE_STEPS - 1 :]) == {0.0}
    assert not (tmp_path / "healthy" / "skipped-batches.json").exists()

    # The alert's expression, by Prometheus' engine, over what the ranks served.
    tested = promtool(
        [promtool_case("the drop fires", scrapes, fires=True), promtool_case("the dip is quiet", healthy, False)],
        tmp_path,
    )
    assert tested.returncode == 0, tested.stdout + tested.stderr

    # The second pass, through the list: the one-class batches are left out and nothing drops.
    wrapped = SkipListedSamples(Source(one_class=range(DROP_FROM, STEPS + 1)), tmp_path / "drop")
    _, second = train(wrapped, tmp_path / "second", list_batches=False)
    assert wrapped.skipped == (STEPS - DROP_FROM + 1) * BATCH
    assert sorted(second.pages) == list(range(1, DROP_FROM))
    assert set(series(second, c.DATA_LABEL_ENTROPY)) == {2.0}
    assert set(series(second, c.DATA_QUALITY_LOW, quantity=c.LABEL_ENTROPY)[BASELINE_STEPS - 1 :]) == {0.0}


def test_the_promtool_check_can_fail(tmp_path: Path) -> None:
    """The check above means something: a case that expects the alert over a healthy run fails."""
    _, healthy = train(Source(), tmp_path / "healthy", list_batches=False)
    tested = promtool([promtool_case("a healthy run, expected to fire", healthy, fires=True)], tmp_path)
    assert tested.returncode != 0
    assert "MindSporeTrainingDataQualityDrop" in tested.stdout + tested.stderr
