"""benchmarks/compare.py's page: every run of each commit listed, and the ratio of the medians."""

from __future__ import annotations

from typing import Any

from benchmarks.compare import render


def _run(hot_us: float, scrape_ms: float) -> dict[str, Any]:
    return {
        "hot": [{"case": "default settings", "mean_us": hot_us}],
        "scrape": [{"case": "defaults, 1 rank", "median": scrape_ms, "p99": 2 * scrape_ms}],
        "render": {"median": 2 * scrape_ms},
    }


def test_the_page_lists_every_run_and_the_ratio_of_the_medians() -> None:
    results = {
        "aaa": [_run(40, 1.0), _run(50, 1.2), _run(45, 1.1)],
        "bbb": [_run(90, 1.1), _run(99, 1.3), _run(88, 1.2)],
    }
    page = render("aaa", "bbb", results, "python -m benchmarks.compare aaa bbb --runs 3")
    assert "| hot path, default settings: mean µs | 40.00, 50.00, 45.00 | 90.00, 99.00, 88.00 | 2.00 |" in page
    assert "| /metrics, defaults, 1 rank: median ms | 1.00, 1.20, 1.10 | 1.10, 1.30, 1.20 | 1.09 |" in page
    assert "| /metrics rendered in process, defaults: median ms | 2.00, 2.40, 2.20 | 2.20, 2.60, 2.40 | 1.09 |" in page
    assert "each in 3 fresh processes taken in turns" in page
