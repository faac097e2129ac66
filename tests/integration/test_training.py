"""Real Model.train runs with the monitor, scraped over HTTP while they train."""

from __future__ import annotations

import json
import logging
import math
import socket
import time
from pathlib import Path
from typing import Any

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn
from mindspore.train import Callback, CheckpointConfig, Model, ModelCheckpoint

from ms_exporter import TrainingMonitor
from ms_exporter.demo import PaddedTokens, build_network, synthetic_dataset
from tests.support.scrape import Scrape, scrape

pytestmark = pytest.mark.integration

BATCH = 8
DATA_SIZE = 32  # 4 batches per epoch
EPOCHS = 2
STEPS = EPOCHS * DATA_SIZE // BATCH


class ScrapeEveryStep(Callback):
    """Placed after the monitor: records what the network returned and what /metrics said at that step."""

    def __init__(self, monitor: TrainingMonitor) -> None:
        super().__init__()
        self.monitor = monitor
        self.rows: list[tuple[int, float, Scrape]] = []

    def on_train_step_end(self, run_context: Any) -> None:
        cb_params = run_context.original_args()
        loss = float(cb_params.net_outputs.asnumpy())
        self.monitor.publish()  # the monitor publishes every second on its own; this test reads every step
        self.rows.append((cb_params.cur_step_num, loss, scrape(self.monitor.url)))


def exponential_lr(index: int) -> float:
    return 0.01 * 0.9**index


def train(mode: int, sink: bool, learning_rate: Any, **monitor_options: Any) -> tuple[TrainingMonitor, ScrapeEveryStep]:
    ms.set_context(mode=mode)
    ms.set_seed(0)
    network = build_network(layers=1, d_model=32, heads=2)
    model = Model(network, optimizer=nn.Momentum(network.trainable_params(), learning_rate, 0.9))
    # No render cache: every step's scrape must show that step.
    monitor = TrainingMonitor(
        port=0, project="it", interval=0.2, warmup_steps=2, web={"cache_seconds": 0}, **monitor_options
    )
    checker = ScrapeEveryStep(monitor)
    model.train(
        EPOCHS, synthetic_dataset(size=DATA_SIZE, batch=BATCH), callbacks=[monitor, checker], dataset_sink_mode=sink
    )
    return monitor, checker


@pytest.mark.parametrize(
    ("mode", "sink"),
    [(ms.PYNATIVE_MODE, False), (ms.GRAPH_MODE, False), (ms.GRAPH_MODE, True), (ms.PYNATIVE_MODE, True)],
    ids=["pynative", "graph", "graph-sink", "pynative-sink"],
)
def test_real_training_is_reported_step_by_step(mode: int, sink: bool) -> None:
    if sink:
        # A list LR becomes MindSpore's gather-based schedule: the other reader path.
        learning_rate: Any = [exponential_lr(i) for i in range(64)]
    else:
        learning_rate = nn.ExponentialDecayLR(0.01, 0.9, 1)
    monitor, checker = train(mode, sink, learning_rate)
    try:
        assert [row[0] for row in checker.rows] == list(range(1, STEPS + 1))
        lrs = []
        for step, loss, metrics in checker.rows:
            assert metrics.value("mindspore_train_loss", rank="0", project="it") == loss
            assert metrics.value("mindspore_train_global_step") == step
            assert metrics.value("mindspore_train_steps_total") == step
            assert metrics.value("mindspore_train_samples_total") == step * BATCH
            assert metrics.value("mindspore_train_step_duration_seconds_count") == step
            lr = metrics.value("mindspore_train_learning_rate")
            assert lr == pytest.approx(exponential_lr(step - 1), rel=1e-5), f"step {step}"
            lrs.append(lr)
        assert all(later < earlier for earlier, later in zip(lrs, lrs[1:]))  # the schedule really decays

        final = scrape(monitor.url)
        source = PaddedTokens(size=DATA_SIZE, seq_len=32)
        assert final.value("mindspore_train_tokens_total") == EPOCHS * int(source.mask.sum())
        assert final.value("mindspore_train_tokens_total") < STEPS * BATCH * 32  # padding not counted
        assert final.value("mindspore_train_epoch") == EPOCHS
        assert final.value("mindspore_train_samples_per_second") > 0
        assert final.value("mindspore_train_tokens_per_second") > 0
        assert final.value("mindspore_train_memory_bytes", kind="host_rss") > 50e6
        kinds = {labels["kind"] for labels in final.labels_of("mindspore_train_memory_bytes")}
        assert kinds == {"host_rss"}  # CPU: MindSpore reports 0 device memory, so no device series
        assert final.value("mindspore_train_data_wait_seconds_count") == STEPS - 1
        info = final.labels_of("mindspore_train_info")
        assert len(info) == 1 and info[0]["device_target"] == "CPU" and info[0]["rank"] == "0"
        assert info[0]["mindspore_version"] == ms.__version__
        assert final.value("mindspore_train_world_size") == 1
        assert sum(final.find("mindspore_exporter_errors_total")) == 0
        assert final.value("mindspore_exporter_callback_duration_seconds_count", hook="step_end") == STEPS
        assert math.isfinite(final.value("mindspore_train_last_step_timestamp_seconds"))
        assert final.value("mindspore_train_planned_steps") == STEPS
        assert final.value("mindspore_train_learning_rate_scheduled") == 1
    finally:
        monitor.close()


def small_graph_model() -> Model:
    """The small test Transformer with Momentum, in GRAPH mode."""
    ms.set_context(mode=ms.GRAPH_MODE)
    network = build_network(layers=1, d_model=32, heads=2)
    return Model(network, optimizer=nn.Momentum(network.trainable_params(), 0.01, 0.9))


def test_a_failing_probe_is_counted_and_training_finishes() -> None:
    model = small_graph_model()
    monitor = TrainingMonitor(port=0, web={"cache_seconds": 0})
    try:
        loss_probe = next(p for p in monitor.core.publisher.probes if p.name == "loss")

        def broken(sample: Any) -> None:
            raise RuntimeError("injected probe failure")

        loss_probe.on_step = broken  # type: ignore[method-assign]
        checker = ScrapeEveryStep(monitor)
        model.train(
            EPOCHS,
            synthetic_dataset(size=DATA_SIZE, batch=BATCH),
            callbacks=[monitor, checker],
            dataset_sink_mode=False,
        )
        assert len(checker.rows) == STEPS  # training went on
        final = scrape(monitor.url)
        # Counted, then switched off after 3 in a row (tests/integration/test_fault_isolation.py has the rest).
        assert final.value("mindspore_exporter_errors_total", component="loss") == 3
        assert final.value("mindspore_train_global_step") == STEPS  # the other probes kept working
        assert final.value("mindspore_train_learning_rate") == pytest.approx(0.01)
    finally:
        monitor.close()


def test_evaluation_metrics_from_model_fit() -> None:
    ms.set_context(mode=ms.GRAPH_MODE)
    rng = np.random.default_rng(0)
    features = rng.random((64, 4)).astype(np.float32)
    labels = (features.sum(1) > 2).astype(np.int32)

    def data() -> Any:
        import mindspore.dataset as ds

        return ds.NumpySlicesDataset({"x": features, "y": labels}, shuffle=False).batch(16)

    network = nn.Dense(4, 2)
    model = Model(
        network,
        nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean"),
        nn.Momentum(network.trainable_params(), 0.1, 0.9),
        metrics={"acc": nn.Accuracy()},
    )
    monitor = TrainingMonitor(port=0, web={"cache_seconds": 0})
    seen: list[float] = []

    class RecordEval(Callback):
        def on_eval_end(self, run_context: Any) -> None:
            seen.append(float(run_context.original_args().metrics["acc"]))

    try:
        model.fit(2, data(), data(), callbacks=[monitor, RecordEval()])
        final = scrape(monitor.url)
        assert len(seen) == 2
        assert final.value("mindspore_train_eval_metric", name="acc") == seen[-1]
        assert final.find("mindspore_train_tokens_total") == []  # feature vectors are not tokens
        assert final.value("mindspore_train_samples_total") == 2 * 64
    finally:
        monitor.close()


PAUSE = 0.3  # seconds each slow callback takes, far above a step of the tiny network


def test_checkpoint_and_other_callbacks_are_phases_of_their_own(tmp_path: Path) -> None:
    """A callback before the monitor runs inside what it measures as the step, one after it inside the data wait:
    both are phases of their own, and their time is in neither the step duration nor the data wait."""
    model = small_graph_model()
    monitor = TrainingMonitor(port=0, backend="local", save_dir=str(tmp_path), interval=0.2)
    seen: list[tuple[str, str | None]] = []

    class Pausing(Callback):
        def on_train_step_end(self, run_context: Any) -> None:
            seen.append(("pausing", monitor.phases.phase))
            time.sleep(PAUSE)

    class SlowCheckpoint(ModelCheckpoint):
        def step_end(self, run_context: Any) -> None:  # the older hook name, as ModelCheckpoint itself uses
            seen.append(("saving", monitor.phases.phase))
            time.sleep(PAUSE)
            super().step_end(run_context)

    pausing = Pausing()
    saving = SlowCheckpoint(directory=str(tmp_path / "ckpt"), config=CheckpointConfig(save_checkpoint_steps=2))
    try:
        model.train(
            EPOCHS,
            synthetic_dataset(size=DATA_SIZE, batch=BATCH),
            callbacks=[pausing, monitor, saving],
            dataset_sink_mode=False,
        )
        records = [json.loads(line) for line in Path(monitor.jsonl_path).read_text().splitlines()]
    finally:
        monitor.close()
    assert seen == [("pausing", "callbacks"), ("saving", "checkpoint")] * STEPS
    assert len(list((tmp_path / "ckpt").glob("*.ckpt"))) >= STEPS // 2  # the wrapped hook still saved
    steps = [r for r in records if r["type"] == "step"]
    assert len(steps) == STEPS
    # The first step compiles; after it, neither figure holds a pause.
    assert all(r["step_duration_seconds"] < PAUSE for r in steps[1:]), steps
    assert all(r["data_wait_seconds"] < PAUSE for r in steps[1:]), steps
    # The wrappers were instance attributes for this training only.
    assert "on_train_step_end" not in vars(pausing) and "on_train_step_end" not in vars(saving)


def test_port_in_use_falls_back_to_a_free_port(caplog: pytest.LogCaptureFixture) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        caplog.set_level(logging.WARNING, logger="ms_exporter")
        monitor = TrainingMonitor(port=busy)
        try:
            assert monitor.url is not None and not monitor.url.endswith(f":{busy}/metrics")
            assert scrape(monitor.url).value("mindspore_train_world_size") == 1
            message = " ".join(r.getMessage() for r in caplog.records)
            assert f"port {busy} on 127.0.0.1 is not available" in message
            assert monitor.url.split(":")[-1].split("/")[0] in message  # it says which port it took
        finally:
            monitor.close()


def test_planned_steps_follow_the_steps_taken_when_a_sink_size_is_given() -> None:
    """On CPU a sink size is accepted and ignored (a step per batch): MindSpore still sets batch_num to it."""
    model = small_graph_model()
    monitor = TrainingMonitor(port=0, web={"cache_seconds": 0})
    try:
        checker = ScrapeEveryStep(monitor)
        model.train(
            EPOCHS,
            synthetic_dataset(size=DATA_SIZE, batch=BATCH),
            callbacks=[monitor, checker],
            dataset_sink_mode=True,
            sink_size=3,
        )
        assert len(checker.rows) == STEPS  # every batch of every epoch, not EPOCHS x 3
        assert all(page.value("mindspore_train_planned_steps") == STEPS for _, _, page in checker.rows)
    finally:
        monitor.close()
