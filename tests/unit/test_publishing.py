"""Steps reach the probes in batches: at most PUBLISH_SECONDS late, in order, and none lost at the end."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from ms_exporter import TrainingMonitor
from ms_exporter.monitor import publisher as publisher_module
from ms_exporter.probes.memory import MemoryProbe
from tests.support.cb_params import context
from tests.support.scrape import scrape


def steps(monitor: TrainingMonitor, first: int, last: int) -> None:
    for step in range(first, last + 1):
        batch = [np.ones((4, 8), np.int32), np.tri(4, 8, dtype=np.int32), np.zeros(4, np.int32)]
        monitor.on_train_step_begin(context(step, 1.0 / step, element=batch))
        monitor.on_train_step_end(context(step, 1.0 / step, element=batch))


def test_fast_steps_wait_for_the_next_publication_and_lose_nothing(tmp_path: Path) -> None:
    monitor = TrainingMonitor(
        port=0, backend=["prometheus", "local"], save_dir=str(tmp_path), interval=60, web={"cache_seconds": 0}
    )
    try:
        monitor.on_train_begin(context(0, 0.0))
        steps(monitor, 1, 5)  # microseconds apart: the first is published at once, the rest wait
        assert scrape(monitor.url).value("mindspore_train_global_step") == 1
        monitor.publish()
        page = scrape(monitor.url)
        assert page.value("mindspore_train_global_step") == 5
        assert page.value("mindspore_train_steps_total") == 5
        assert page.value("mindspore_train_samples_total") == 20
        # np.tri: rows of 1, 2, 3 and 4 ones: 10 non-padding tokens a batch, counted when published.
        assert page.value("mindspore_train_tokens_total") == 50
        assert page.value("mindspore_train_loss") == pytest.approx(0.2)
        steps(monitor, 6, 8)
        monitor.on_train_end(context(8, 0.125))  # train end publishes what is left
        page = scrape(monitor.url)
        assert page.value("mindspore_train_global_step") == 8
        assert page.value("mindspore_train_steps_total") == 8
    finally:
        monitor.close()
    records = [json.loads(line) for line in Path(monitor.jsonl_path).read_text().splitlines()]
    assert [r["step"] for r in records if r["type"] == "step"] == list(range(1, 9))


def test_only_the_training_thread_publishes_even_when_records_wait() -> None:
    # Probes evaluate LR schedules and read tensors: MindSpore calls from another thread during a step can
    # deadlock, so records left waiting (training busy in a long step) wait for the training thread.
    monitor = TrainingMonitor(port=0, web={"cache_seconds": 0}, interval=0.05)  # the sampler thread runs
    threads: set[int] = set()
    probe = monitor.core.publisher.probes[0]
    original = probe.on_step
    probe.on_step = lambda sample: (threads.add(threading.get_ident()), original(sample))  # type: ignore[method-assign]
    try:
        monitor.on_train_begin(context(0, 0.0))
        steps(monitor, 1, 3)  # step 1 is published at once, 2 and 3 wait
        time.sleep(3 * publisher_module.PUBLISH_SECONDS)
        assert scrape(monitor.url).value("mindspore_train_global_step") == 1
        steps(monitor, 4, 4)  # the next step end is past the interval: it publishes 2, 3 and 4
        assert scrape(monitor.url).value("mindspore_train_global_step") == 4
        assert threads == {threading.get_ident()}
    finally:
        monitor.close()


def test_steps_slower_than_the_publication_interval_are_published_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(publisher_module, "PUBLISH_SECONDS", 0.0)
    monitor = TrainingMonitor(port=0, web={"cache_seconds": 0})
    try:
        monitor.on_train_begin(context(0, 0.0))
        for last in (1, 2, 3):
            steps(monitor, last, last)
            assert scrape(monitor.url).value("mindspore_train_global_step") == last
    finally:
        monitor.close()


def test_close_publishes_what_is_pending(tmp_path: Path) -> None:
    monitor = TrainingMonitor(port=0, backend=["local"], save_dir=str(tmp_path), interval=60)
    monitor.on_train_begin(context(0, 0.0))
    steps(monitor, 1, 4)
    monitor.close()  # no train end: a script that stops early, or the atexit hook
    records = [json.loads(line) for line in Path(monitor.jsonl_path).read_text().splitlines()]
    assert [r["step"] for r in records if r["type"] == "step"] == [1, 2, 3, 4]


def test_a_record_that_cannot_be_published_costs_only_itself() -> None:
    monitor = TrainingMonitor(port=0, web={"cache_seconds": 0})
    try:
        monitor.on_train_begin(context(0, 0.0))
        steps(monitor, 1, 1)
        monitor.on_train_step_end(context("not a step", 0.5))  # type: ignore[arg-type]
        steps(monitor, 3, 4)
        monitor.publish()
        page = scrape(monitor.url)
        assert page.value("mindspore_train_global_step") == 4
        assert page.value("mindspore_exporter_errors_total", component="callback") == 1
    finally:
        monitor.close()


def test_device_memory_is_read_on_the_training_thread_only() -> None:
    # MindSpore's runtime memory API from the sampler thread could deadlock like any MindSpore call during a
    # step: the sampler (every 0.05 s here) reads host memory only; device memory is read when steps publish.
    monitor = TrainingMonitor(port=0, web={"cache_seconds": 0}, interval=0.05)
    readers: set[int] = set()
    memory = monitor.part_of(MemoryProbe)
    assert memory is not None
    memory._device = {"device_allocated": lambda: readers.add(threading.get_ident()) or 64 * 2**20}
    try:
        monitor.on_train_begin(context(0, 0.0))
        for last in range(1, 6):
            steps(monitor, last, last)
            monitor.publish()
            time.sleep(0.12)  # the sampler thread runs in between
        page = scrape(monitor.url)
        assert page.value("mindspore_train_memory_bytes", kind="device_allocated") == 64 * 2**20
        assert page.value("mindspore_train_memory_bytes", kind="host_rss") > 0
        assert readers == {threading.get_ident()}
    finally:
        monitor.close()
