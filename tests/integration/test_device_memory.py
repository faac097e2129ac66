"""Device memory on Ascend/GPU, with MindSpore's readers faked (no accelerator here): every view shows the same
kind and number, and the memory in use is never a reserved or peak figure under another name."""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path
from typing import Any

import mindspore as ms
import pytest
from mindspore import runtime
from mindspore.train import Callback

from ms_exporter import TrainingMonitor
from ms_exporter.core import catalogue
from ms_exporter.demo import build_model, synthetic_dataset
from ms_exporter.tools import report
from ms_exporter.tools.rank_samples import parse_ranks
from ms_exporter.tools.top.rows import build_row
from tests.support.scrape import Scrape, scrape

pytestmark = pytest.mark.integration

MIB = 2**20
# Three different numbers: a view that picks the wrong kind shows the wrong number.
DEVICE = {"memory_allocated": 300 * MIB, "memory_reserved": 512 * MIB, "max_memory_allocated": 420 * MIB}
STEPS = 30


class _StopAt(Callback):
    def on_train_step_end(self, run_context: Any) -> None:
        if run_context.original_args().cur_step_num >= STEPS:
            run_context.request_stop()


@pytest.fixture(scope="module")
def device_run(tmp_path_factory: pytest.TempPathFactory) -> Any:
    save_dir = tmp_path_factory.mktemp("device")
    patch = pytest.MonkeyPatch()
    real_get_context = ms.get_context
    # The monitor asks MindSpore which device it runs on and takes the runtime's readers when it is not the CPU.
    patch.setattr(ms, "get_context", lambda key: "Ascend" if key == "device_target" else real_get_context(key))
    for name, value in DEVICE.items():
        patch.setattr(runtime, name, lambda value=value: value)
    try:
        monitor = TrainingMonitor(
            port=0, backend=["prometheus", "local"], save_dir=str(save_dir), interval=1, web={"cache_seconds": 0}
        )
    finally:
        patch.undo()  # training itself runs on the real CPU context; the readers were taken at construction
    ms.set_context(mode=ms.GRAPH_MODE)
    try:
        build_model().train(
            1, synthetic_dataset(size=STEPS * 16), callbacks=[monitor, _StopAt()], dataset_sink_mode=False
        )
        monitor.publish()
        metrics = scrape(monitor.url).text
        with urllib.request.urlopen(monitor.url.removesuffix("metrics") + "api/series?since=-1", timeout=5) as page:
            series = json.loads(page.read())
        yield metrics, series, monitor.jsonl_path
    finally:
        monitor.close()


def test_metrics_has_every_device_kind_with_its_reader_s_number(device_run: Any) -> None:
    metrics = Scrape(device_run[0])
    readers = {
        catalogue.DEVICE_ALLOCATED: "memory_allocated",
        catalogue.DEVICE_RESERVED: "memory_reserved",
        catalogue.DEVICE_PEAK: "max_memory_allocated",
    }
    for kind, reader in readers.items():
        assert metrics.value(catalogue.MEMORY_BYTES.name, kind=kind) == DEVICE[reader]
    assert metrics.value(catalogue.MEMORY_BYTES.name, kind=catalogue.HOST_RSS) > 0


def test_live_page_series_report_and_top_show_the_memory_in_use(device_run: Any, tmp_path: Path) -> None:
    metrics_text, series, jsonl_path = device_run
    in_use = DEVICE["memory_allocated"]
    # /api/series: the kind named, and each row's number is the allocated one.
    assert series["memory_kind"] == catalogue.DEVICE_ALLOCATED
    column = series["columns"].index(catalogue.MEMORY_BYTES.short)
    assert {row[column] for row in series["rows"]} == {in_use}
    # The report: the same kind and number from the JSON Lines snapshots, and the kind in the page.
    run = report.load_run([Path(jsonl_path)])
    assert run.memory_kind == catalogue.DEVICE_ALLOCATED
    assert run.memory and {value for _, value in run.memory} == {in_use}
    page = tmp_path / "report.html"
    report.write_report([jsonl_path], str(page))
    assert f'"memory_kind":"{catalogue.DEVICE_ALLOCATED}"' in page.read_text(encoding="utf-8")
    # top: the same number, marked as the device's.
    (((project, rank), samples),) = parse_ranks(metrics_text).items()
    row, _ = build_row("target", project, rank, samples, None, now=time.time())
    assert (row.memory_bytes, row.memory_kind) == (in_use, "dev")
