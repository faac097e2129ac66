"""The hang watchdog on a real blocked thread: one dump per episode, its content, the metrics and /debug/stacks."""

from __future__ import annotations

import logging
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from ms_exporter.core import catalogue
from ms_exporter.core.part import DebugPage
from ms_exporter.core.phases import PhaseClock
from ms_exporter.core.store import MetricStore
from ms_exporter.endpoint.pages import STACKS_PATH
from ms_exporter.features.watchdog import HangWatchdog, render_dump
from ms_exporter.sinks.prometheus import PrometheusEndpoint
from tests.support.waiting import wait_until


def blocked_in_a_data_iterator(release: threading.Event) -> None:
    """What a stuck data pipeline looks like from Python: a generator's next() that never returns."""

    def batches():  # type: ignore[no-untyped-def]
        release.wait(30)
        yield 1

    next(batches())


@pytest.fixture
def watched(tmp_path: Path):  # type: ignore[no-untyped-def]
    store = MetricStore((("rank", "3"), ("project", "p")))
    clock = PhaseClock(store)
    deadline = [0.5]
    errors: list[BaseException] = []
    watchdog = HangWatchdog(clock, lambda: deadline[0], store, str(tmp_path), 3, errors.append, native=False)
    release = threading.Event()
    yield store, clock, watchdog, release, deadline, errors
    release.set()
    watchdog.stop()


def test_a_blocked_training_thread_gets_one_dump_naming_the_phase_and_the_frame(
    watched, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    store, clock, watchdog, release, deadline, errors = watched
    ready = threading.Event()

    def training() -> None:
        watchdog.start()  # the thread that starts it is the one whose top frame is named
        clock.enter(catalogue.DATA_WAIT_PHASE)
        ready.set()
        blocked_in_a_data_iterator(release)

    worker = threading.Thread(target=training, name="trainer", daemon=True)
    with caplog.at_level(logging.WARNING, logger="ms_exporter"):
        worker.start()
        ready.wait(5)
        (dump,) = wait_until(lambda: list(tmp_path.glob("hang-rank3-*.txt")), 20, "a dump file")
        time.sleep(1.5)  # three more looks at the same episode: still one dump
    text = dump.read_text()
    assert list(tmp_path.glob("hang-rank3-*.txt")) == [dump] and watchdog.latest == text
    first = text.splitlines()
    assert first[1].startswith("phase: data_wait for ") and "(deadline 0.500 s)" in first[1]
    assert first[2].startswith("training thread top frame: ") and first[2].endswith("in batches")
    assert "Python frames only" in first[3]
    assert '"trainer" (training thread' in text and "blocked_in_a_data_iterator" in text and "next(batches())" in text
    assert store.value_of(catalogue.HANG_SUSPECTED) == 1 and store.value_of(catalogue.HANG_DUMPS) == 1
    (warning,) = [r.getMessage() for r in caplog.records if "hang deadline" in r.getMessage()]
    assert "rank 3 has been in phase data_wait" in warning and str(dump) in warning
    release.set()
    worker.join(5)
    deadline[0] = 30.0
    clock.enter(catalogue.STEP_PHASE)  # the phase moved on (and is within its deadline): the suspicion ends
    wait_until(lambda: store.value_of(catalogue.HANG_SUSPECTED) == 0, 5, "the suspicion to end")
    assert errors == []


def test_no_dump_within_the_deadline_nor_once_ended(watched, tmp_path: Path) -> None:
    store, clock, watchdog, release, deadline, errors = watched
    deadline[0] = 30.0
    watchdog.start()
    clock.enter(catalogue.STEP_PHASE)
    time.sleep(1.2)
    clock.enter(catalogue.ENDED)
    deadline[0] = 0.1
    time.sleep(1.2)
    assert list(tmp_path.glob("hang-*")) == [] and store.value_of(catalogue.HANG_DUMPS) == 0
    assert store.value_of(catalogue.HANG_SUSPECTED) == 0 and errors == []


def test_an_unwritable_save_dir_still_serves_the_dump_and_counts_the_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    store = MetricStore()
    clock = PhaseClock(store)
    errors: list[BaseException] = []
    watchdog = HangWatchdog(clock, lambda: 0.0, store, str(blocker / "sub"), 0, errors.append, native=False)
    clock.enter(catalogue.STEP_PHASE)
    watchdog.check()
    assert watchdog.latest is not None and len(errors) == 1 and isinstance(errors[0], OSError)


def test_debug_stacks_serves_the_latest_dump_behind_the_endpoint() -> None:
    latest: list[str | None] = [None]
    store = MetricStore()
    served = PrometheusEndpoint(
        store,
        "127.0.0.1",
        0,
        lambda component, exc: None,
        debug_pages={STACKS_PATH: DebugPage(lambda: latest[0], "No hang dump yet")},
    )
    base = served.url.removesuffix("metrics")
    try:
        with pytest.raises(urllib.error.HTTPError) as missing:
            urllib.request.urlopen(base + "debug/stacks", timeout=5)
        assert missing.value.code == 404
        latest[0] = "ms_exporter hang dump: rank 0\n"
        with urllib.request.urlopen(base + "debug/stacks", timeout=5) as response:
            assert response.read().decode() == latest[0]
            assert response.headers["Content-Type"].startswith("text/plain")
    finally:
        served.close()
    unserved = PrometheusEndpoint(store, "127.0.0.1", 0, lambda component, exc: None)  # hang.debug_endpoint: false
    try:
        with pytest.raises(urllib.error.HTTPError) as off:
            urllib.request.urlopen(unserved.url.removesuffix("metrics") + "debug/stacks", timeout=5)
        assert off.value.code == 404 and b"debug/stacks" not in off.value.read()
    finally:
        unserved.close()


def test_a_dump_says_which_stacks_it_has() -> None:
    import datetime

    now = datetime.datetime(2026, 12, 1, tzinfo=datetime.timezone.utc)
    native = render_dump(0, "p", "step", 200.0, 120.0, now, threading.get_ident(), "Thread 1 (idle): native frames\n")
    assert "stacks: Python frames, and native frames from py-spy below" in native and "py-spy dump --native:" in native
    refused = render_dump(
        0, "p", "step", 200.0, 120.0, now, None, "(py-spy could not read this process, exit 1: denied)"
    )
    assert "stacks: Python frames only (py-spy could not read this process" in refused
    assert "training thread top frame: unknown" in refused
