"""What the live page is handed: the newest loss as its headline says it, non-finite steps told from steps
without a loss, and the stall rule's numbers from core/thresholds.py. What the page does with them: the browser
tests in tests/integration/test_pictures.py."""

from __future__ import annotations

import math
import re

from ms_exporter.core.store import MetricStore
from ms_exporter.core.thresholds import STALL_CYCLES, STALL_FLOOR_SECONDS
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


def test_the_page_carries_the_stall_rule_from_the_thresholds_and_no_placeholder() -> None:
    page = live_page("project p rank 0", 4096)
    assert not re.search(r"__[A-Z_]+__", page)
    assert f"const STALL_CYCLES = {STALL_CYCLES}, STALL_FLOOR_SECONDS = {STALL_FLOOR_SECONDS};" in page
