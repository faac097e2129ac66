"""The callback driven by hand-made cb_params: sink-mode accounting and the JSON Lines file.

Sink mode on CPU falls back to one hook per step, so the once-per-sink call that Ascend makes is
reproduced here with cb_params whose cur_step_num jumps by the sink size.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from pathlib import Path

import mindspore as ms
import numpy as np
import pytest

from ms_exporter import TrainingMonitor
from tests.support.cb_params import context
from tests.support.pythons import OTLP, needs
from tests.support.scrape import scrape


def test_sink_mode_counts_every_step_of_a_sink(tmp_path: Path) -> None:
    monitor = TrainingMonitor(
        port=0,
        backend=["prometheus", "local"],
        save_dir=str(tmp_path),
        interval=60,
        metrics=["loss", "step_time", "samples_per_second", "tokens_per_second"],
    )
    try:
        monitor.on_train_begin(context(0, 0.0, sink_size=10))
        for sink in (1, 2, 3):
            monitor.on_train_step_begin(context(sink * 10, 0.0, sink_size=10))
            monitor.on_train_step_end(context(sink * 10, 1.0 / sink, sink_size=10))
        monitor.publish()
        metrics = scrape(monitor.url)
        assert metrics.value("mindspore_train_global_step") == 30
        assert metrics.value("mindspore_train_steps_total") == 30
        assert metrics.value("mindspore_train_samples_total") == 30 * 4
        assert metrics.value("mindspore_train_tokens_total") == 30 * 4 * 8
        assert metrics.value("mindspore_train_step_duration_seconds_count") == 30
        assert metrics.value("mindspore_train_loss") == pytest.approx(1.0 / 3)
        monitor.on_train_end(context(30, 0.0, sink_size=10))
    finally:
        monitor.close()
    steps = [json.loads(line) for line in Path(monitor.jsonl_path).read_text().splitlines()]
    step_records = [r for r in steps if r["type"] == "step"]
    assert [r["step"] for r in step_records] == [10, 20, 30]
    assert all(r["steps"] == 10 and r["samples"] == 40 for r in step_records)


def test_jsonl_records_nonfinite_as_strings_and_flushes_on_train_end(tmp_path: Path) -> None:
    monitor = TrainingMonitor(port=0, backend="local", save_dir=str(tmp_path), interval=3600)
    mask = ms.Tensor(np.array([[1, 1, 0, 0]], np.int32))
    batch = [ms.Tensor(np.ones((1, 4), np.int32)), mask, ms.Tensor(np.zeros(1, np.int32))]
    try:
        assert monitor.url is None  # no prometheus backend, no port
        monitor.on_train_begin(context(0, 0.0))
        for step, loss in enumerate([0.5, float("nan"), float("inf")], start=1):
            monitor.on_train_step_begin(context(step, loss, element=batch))
            monitor.on_train_step_end(context(step, loss, element=batch))
        # The interval is an hour: nothing has been written yet, train end must flush.
        assert not Path(monitor.jsonl_path).exists() or "step" not in Path(monitor.jsonl_path).read_text()
        monitor.on_train_end(context(3, 0.0))
        records = [json.loads(line) for line in Path(monitor.jsonl_path).read_text().splitlines()]
    finally:
        monitor.close()
    steps = [r for r in records if r["type"] == "step"]
    assert [r["loss"] for r in steps] == [0.5, "NaN", "Inf"]
    assert [r["tokens"] for r in steps] == [2, 2, 2]
    assert {r["rank"] for r in records} == {0}
    assert records[0]["event"] == "train_begin" and records[-2]["event"] == "train_end"
    snapshot = records[-1]
    assert snapshot["type"] == "snapshot" and snapshot["metrics"]["nonfinite_loss_total"] == 2


def test_jsonl_rotates_at_max_file_mb(tmp_path: Path) -> None:
    from ms_exporter.core import catalogue
    from ms_exporter.core.store import MetricStore
    from ms_exporter.sinks.jsonl import JsonlWriter

    store = MetricStore()
    store.register(catalogue.LOSS).series().value = 1.0
    errors: list = []
    writer = JsonlWriter(
        store, str(tmp_path), 0, "p", 60, max_file_mb=0.001, max_files=2, on_error=lambda c, e: errors.append(e)
    )
    for _ in range(30):
        writer.record_event("filler", text="x" * 200)
        writer.flush()
    writer.close()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names == ["metrics-rank0.jsonl", "metrics-rank0.jsonl.1", "metrics-rank0.jsonl.2"]
    assert all(p.stat().st_size < 4096 for p in tmp_path.iterdir())
    assert errors == []


def test_queued_records_reach_the_file_within_seconds_whatever_the_interval(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from ms_exporter.sinks import jsonl
    from tests.support.waiting import wait_until

    monkeypatch.setattr(jsonl, "MAX_UNWRITTEN_SECONDS", 0.2)  # 5 s in production
    monitor = TrainingMonitor(port=0, backend=["local"], save_dir=str(tmp_path), interval=3600)
    path = tmp_path / "metrics-rank0.jsonl"
    try:
        monitor.on_train_begin(context(0, 0.0))
        for step in (1, 2, 3):
            monitor.on_train_step_end(context(step, 0.5))
        monitor.publish()
        # An hour's interval, and the steps are on disk anyway: a kill -9 now would lose none of them.
        wait_until(lambda: path.exists() and len(read_records(str(path))) >= 4, 30, "the records written")
        kinds = [record["type"] for record in read_records(str(path))]
        assert kinds.count("step") == 3 and "snapshot" not in kinds  # the snapshot still waits for its interval
    finally:
        monitor.close()
    assert read_records(str(path))[-1]["type"] == "snapshot"  # and comes at close


def test_unwritable_save_dir_is_counted_not_raised(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monitor = TrainingMonitor(port=0, backend=["prometheus", "local"], save_dir=str(blocker / "sub"), interval=60)
    try:
        monitor.on_train_begin(context(0, 0.0))
        monitor.on_train_step_end(context(1, 0.5))
        monitor.on_train_end(context(1, 0.5))
        assert scrape(monitor.url).value("mindspore_exporter_errors_total", component="local") >= 1
    finally:
        monitor.close()


def test_disabled_monitor_is_a_no_op() -> None:
    monitor = TrainingMonitor(enable=False, port=1)
    monitor.on_train_begin(context(0, 0.0))
    monitor.on_train_step_end(context(1, 0.5))
    monitor.on_train_end(context(1, 0.5))
    assert monitor.url is None
    monitor.close()


def test_an_address_that_cannot_be_bound_leaves_training_without_endpoint(caplog: pytest.LogCaptureFixture) -> None:
    # 192.0.2.1 is TEST-NET-1: never an address of this machine, so even "any free port" cannot be bound.
    monitor = TrainingMonitor(bind_address="192.0.2.1", port=0, backend=["prometheus"])
    try:
        assert monitor.url is None
        assert "cannot serve metrics on 192.0.2.1" in caplog.text
        monitor.on_train_begin(context(0, 0.0))
        monitor.on_train_step_end(context(1, 0.5))
        errors = monitor.store.get("mindspore_exporter_errors_total")
        assert errors is not None and errors.series(component="prometheus").value == 1
        assert monitor.store.get("mindspore_train_loss").series().value == 0.5
    finally:
        monitor.close()


def read_records(path: str) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()] if Path(path).exists() else []


def test_a_forked_child_does_not_write_the_parents_file(tmp_path: Path) -> None:
    monitor = TrainingMonitor(port=0, backend="local", save_dir=str(tmp_path), interval=3600)
    try:
        monitor.on_train_begin(context(0, 0.0))
        monitor.on_train_step_end(context(1, 0.5))
        pid = os.fork()
        if pid == 0:  # a data-loader-like worker that inherited the handler gets SIGTERM
            os.kill(os.getpid(), signal.SIGTERM)
            os._exit(3)  # not reached: the default action ends the child
        _, status = os.waitpid(pid, 0)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM
        assert read_records(monitor.jsonl_path) == []  # the child wrote nothing
        monitor.on_train_end(context(1, 0.5))
        steps = [r for r in read_records(monitor.jsonl_path) if r["type"] == "step"]
        assert [r["step"] for r in steps] == [1]
    finally:
        monitor.close()


def test_a_forked_child_that_outlives_the_monitor_does_not_keep_its_port_bound() -> None:
    monitor = TrainingMonitor(port=0, backend="prometheus")
    port = int(monitor.url.rsplit(":", 1)[1].split("/")[0])
    release, held = os.pipe()
    started, ready = os.pipe()
    pid = os.fork()
    if pid == 0:  # a long-lived worker: says it runs (past the at-fork hooks), then waits until the parent lets it go
        os.close(held)
        os.write(ready, b"1")
        os.read(release, 1)
        os._exit(0)
    os.close(release)
    os.close(ready)
    try:
        assert os.read(started, 1) == b"1"
        os.close(started)
        monitor.close()
        # The rank's next process binds the port while the child still lives.
        with socket.create_server(("127.0.0.1", port)):
            pass
    finally:
        os.close(held)  # the child reads end-of-file and exits
        os.waitpid(pid, 0)


def test_a_handler_that_chains_back_to_ours_does_not_recurse(tmp_path: Path) -> None:
    monitor = TrainingMonitor(port=0, backend="local", save_dir=str(tmp_path), interval=3600)
    original = signal.getsignal(signal.SIGINT)
    calls: list[int] = []
    try:
        monitor.on_train_begin(context(0, 0.0))
        ours = signal.getsignal(signal.SIGINT)

        def foreign(signum: int, frame: object) -> None:  # installed after ours, and calls ours
            calls.append(signum)
            ours(signum, frame)

        signal.signal(signal.SIGINT, foreign)
        monitor.on_train_end(context(0, 0.0))  # ours is no longer on top: nothing restored
        monitor.on_train_begin(context(0, 0.0))  # ours again, now chaining to foreign -> ours
        with pytest.raises(KeyboardInterrupt):  # the loop ends in Python's own SIGINT action, never swallowed
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(1)  # the handler runs at the next bytecode; the sleep is never finished
        monitor.on_train_end(context(0, 0.0))
        events = [r for r in read_records(monitor.jsonl_path) if r.get("event") == "signal"]
        assert len(events) == 1 and calls == [signal.SIGINT]
    finally:
        signal.signal(signal.SIGINT, original)
        monitor.close()


def test_file_sd_target_written_with_the_actual_port_and_removed_on_close(tmp_path: Path) -> None:
    monitor = TrainingMonitor(port=0, project="bert/large", file_sd_dir=str(tmp_path / "sd"))
    try:
        files = list((tmp_path / "sd").iterdir())
        assert [f.name for f in files] == ["ms-exporter-bert_large-rank0.json"]
        (entry,) = json.loads(files[0].read_text())
        port = monitor.url.rsplit(":", 1)[1].split("/")[0]
        assert entry["targets"] == [f"127.0.0.1:{port}"]
        assert entry["labels"]["__meta_ms_exporter_rank"] == "0"
        assert entry["labels"]["__meta_ms_exporter_project"] == "bert/large"
        assert (
            scrape(monitor.url).labels_of("mindspore_train_info")[0]["node"]
            == entry["labels"]["__meta_ms_exporter_node"]
        )
    finally:
        monitor.close()
    assert list((tmp_path / "sd").iterdir()) == []


def test_file_sd_that_cannot_be_written_is_counted(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monitor = TrainingMonitor(port=0, file_sd_dir=str(blocker / "sd"))
    try:
        assert scrape(monitor.url).value("mindspore_exporter_errors_total", component="file_sd") == 1
    finally:
        monitor.close()


def test_close_takes_the_monitor_out_of_the_signal_path(tmp_path: Path) -> None:
    before = signal.getsignal(signal.SIGTERM)
    monitor = TrainingMonitor(port=0, backend="local", save_dir=str(tmp_path), interval=3600)
    monitor.on_train_begin(context(0, 0.0))  # training that never reached its end
    assert signal.getsignal(signal.SIGTERM) == monitor.core.signals._handle
    monitor.close()
    assert signal.getsignal(signal.SIGTERM) == before


def test_cb_params_without_optimizer_or_network_is_fine() -> None:
    from mindspore.train.callback import RunContext, _InternalCallbackParam

    params = _InternalCallbackParam()
    params.cur_step_num = 0
    params.cur_epoch_num = 1
    monitor = TrainingMonitor(port=0)
    try:
        monitor.on_train_begin(RunContext(params))
        errors = monitor.store.get("mindspore_exporter_errors_total")
        assert sum(s.value for s in errors.children()) == 0
    finally:
        monitor.close()


def test_otlp_without_the_sdk_names_the_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    from ms_exporter.config import ConfigError

    monkeypatch.setitem(sys.modules, "ms_exporter.sinks.otlp", None)  # as if opentelemetry-sdk were missing
    with pytest.raises(ConfigError, match=r"pip install 'ms-exporter\[otlp\]'"):
        TrainingMonitor(port=0, backend=["otlp"])


@needs(OTLP)
def test_an_otlp_setting_the_sdk_rejects_is_counted_not_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "udp")  # not checked by monitor_config: the SDK's variable
    monitor = TrainingMonitor(port=0, backend=["prometheus", "otlp"])
    try:
        assert all(sink.name != "otlp" for sink in monitor.parts)
        assert monitor.url is not None  # /metrics still served
        assert scrape(monitor.url).value("mindspore_exporter_errors_total", component="otlp") == 1
    finally:
        monitor.close()
