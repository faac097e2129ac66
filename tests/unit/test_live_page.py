"""What the live page is handed: the newest loss as its headline says it, non-finite steps told from steps
without a loss, and the stall verdict decided by core/stall.py (the page only words it). What the page does with
them: the browser tests in tests/integration/test_pictures.py."""

from __future__ import annotations

import math
import re
import time

import pytest

from ms_exporter.core import catalogue
from ms_exporter.core.store import MetricStore
from ms_exporter.core.thresholds import STALL_FLOOR_SECONDS
from ms_exporter.endpoint.live_history import StepHistory
from ms_exporter.endpoint.pages import live_page
from tests.support.samples import sample


def history(*losses: float | None) -> StepHistory:
    found = StepHistory(MetricStore((("rank", "0"),)), {})
    for step, loss in enumerate(losses, start=1):
        found.on_step(sample(step, loss, t=float(step)))
    return found


def test_the_newest_loss_is_named_as_it_is_and_a_step_without_a_loss_is_not_non_finite() -> None:
    ring = history(0.5, math.nan, math.inf, None, -math.inf)
    payload = ring.since(-1)
    assert payload["nonfinite_loss_steps"] == [2, 3, 5]  # step 4 had no readable loss: no NaN to shout about
    assert payload["last_loss"] == "-Inf"
    assert [row[2] for row in payload["rows"]] == [0.5, None, None, None, None]
    assert history(0.5, math.nan).since(-1)["last_loss"] == "NaN"
    assert history(math.nan, 0.25).since(-1)["last_loss"] == 0.25
    assert history(0.5, None).since(-1)["last_loss"] is None
    assert history().since(-1)["last_loss"] is None
    # Later polls ask for newer rows only; the newest loss is always the ring's.
    assert ring.since(5)["rows"] == [] and ring.since(5)["last_loss"] == "-Inf"


def test_the_page_words_the_endpoints_stall_verdict_and_decides_none_itself() -> None:
    page = live_page("project p rank 0", 4096)
    assert not re.search(r"__[A-Z_]+__", page)
    assert "STALL_" not in page and "payload.stall" in page


def ring_ended_ago(seconds_ago: float, phase: str | None = None, phase_seconds: float = 0.0) -> StepHistory:
    """A ring of 20 steps one second apart, the last `seconds_ago` seconds before now, the rank in `phase`."""
    store = MetricStore((("rank", "0"),))
    if phase is not None:
        store.register(catalogue.PHASE).series(phase=phase).value = 1.0
        store.register(catalogue.PHASE_SECONDS).series().value = phase_seconds
        store.register(catalogue.HANG_DEADLINE).series().value = 120.0
    found = StepHistory(store, {})
    last = time.time() - 1e9 - seconds_ago  # sample() adds 1e9 to `t` for the wall time
    for step in range(1, 21):
        found.on_step(sample(step, 0.5, t=last - (20 - step)))
    return found


def test_the_payload_carries_the_stall_of_the_rows_times() -> None:
    assert ring_ended_ago(0.5).since(-1)["stall"] is None
    amber = ring_ended_ago(STALL_FLOOR_SECONDS + 5, "data_wait", STALL_FLOOR_SECONDS + 5).since(-1)["stall"]
    assert amber["past_deadline"] is False and amber["deadline"] == 120.0
    assert amber["seconds"] == pytest.approx(STALL_FLOOR_SECONDS + 5, abs=2.0)
    red = ring_ended_ago(200.0, "data_wait", 200.0).since(-1)["stall"]
    assert red["past_deadline"] is True and red["phase_seconds"] == 200.0
    assert ring_ended_ago(200.0, catalogue.ENDED, 200.0).since(-1)["stall"] is None
