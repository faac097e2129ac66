"""benchmarks/model_size.py's section: each size's row carries the compiled and the read-in-place step ends."""

from __future__ import annotations

from typing import Any

from benchmarks.model_size import render


def _row(size: str, parameters: float, monitored: bool, in_place: bool = False, hook_ms: float = 0.0) -> dict[str, Any]:
    row: dict[str, Any] = {
        "size": size,
        "parameters": parameters,
        "tensors": 24,
        "monitored": monitored,
        "in_place": in_place,
        "step_ms": 100.0 * parameters / 25e6,
        "peak_rss_mb": 1000.0 + 80 * monitored,
    }
    if monitored:
        row |= {
            "hook_sampled_ms": hook_ms,
            "hook_other_ms": 0.2,
            "bytes_per_sample": 100_000.0,
            "parts": {"weight_norm": {"sampled_ms": hook_ms, "bytes_per_sample": 100.0}},
        }
    return row


def test_a_sizes_row_shows_both_ways_and_a_failed_run_is_said() -> None:
    rows = [
        _row("1M", 1e6, False),
        _row("1M", 1e6, True, hook_ms=20.0),
        _row("1M", 1e6, True, in_place=True, hook_ms=2.0),
        _row("25M", 25e6, False),
        _row("25M", 25e6, True, hook_ms=90.0),
        {"size": "25M", "monitored": True, "in_place": True, "failed": "exit 1"},
    ]
    lines = render(rows, "make bench-model-size", 60, "a machine").splitlines()
    header = next(line for line in lines if line.startswith("| parameters"))
    table = [line for line in lines[lines.index(header) :] if line.startswith("| ")][:4]
    assert all(line.count("|") == header.count("|") for line in table)
    assert table[1].startswith("| 1.0 M | 4 ms | 100.0 KB | 20.0 ms | 500.0% | 2.0 ms | 50.0% |")
    assert table[2].startswith("| 25.0 M | 100 ms | 100.0 KB | 90.0 ms | 90.0% | — | — |")
    assert table[3].startswith("| 25M (read in place) | exit 1 |")
