"""Pictures that tell the truth and shout: the live page and the report of a run that went NaN, of a run
that stalled, of the same run healthy again and of it ended.

Real trainings (tests/integration/fault_job.py, held open after training so that the page of a rank that ended can be
read), the pages rendered by headless Chromium; the screenshots go to test-artifacts/ in pytest's temporary
directory (/tmp/pytest-of-<user>/pytest-<n>/test-artifacts: tests/support/browser.py) (live-nan-run.png,
report-nan-run.png, live-stalled-run.png, live-healthy-run.png, live-ended-run.png, report-stalled-run.png,
live-stalling.png) for a reviewer, and the assertions check what the pages say: their state, banners, classes and
text. A stall within its deadline (amber) is read from a page served a real StepHistory's answer at a moment the
test chooses: a real run's learned deadline (5 s here) is passed as soon as the 5 s floor, so amber never shows.
"""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
import threading
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from ms_exporter.core import catalogue
from ms_exporter.core.store import MetricStore
from ms_exporter.core.thresholds import STALL_FLOOR_SECONDS
from ms_exporter.endpoint.live_history import StepHistory
from ms_exporter.endpoint.pages import live_page
from tests.integration.fault_job import HEALTHY_STEPS
from tests.support.browser import dom, screenshot
from tests.support.samples import sample
from tests.support.waiting import free_port, wait_until

# Long (make test-long): the suite's short version is test_live_page.py (a real run's live page, a NaN step among its
# points, in headless Chromium) and test_report.py (a NaN run's report).
pytestmark = [pytest.mark.integration, pytest.mark.long]
ROOT = Path(__file__).resolve().parents[2]
STEP_CHARTS = ("loss", "loss_smoothed", "learning_rate", "throughput", "step_time", "grad_norm")
# fault_job.py's main, whose training also stops at the step after a line on stdin (the test ends it once it has
# seen what it came for: as long as a loaded machine needs, no longer); then the process waits for its stdin to close,
# so that the monitor (closed at exit) keeps serving the page of the training that ended while the test reads it.
HELD_JOB = """
import sys, threading
from tests.integration import fault_job

stop = threading.Event()
step_end = fault_job.Fault.on_train_step_end


def on_train_step_end(self, run_context):
    step_end(self, run_context)
    if stop.is_set():
        run_context.request_stop()


def wait_for_stop():
    sys.stdin.readline()
    stop.set()


fault_job.Fault.on_train_step_end = on_train_step_end
threading.Thread(target=wait_for_stop, daemon=True).start()
fault_job.main()
sys.stdin.read()
"""


@dataclass
class Run:
    pages: dict[str, str]  # moment -> the live page's DOM then
    jsonl: Path


@dataclass(frozen=True)
class Moment:
    name: str  # the screenshot is live-<name>.png
    seen: Callable[[dict[str, Any]], bool]  # on the rank's /api/series answer
    what: str
    stop: bool = False  # then stop the training (at its next step end)


def series(base: str) -> dict[str, Any]:
    with urllib.request.urlopen(base + "api/series?since=-1", timeout=10) as response:
        return dict(json.loads(response.read()))


def canvases(page: str) -> dict[str, dict[str, str]]:
    found = {}
    for tag in re.findall(r"<canvas [^>]*>", page):
        attributes = dict(re.findall(r'([a-z-]+)="([^"]*)"', tag))
        found[attributes["id"][2:]] = attributes
    return found


def body(page: str) -> dict[str, str]:
    tag = re.search(r"<body [^>]*>", page)
    assert tag is not None, page[:500]
    return dict(re.findall(r'([a-z-]+)="([^"]*)"', tag.group(0)))


def banners(page: str) -> list[tuple[str, str, str]]:
    """(kind, class, text) of each banner on the live page, in order."""
    return [
        (kind, classes, text)
        for classes, kind, text in re.findall(r'<div class="(banner [a-z]+)" data-kind="([a-z-]+)">([^<]*)</div>', page)
    ]


def value(page: str, chart: str) -> tuple[str, str]:
    """(class, text) of a chart's headline value."""
    found = re.search(rf'<span class="([^"]*)" id="v-{chart}"[^>]*>([^<]*)<', page)
    assert found is not None, chart
    return found.group(1), found.group(2)


def section_classes(page: str, chart: str) -> str:
    found = re.search(rf'<section(?: class="([^"]*)")?[^>]*><h2>[^<]*<span [^>]*id="v-{chart}"', page)
    assert found is not None, chart
    return found.group(1) or ""


def distinct_ticks(canvas: dict[str, str]) -> list[str]:
    ticks = canvas["data-y-ticks"].split("|")
    assert len(ticks) >= 2 and all(a != b for a, b in zip(ticks, ticks[1:], strict=False)), ticks
    return ticks


def report(jsonl: Path, output: Path, *options: str) -> tuple[str, str]:
    done = subprocess.run(
        [sys.executable, "-m", "ms_exporter", "report", str(jsonl), "-o", str(output), *options],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout, dom(output.as_uri())


def report_states(page: str) -> list[tuple[str, str]]:
    """(state, level) of the badges in the report's table."""
    return [
        (state, level) for level, state in re.findall(r'<span class="badge ([a-z]+)" data-state="([a-z-]+)">', page)
    ]


def steps_of(jsonl: Path) -> list[int]:
    return [r["step"] for r in map(json.loads, jsonl.read_text().splitlines()) if r["type"] == "step"]


def watch(tmp: Path, project: str, arguments: tuple[str, ...], moments: list[Moment]) -> Run:
    """Run the fault job and keep the live page (DOM and live-<moment>.png) at each moment, in order; then let the
    job end."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GLOG_v": "3"}
    command = ["--port", str(port), "--project", project, "--save-dir", str(tmp), *arguments]
    job = subprocess.Popen(
        [sys.executable, "-c", HELD_JOB, *command],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env=env,
        cwd=ROOT,
    )
    base = f"http://127.0.0.1:{port}/"
    pages = {}
    try:
        assert job.stdout is not None and job.stdout.readline().startswith("metrics: ")
        for moment in moments:

            def seen(moment: Moment = moment) -> bool:
                try:
                    return moment.seen(series(base))
                except OSError:  # not serving: not up yet, or gone before the moment came (say so now)
                    assert job.poll() is None, f"the job ended (exit code {job.returncode}) before {moment.what}"
                    raise

            wait_until(seen, 240, moment.what, every=0.25)
            pages[moment.name] = dom(base)
            screenshot(base, f"live-{moment.name}.png", 1280, 900)
            if moment.stop:
                assert job.stdin is not None
                job.stdin.write("stop\n")
                job.stdin.flush()
        assert job.stdin is not None
        job.stdin.close()  # the job ends once its training has
        assert job.wait(240) == 0
    finally:
        job.kill()
    return Run(pages, tmp / "metrics-rank0.jsonl")


def last_row_age(now: dict[str, Any]) -> float:
    return float(now["now"] - now["rows"][-1][1]) if now["rows"] else float("inf")


def watch_nan_run(tmp: Path) -> Run:
    """Healthy for HEALTHY_STEPS steps, then every loss NaN until the test has seen 10 and the run ends normally."""
    return watch(
        tmp,
        "nan-run",
        ("--fault", "nan", "--seconds", "300"),
        [Moment("nan-run", lambda now: len(now["nonfinite_loss_steps"]) >= 10, "10 NaN steps", stop=True)],
    )


def watch_stalled_run(tmp: Path) -> Run:
    """Healthy, then one step whose callback hook stands still for 20 s (hang.min_seconds 5), then healthy again
    until the test has seen it so and the training ends normally: the page stalled, healthy again, and ended."""
    return watch(
        tmp,
        "stalled-run",
        ("--fault", "pause", "--pause", "20", "--seconds", "300"),
        [
            Moment(
                "stalled-run",
                lambda now: bool(now["hang_deadline"] and now["phase_seconds"] > now["hang_deadline"] + 2),
                "the run standing still past its hang deadline",
            ),
            Moment(
                "healthy-run",
                lambda now: (
                    now["phase"] not in (None, catalogue.ENDED)
                    and now["last_step"] >= HEALTHY_STEPS + 10
                    and last_row_age(now) < 2
                ),
                "the run stepping again after its stall",
                stop=True,
            ),
            Moment("ended-run", lambda now: now["phase"] == catalogue.ENDED, "the training's end"),
        ],
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Run]:
    """The NaN run and the stalled run side by side, each in its own process on its own port: the stalled run stands
    still (sleeps) for 20 s, and each waits on its own page's moments."""
    with ThreadPoolExecutor(2) as pool:
        nan = pool.submit(watch_nan_run, tmp_path_factory.mktemp("nan-run"))
        stalled = pool.submit(watch_stalled_run, tmp_path_factory.mktemp("stalled-run"))
        return {"nan": nan.result(), "stalled": stalled.result()}


@pytest.fixture(scope="module")
def nan_run(runs: dict[str, Run]) -> Run:
    return runs["nan"]


@pytest.fixture(scope="module")
def stalled_run(runs: dict[str, Run]) -> Run:
    return runs["stalled"]


def test_live_page_of_a_nan_run_shouts_and_marks_the_nan_steps(nan_run: Run) -> None:
    page = nan_run.pages["nan-run"]
    assert body(page)["data-state"] == "nonfinite"
    kind, classes, text = banners(page)[0]
    assert (kind, classes) == ("nonfinite", "banner bad")
    assert text.startswith(f"Loss NaN since step {HEALTHY_STEPS + 1}: "), text
    assert value(page, "loss") == ("value bad", "NaN")
    assert "bad" in section_classes(page, "loss")
    charts = canvases(page)
    # The loss chart's axis runs to the last step: a red tick per NaN step drawn, their stretch shaded.
    shown = re.search(r"(\d+) non-finite steps? shown", text)
    assert shown is not None and int(charts["loss"]["data-markers"]) == int(shown.group(1)) >= 1
    assert int(charts["loss"]["data-bands"]) == 1
    assert int(charts["learning_rate"]["data-markers"]) == 0  # NaN and breach marks only where they belong
    assert "bad" not in section_classes(page, "learning_rate")


def test_report_of_a_nan_run_spans_the_whole_run_on_every_chart_and_ends_nan(nan_run: Run, tmp_path: Path) -> None:
    steps = steps_of(nan_run.jsonl)
    printed, page = report(nan_run.jsonl, tmp_path / "report.html")
    assert "final loss NaN" in printed
    charts = canvases(page)
    for chart in STEP_CHARTS:  # the loss is finite only until the fault: the axis still runs to the last step
        assert float(charts[chart]["data-x-max"]) == steps[-1], chart
        assert float(charts[chart]["data-x-min"]) == steps[0], chart
    assert int(charts["loss"]["data-markers"]) == len(steps) - HEALTHY_STEPS
    assert int(charts["loss"]["data-bands"]) == 1
    assert int(charts["loss_smoothed"]["data-points"]) == HEALTHY_STEPS  # a gap, not a flat line, once NaN
    (row,) = re.findall(r"<tr><td>.*?</tr>", page)
    assert '<span class="bad">NaN</span> (last finite: ' in row and f"at step {HEALTHY_STEPS})" in row
    assert report_states(page) == [("nonfinite", "bad"), ("ended", "neutral")]
    assert body(page)["data-state"] == "nonfinite"
    screenshot((tmp_path / "report.html").as_uri(), "report-nan-run.png", 1280, 1100)


def test_live_page_of_a_stalled_run_is_red_past_the_deadline_and_greys_the_old_values(stalled_run: Run) -> None:
    page = stalled_run.pages["stalled-run"]
    # The fault job stands still inside a callback's step hook, which the monitor times as the callbacks phase.
    assert body(page)["data-state"] == "stalled" and body(page)["data-phase"] == "callbacks"
    (kind, classes, text), *_ = banners(page)
    assert (kind, classes) == ("stalled", "banner bad")
    assert re.fullmatch(r"Stalled for \d+ s, past its hang deadline of \d+ s - in callbacks for \d+ s", text), text
    for chart in ("loss", "throughput", "step_time", "learning_rate"):
        classes, shown = value(page, chart)
        assert classes == "value stale" and re.search(r"\(\d+ s old\)$", shown), (chart, classes, shown)
        assert "stale" in section_classes(page, chart)


def test_live_page_of_the_same_run_healthy_again_is_plain_with_ticks_that_differ(stalled_run: Run) -> None:
    page = stalled_run.pages["healthy-run"]
    assert body(page)["data-state"] == "healthy"
    assert banners(page) == [] and '<div id="banners"></div>' in page
    for chart in ("loss", "throughput", "learning_rate"):
        classes, shown = value(page, chart)
        assert classes == "value" and shown and "old" not in shown, (chart, classes, shown)
        assert section_classes(page, chart).strip() == ""
    # A cosine schedule 100 steps into 100,000 moves the learning rate by ~2e-9: labels with the digits that differ.
    distinct_ticks(canvases(page)["learning_rate"])


def test_live_page_of_the_run_that_ended_is_neutral_with_its_last_values(stalled_run: Run) -> None:
    page = stalled_run.pages["ended-run"]
    assert body(page)["data-state"] == "ended" and body(page)["data-phase"] == catalogue.ENDED
    ((kind, classes, text),) = banners(page)
    assert (kind, classes) == ("ended", "banner neutral")
    assert text == f"Training ended at step {body(page)['data-last-step']}"
    for chart in ("loss", "throughput"):
        classes, shown = value(page, chart)
        assert classes == "value" and shown and "old" not in shown, (chart, classes, shown)


def test_report_of_a_stalled_run_shows_the_stall_by_wall_clock(stalled_run: Run, tmp_path: Path) -> None:
    printed, page = report(stalled_run.jsonl, tmp_path / "report.html", "--hang-min-seconds", "5")
    assert re.search(rf"stalled 2\d s at step {HEALTHY_STEPS}\b", printed), printed
    (row,) = re.findall(r"<tr><td>.*?</tr>", page)
    assert re.search(rf'<span class="bad">1</span>: 2\d\.\ds at step {HEALTHY_STEPS}<', row), row
    assert report_states(page) == [("stalled", "warn"), ("ended", "neutral")]
    charts = canvases(page)
    for chart in ("wall_data_wait", "wall_step_time"):  # where the stall began and ended, on the wall-clock axis
        assert int(charts[chart]["data-markers"]) == 2, chart
        assert float(charts[chart]["data-x-max"]) > 20 / 60, chart
    screenshot((tmp_path / "report.html").as_uri(), "report-stalled-run.png", 1280, 1100)
    # With the monitor's default floor (120 s) a 20 s pause is no stall: the report follows the hang deadline.
    printed, page = report(stalled_run.jsonl, tmp_path / "default.html")
    assert ", stalled " not in printed
    assert report_states(page) == [("ended", "neutral")]


# -- a stall within its deadline, on a page served at a moment the test chooses ---------------------------------------

CYCLE = 0.5  # seconds between the steps of the served history


@pytest.fixture(scope="module")
def served() -> Iterator[tuple[str, dict[str, Any]]]:
    """The live page and a real StepHistory's answers, with the moment (`now`) and the phase set by the test: the
    endpoint's stall verdict is the one under test."""
    store = MetricStore((("rank", "0"), ("project", "pictures")))
    lr = store.register(catalogue.LEARNING_RATE).series()
    tokens = store.register(catalogue.TOKENS_PER_SECOND).series()
    moment: dict[str, Any] = {}
    history = StepHistory(store, {}, clock=lambda: float(moment["now"]))
    phases = store.register(catalogue.PHASE)
    phase_seconds = store.register(catalogue.PHASE_SECONDS).series()
    deadline = store.register(catalogue.HANG_DEADLINE).series()

    def answer(since: int) -> dict[str, Any]:
        for phase in catalogue.PHASES:
            phases.series(phase=phase).value = float(phase == moment["phase"])
        phase_seconds.value, deadline.value = moment["phase_seconds"], moment["hang_deadline"]
        return history.since(since)

    for step in range(1, 41):
        lr.value = 0.00100 - 0.00002 * step / 40  # 0.00100 down to 0.00098: labels that need 5 decimals
        tokens.value = 9470.0
        history.on_step(sample(step, 2.0 - step / 40, t=CYCLE * step))
    page = live_page("project pictures rank 0", history.capacity).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            path, _, query = self.path.partition("?")
            if path == "/api/series":
                since = int(urllib.parse.parse_qs(query).get("since", ["-1"])[0])
                body, kind = json.dumps(answer(since)).encode(), "application/json"
            else:
                body, kind = page, "text/html; charset=utf-8"
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/", moment
    finally:
        server.shutdown()
        server.server_close()


def test_live_page_of_a_stall_within_its_deadline_is_amber_and_greys_the_old_values(
    served: tuple[str, dict[str, Any]],
) -> None:
    base, moment = served
    last = 1e9 + CYCLE * 40
    # 3 cycles are 1.5 s: the floor holds. 4 s after the last step is nothing yet; 8 s is a stall (deadline 120 s).
    moment.update(now=last + STALL_FLOOR_SECONDS - 1, phase="data_wait", phase_seconds=3.9, hang_deadline=120.0)
    calm = dom(base)
    assert body(calm)["data-state"] == "healthy" and banners(calm) == []
    assert value(calm, "throughput") == ("value", "9470")
    assert distinct_ticks(canvases(calm)["learning_rate"]) == ["0.000980", "0.000985", "0.000990", "0.000995"]
    moment.update(now=last + 8, phase_seconds=7.9)
    page = dom(base)
    screenshot(base, "live-stalling.png", 1280, 900)
    assert body(page)["data-state"] == "stalling"
    ((kind, classes, text),) = banners(page)
    assert (kind, classes, text) == (
        "stalling",
        "banner warn",
        "Stalled for 8 s, deadline 120 s - in data_wait for 8 s",
    )
    assert value(page, "throughput") == ("value stale", "9470 (8 s old)")
    assert "stale" in section_classes(page, "throughput")


def test_axis_labels_carry_the_digits_that_tell_neighbouring_ticks_apart(tmp_path: Path) -> None:
    """chart.js's tickLabels on the tick sets that read wrong before (every label "0.0010"; 1.5 written "2")."""
    cases = {
        "learning rate": ([0.00096, 0.00098, 0.00100, 0.00102], False, True),
        "a rate that barely moves": ([0.0009999975, 0.000999998, 0.0009999985, 0.001], False, True),
        "halves": ([0, 0.5, 1, 1.5], False, True),
        "tokens/s": ([10010, 10020, 10030], False, True),
        "tiny": ([9.5e-6, 1e-5, 1.05e-5], False, True),
        "bytes": ([688 * 2**20, 688.25 * 2**20, 688.5 * 2**20], True, True),
        "log axis": ([0.31622776, 1, 3.1622776, 10], False, False),
    }
    chart = (ROOT / "ms_exporter" / "endpoint" / "web_assets" / "chart.js").read_text(encoding="utf-8")
    page = tmp_path / "ticks.html"
    page.write_text(
        f'<!DOCTYPE html><html><body><pre id="out"></pre><script>{chart}</script><script>'
        f"const cases = {json.dumps(cases)};"
        'document.getElementById("out").textContent = JSON.stringify(Object.fromEntries(Object.entries(cases).map('
        "([name, [ticks, bytes, even]]) => [name, msExporterChart.tickLabels(ticks, bytes, even)])));"
        "</script></body></html>",
        encoding="utf-8",
    )
    out = re.search(r'<pre id="out">(.*?)</pre>', dom(page.as_uri(), budget_ms=500), re.S)
    assert out is not None
    assert json.loads(html.unescape(out.group(1))) == {
        "learning rate": ["0.00096", "0.00098", "0.00100", "0.00102"],
        "a rate that barely moves": ["0.0009999975", "0.0009999980", "0.0009999985", "0.0010000000"],
        "halves": ["0", "0.5", "1.0", "1.5"],
        "tokens/s": ["10.01k", "10.02k", "10.03k"],
        "tiny": ["9.50e-6", "1.00e-5", "1.05e-5"],
        "bytes": ["688.0MiB", "688.3MiB", "688.5MiB"],
        "log axis": ["0.32", "1", "3.16", "10"],
    }
