"""`ms-exporter report` on JSON Lines it did not write: lines that are no record are skipped, counted and named."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ms_exporter.tools.report import MAX_LINE_BYTES, ReportError, load_run, render, summary


def step(number: int, loss: object = 0.5) -> bytes:
    return (
        json.dumps(
            {"type": "step", "rank": 0, "project": "odd", "step": number, "loss": loss, "time": 1000.0 + number}
        ).encode()
        + b"\n"
    )


# Lines that are no record, each with the words the report gives for it.
BAD_LINES = {
    "non-UTF-8": (b'{"type": "step", "step": 3, "loss": "\xff"}\n', "not UTF-8"),
    "NaN literal": (b'{"type": "step", "step": 3, "loss": NaN}\n', "NaN is not JSON"),
    "Infinity literal": (b'{"type": "step", "step": 3, "time": -Infinity}\n', "-Infinity is not JSON"),
    "overflowing number": (b'{"type": "step", "step": 3, "loss": 1e400}\n', "a number out of range"),
    "step that is text": (b'{"type": "step", "step": "three", "loss": 0.4}\n', "step is not a whole number"),
    "step that is a float": (b'{"type": "step", "step": 3.5}\n', "step is not a whole number"),
    "negative step": (b'{"type": "step", "step": -3}\n', "step is not a whole number"),
    "huge step": (b'{"type": "step", "step": 10000000000000000000000}\n', "step is not a whole number"),
    "metrics that are a list": (b'{"type": "snapshot", "metrics": [1, 2]}\n', "metrics are not a JSON object"),
    "a list": (b"[1, 2]\n", "not an ms_exporter JSON Lines record"),
    "no type": (b'{"step": 3}\n', "not an ms_exporter JSON Lines record"),
    "cut off": (b'{"type": "step", "st\n', "not JSON"),
    "deep nesting": (b'{"type": "event", "x": ' + b"[" * 100_000 + b"]" * 100_000 + b"}\n", "not JSON"),
    "5000-digit integer": (b'{"type": "step", "step": 4, "loss": ' + b"9" * 5000 + b"}\n", "not JSON"),
}


def write(path: Path, *lines: bytes) -> Path:
    path.write_bytes(b"".join(lines))
    return path


@pytest.mark.parametrize("kind", list(BAD_LINES))
def test_a_line_that_is_no_record_is_skipped_and_said(tmp_path: Path, kind: str) -> None:
    line, why = BAD_LINES[kind]
    path = write(tmp_path / "metrics-rank0.jsonl", step(1), step(2), line, step(3, "NaN"), step(4, 0.25))
    run = load_run([path])
    facts = summary(run)
    assert (facts["steps"], facts["records"], facts["final_loss"], facts["nonfinite_losses"]) == (4, 4, 0.25, 1)
    assert facts["skipped_lines"] == 1
    assert facts["skipped"].startswith(
        "skipped 1 lines that are not records: first at line 3 of metrics-rank0.jsonl: "
    ), facts["skipped"]
    assert why in facts["skipped"], facts["skipped"]
    assert "odd" in render([run])  # and the page renders


def test_the_report_command_says_what_it_skipped_and_prints_no_traceback(tmp_path: Path) -> None:
    path = write(tmp_path / "metrics-rank0.jsonl", step(1), *(line for line, _ in BAD_LINES.values()), step(2))
    output = tmp_path / "report.html"
    done = subprocess.run(
        [sys.executable, "-m", "ms_exporter", "report", str(path), "-o", str(output)],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert (
        f"skipped {len(BAD_LINES)} lines that are not records: first at line 2 of metrics-rank0.jsonl: not UTF-8"
        in done.stdout
    ), done.stdout
    assert output.is_file()


def test_a_50_mb_line_is_skipped_without_stopping_the_report(tmp_path: Path) -> None:
    """A line longer than MAX_LINE_BYTES is read past in chunks, never held whole: even a valid record is skipped."""
    huge = json.dumps({"type": "event", "event": "x" * (50 * 1024 * 1024)}).encode() + b"\n"
    assert len(huge) > MAX_LINE_BYTES
    path = write(tmp_path / "metrics-rank0.jsonl", step(1), huge, step(2), huge.rstrip(b"\n"))  # the last: no newline
    run = load_run([path])
    facts = summary(run)
    assert (facts["steps"], facts["events"], facts["skipped_lines"]) == (2, [], 2)
    assert facts["skipped"] == (
        "skipped 2 lines that are not records: first at line 2 of metrics-rank0.jsonl: "
        f"longer than {MAX_LINE_BYTES:,} bytes"
    )
    # A line of exactly the bound is still read.
    pad = MAX_LINE_BYTES - len(step(3)) + 1
    fits = step(3)[:-2] + b"," + b'"pad": "' + b"y" * (pad - len(b',"pad": ""')) + b'"}\n'
    assert len(fits) == MAX_LINE_BYTES + 1  # with its newline
    assert summary(load_run([write(tmp_path / "fits.jsonl", step(1), fits)]))["steps"] == 3


def test_the_wrong_file_is_still_named(tmp_path: Path) -> None:
    for first in (b"\xff\xfe binary\n", b"not json\n"):
        with pytest.raises(ReportError, match=r"wrong.jsonl:1: not"):
            load_run([write(tmp_path / "wrong.jsonl", first, step(1))])
    with pytest.raises(ReportError, match=r"no step records .*skipped 1 lines that are not records"):
        load_run(
            [write(tmp_path / "none.jsonl", b'{"type": "snapshot", "metrics": {}}\n', BAD_LINES["NaN literal"][0])]
        )
