"""`ms-exporter top` without a terminal: rows from pages a real monitor served, rendering, the slowest rank, targets.

The pages in tests/unit/data were captured from a real training run (tests/unit/data/capture_top.py): rank 1 of
project "capture" after step 4 and after step 8, with a gradient-norm breach and a switched-off probe in between.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from ms_exporter import cli
from ms_exporter.core import catalogue
from ms_exporter.core.ranks import RankInfo
from ms_exporter.sinks.file_sd import FileSdTarget
from ms_exporter.tools.rank_samples import parse_ranks
from ms_exporter.tools.scrape import Access, FetchError
from ms_exporter.tools.targets import (
    Target,
    TargetSpec,
    expand_targets,
    normalise_url,
    parse_target_argument,
    read_file_sd,
)
from ms_exporter.tools.top.poller import Poller
from ms_exporter.tools.top.render import COLUMNS, plain_text, render
from ms_exporter.tools.top.rows import (
    History,
    Row,
    Slowness,
    _call_seconds,
    build_row,
    down_row,
    mark_diverged,
    mark_failslow,
    mark_slowest,
)
from tests.support.scrape import Scrape

DATA = Path(__file__).parent / "data"
STEP4 = (DATA / "top_rank1_step4.prom").read_text()
STEP8 = (DATA / "top_rank1_step8.prom").read_text()
URL = "http://127.0.0.1:19421/metrics"


def first_row(text: str, history=None, now: float | None = None):  # type: ignore[no-untyped-def]
    groups = parse_ranks(text)
    assert list(groups) == [("capture", "1")]
    if now is None:
        now = Scrape(text).value("mindspore_train_last_step_timestamp_seconds") + 5.0
    return build_row(URL, "capture", "1", groups[("capture", "1")], history, now)


def test_first_poll_shows_the_page_and_means_over_the_whole_run() -> None:
    page = Scrape(STEP4)
    row, _ = first_row(STEP4)
    assert (row.rank, row.project, row.target) == ("1", "capture", URL)
    assert row.step == 4 == page.value("mindspore_train_global_step")
    assert row.loss == page.value("mindspore_train_loss")
    assert row.loss_smoothed == page.value("mindspore_train_loss_smoothed")
    assert row.tokens_per_second == page.value("mindspore_train_tokens_per_second")
    assert row.grad_norm == page.value("mindspore_train_grad_norm")
    assert row.memory_bytes == page.value("mindspore_train_memory_bytes", kind="host_rss")
    assert row.memory_kind == "rss"  # CPU: no device kinds
    assert row.age_seconds == pytest.approx(5.0)
    # No previous poll: the run's mean, compilation of the first step included.
    assert row.step_seconds == pytest.approx(page.value("mindspore_train_step_duration_seconds_sum") / 4)
    assert row.wait_seconds == pytest.approx(page.value("mindspore_train_data_wait_seconds_sum") / 4)
    assert row.step_seconds > 0.5  # the graph compile is in there
    # Two loss breaches happened before this poll: history, not news.
    assert page.value("mindspore_train_threshold_breaches_total", metric="loss") == 2
    assert row.alerts == ()
    assert row.error is None


def test_second_poll_takes_step_time_from_the_deltas_and_reports_what_changed() -> None:
    before, after = Scrape(STEP4), Scrape(STEP8)
    _, history = first_row(STEP4)
    row, history = first_row(STEP8, history)
    assert row.step == 8
    steps = after.value("mindspore_train_step_duration_seconds_count") - before.value(
        "mindspore_train_step_duration_seconds_count"
    )
    assert steps == 4
    assert row.step_seconds == pytest.approx(
        (
            after.value("mindspore_train_step_duration_seconds_sum")
            - before.value("mindspore_train_step_duration_seconds_sum")
        )
        / steps
    )
    assert row.step_seconds < 0.5  # compile is no longer in it
    assert row.wait_seconds == pytest.approx(
        (after.value("mindspore_train_data_wait_seconds_sum") - before.value("mindspore_train_data_wait_seconds_sum"))
        / steps
    )
    # grad_norm crossed its threshold between the polls; the loss breach count did not move.
    assert row.alerts == ("breach grad_norm", "throughput disabled")

    # Nothing new: the last means stay, the breach is held for a minute; no step for 30 s (far more than 3 cycles,
    # and the page of the time had no phase or deadline yet) is a stall.
    stamp = after.value("mindspore_train_last_step_timestamp_seconds")
    again, history = first_row(STEP8, history, now=stamp + 30)
    assert again.step_seconds == row.step_seconds and again.wait_seconds == row.wait_seconds
    assert again.alerts == ("stalled 30s", "breach grad_norm", "throughput disabled")
    later, _ = first_row(STEP8, history, now=stamp + 125)
    assert later.alerts == ("stalled 2m05s", "throughput disabled")


def test_a_restarted_rank_falls_back_to_its_whole_run_mean() -> None:
    _, history = first_row(STEP8)
    row, _ = first_row(STEP4, history)  # counters went back
    page = Scrape(STEP4)
    assert row.step_seconds == pytest.approx(page.value("mindspore_train_step_duration_seconds_sum") / 4)
    assert "breach grad_norm" not in row.alerts


def test_non_finite_loss_and_device_memory() -> None:
    lines = []
    for line in STEP8.splitlines():
        if line.startswith("mindspore_train_loss{"):
            line = line.rsplit(" ", 1)[0] + " NaN"
        elif line.startswith("mindspore_train_nonfinite_loss_total{"):
            line = line.rsplit(" ", 1)[0] + " 1.0"
        lines.append(line)
        if line.startswith('mindspore_train_memory_bytes{kind="host_rss"'):
            lines.append('mindspore_train_memory_bytes{kind="device_allocated",project="capture",rank="1"} 3.5e9')
    _, history = first_row(STEP8)
    row, _ = first_row("\n".join(lines) + "\n", history)
    assert row.alerts[0] == "loss NaN"
    assert row.memory_bytes == 3.5e9 and row.memory_kind == "dev"  # the device, when it reports
    cells = render([row]).rows[0].text
    assert "NaN" in cells and "3.3GiB dev" in cells


def test_a_page_with_several_ranks_gives_a_row_each() -> None:
    other = STEP8.replace('rank="1"', 'rank="0"')
    assert sorted(parse_ranks(STEP8 + other)) == [("capture", "0"), ("capture", "1")]
    with pytest.raises(ValueError):
        parse_ranks("this is { not prometheus text\n")


def row(rank: str, step: float, wait: float, project: str = "p", **extra: object) -> Row:
    return Row(
        target=f"http://h:{9000 + int(rank)}/metrics",
        rank=rank,
        project=project,
        step=100,
        loss=1.0,
        step_seconds=step,
        wait_seconds=wait,
        **extra,
    )  # type: ignore[arg-type]


def slowest(rows: list[Row]) -> list[str | None]:
    return [r.rank for r in mark_slowest(rows) if r.slowest]


def test_synchronous_ranks_the_one_with_the_data_wait_is_slowest() -> None:
    # Measured shape (docs/alerts.md): every cycle ~260 ms; rank 1 has the short step and the long data wait.
    rows = [row("0", 0.259, 0.0003), row("1", 0.080, 0.180), row("2", 0.255, 0.001)]
    assert slowest(rows) == ["1"]  # the largest step time (rank 0) would name a rank that waits


def test_ranks_at_their_own_pace_the_longest_cycle_is_slowest() -> None:
    rows = [row("0", 0.100, 0.001), row("1", 0.300, 0.000), row("2", 0.100, 0.050)]
    assert slowest(rows) == ["1"]


def test_a_rank_far_behind_is_flagged_straggler_as_the_alert_would() -> None:
    synchronous = mark_slowest([row("0", 0.259, 0.0003), row("1", 0.080, 0.180), row("2", 0.255, 0.001)])
    assert [r.rank for r in synchronous if "straggler" in r.alerts] == ["1"]
    own_pace = mark_slowest([row("0", 0.100, 0.001), row("1", 0.300, 0.000), row("2", 0.100, 0.020)])
    assert [r.rank for r in own_pace if "straggler" in r.alerts] == ["1"]
    # A data wait over 1.5 times the median is a straggler only where it is at least 20% of the rank's cycle.
    waiting = mark_slowest([row("0", 0.100, 0.001), row("1", 0.100, 0.030), row("2", 0.100, 0.001)])
    assert [r.rank for r in waiting if "straggler" in r.alerts] == ["1"]
    assert all(
        "straggler" not in r.alerts
        for r in mark_slowest([row("0", 0.100, 0.001), row("1", 0.100, 0.020), row("2", 0.100, 0.001)])
    )
    # Near-equal ranks: one is still marked slowest, none is a straggler.
    close = mark_slowest([row("0", 0.100, 0.010), row("1", 0.105, 0.012), row("2", 0.100, 0.011)])
    assert [r.rank for r in close if r.slowest] == ["1"] and all("straggler" not in r.alerts for r in close)


def test_the_rank_whose_fingerprint_left_its_group_is_marked_diverged() -> None:
    def at(rank: str, step: float, value: float, group: str = "0", project: str = "p") -> Row:
        return row(rank, 0.1, 0.0, project, fingerprint=(group, step, value))

    marked = mark_diverged(
        [at("0", 300, 11), at("1", 300, 11), at("2", 300, 22), at("3", 300, 33, "1"), at("4", 300, 33, "1")]
    )
    assert [r.rank for r in marked if "diverged" in r.alerts] == ["2"]
    assert [r.rank for r in mark_diverged([at("0", 300, 11), at("1", 300, 22)]) if "diverged" in r.alerts] == [
        "0",
        "1",
    ]  # two that differ: both, as the alert names them
    assert all("diverged" not in r.alerts for r in mark_diverged([at("0", 400, 44), at("1", 300, 11)]))
    assert all("diverged" not in r.alerts for r in mark_diverged([at("0", 300, 11), at("1", 300, 22, project="q")]))


def test_the_rank_and_bucket_whose_checksum_differs_are_marked_sdc() -> None:
    """The replica checks' buckets by MindSporeTrainingSilentDataCorruption's rule: rank 2's optimizer bucket 1
    differs, its weights agree (the fingerprint too)."""

    def at(rank: str, moment: float, step: float = 300) -> Row:
        checksums = ((("optimizer", "0"), 5.0), (("optimizer", "1"), moment), (("weights", "0"), 7.0))
        return row(rank, 0.1, 0.0, "p", fingerprint=("0", step, 11.0), checksums=checksums)

    marked = mark_diverged([at("0", 1.0), at("1", 1.0), at("2", 2.0)])
    assert [(r.rank, [a for a in r.alerts if a.startswith(("sdc", "diverged"))]) for r in marked] == [
        ("0", []),
        ("1", []),
        ("2", ["sdc optimizer/1"]),
    ]
    assert all(not r.alerts for r in mark_diverged([at("0", 1.0), at("1", 1.0), at("2", 2.0, step=400)]))


def test_slowest_needs_two_ranks_ignores_down_ones_and_is_per_project() -> None:
    assert slowest([row("0", 0.1, 0.0)]) == []
    down = down_row(Target("http://h:1/metrics", rank="3", project="p"), "Connection refused")
    assert slowest([row("0", 0.1, 0.0), down]) == []
    rows = [
        row("0", 0.1, 0.0, "a"),
        row("1", 0.2, 0.0, "a"),
        row("0", 0.5, 0.0, "b"),
        row("1", 0.1, 0.0, "b"),
        row("2", None, None, "b"),
    ]  # type: ignore[arg-type]
    assert [(r.project, r.rank) for r in mark_slowest(rows) if r.slowest] == [("a", "1"), ("b", "0")]


def test_render_lines_up_columns_and_marks_the_slowest_without_colours() -> None:
    rows = mark_slowest(
        [
            row("0", 0.1, 0.0005, memory_bytes=585777152.0, memory_kind="rss", age_seconds=3.2),
            row("1", 0.1, 0.04, alerts=("breach loss",)),
            down_row(Target("http://h:9/metrics", rank="2", project="p"), "Connection refused"),
        ]
    )
    screen = render(rows)
    text = plain_text(screen)
    assert screen.title.text == "ms-exporter top - 2 up, 1 down"
    assert render(rows, None, "12:00:00").title.text == "ms-exporter top - 2 up, 1 down - 12:00:00"
    header = screen.header.text
    for column in COLUMNS[1:]:
        assert column.header in header
    assert header.rstrip().endswith("ALERTS")
    ranks = [line.text.split()[0] for line in screen.rows]
    assert ranks == ["0", ">", "2"]  # the marker column, then rank 1
    assert screen.rows[1].text.startswith(">") and screen.rows[1].style == "slowest"
    assert screen.rows[1].text.split()[1] == "1"
    assert "558.6MiB rss" in screen.rows[0].text and "3s ago" in screen.rows[0].text
    assert "breach loss" in screen.rows[1].text
    assert screen.rows[2].style == "down" and screen.rows[2].text.rstrip().endswith("DOWN: Connection refused")
    assert screen.rows[2].text.split()[:3] == ["2", "-", "-"]  # the rank from file_sd labels, no numbers
    # Every column starts at the same offset on every line.
    offset = header.index("STEP TIME") + len("STEP TIME")
    assert screen.rows[0].text[offset - len("100.0ms") : offset] == "100.0ms"
    assert "> slowest: rank 1 of p, step cycle 140.0ms = step 100.0ms + data wait 40.0ms" in text


@pytest.mark.parametrize("width", [200, 120, 80, 60, 40, 20, 5])
def test_narrow_terminals_drop_columns_from_the_right_but_keep_alerts(width: int) -> None:
    rows = mark_slowest([row("0", 0.1, 0.0, alerts=("breach loss",)), row("1", 0.1, 0.05)])
    wide = render(rows)
    screen = render(rows, width, "12:00:00 - every 2s - q quits, arrows scroll")
    for line in [screen.title, screen.header, *screen.rows, *screen.footer]:
        assert len(line.text) <= width
    kept = [c.header for c in COLUMNS[1:] if c.header in screen.header.text]
    assert kept == [c.header for c in COLUMNS[1 : 1 + len(kept)]]  # a prefix: dropped from the right
    if width >= len(wide.header.text):
        assert screen.header.text == wide.header.text
    elif width >= 40:
        assert "TARGET" not in screen.header.text and "ALERTS" in screen.header.text
        assert "breach loss" in screen.rows[0].text
        assert kept[:2] == ["RANK", "STEP"]
    if width >= 20:
        assert screen.rows[1].text.startswith(">")


def test_targets_urls_host_port_and_bad_arguments(tmp_path: Path) -> None:
    assert normalise_url("127.0.0.1:9100") == "http://127.0.0.1:9100/metrics"
    assert normalise_url("node-3:9100", "https") == "https://node-3:9100/metrics"
    assert normalise_url("[::1]:9100") == "http://[::1]:9100/metrics"
    assert normalise_url("node:9100/custom") == "http://node:9100/custom"
    assert parse_target_argument("node:9100/metrics") == TargetSpec("url", "http://node:9100/metrics")
    assert normalise_url("https://node:9100") == "https://node:9100/metrics"
    assert normalise_url("http://node:9100/custom?x=1") == "http://node:9100/custom?x=1"
    assert parse_target_argument(str(tmp_path)) == TargetSpec("dir", str(tmp_path))
    for bad in (
        "node",
        "ftp://node:21/metrics",
        "http://:9100/metrics",
        "http://node:99999/metrics",
        str(tmp_path / "missing"),
        "targets.json",
    ):
        with pytest.raises(ValueError, match="host:port"):
            parse_target_argument(bad)
    not_json = tmp_path / "targets.yml"
    not_json.write_text("[]")
    with pytest.raises(ValueError, match="not a file_sd .json file"):
        parse_target_argument(str(not_json))


def test_file_sd_directories_are_read_as_the_monitor_writes_them(tmp_path: Path) -> None:
    for rank in (0, 1):
        FileSdTarget(str(tmp_path), "bert", RankInfo(rank, rank, 2, "node-a"), "127.0.0.1", 19420 + rank).write()
    (tmp_path / "tls.json").write_text(
        json.dumps([{"targets": ["10.0.0.5:9443"], "labels": {"__scheme__": "https", "rank": "7"}}])
    )
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "notes.txt").write_text("ignored")
    specs = [TargetSpec("dir", str(tmp_path)), TargetSpec("url", "http://127.0.0.1:19420/metrics")]
    targets = expand_targets(specs)
    by_url = {t.url: t for t in targets}
    assert len(targets) == 4  # the URL given twice is polled once
    assert by_url["http://127.0.0.1:19420/metrics"] == Target("http://127.0.0.1:19420/metrics", "0", "bert")
    assert by_url["http://127.0.0.1:19421/metrics"].rank == "1"
    assert by_url["https://10.0.0.5:9443/metrics"].rank == "7"
    broken = by_url[str(tmp_path / "broken.json")]
    assert broken.problem is not None and broken.problem.startswith("bad file_sd file:")
    # A rank that leaves removes its file: the next poll no longer has it.
    FileSdTarget(str(tmp_path), "bert", RankInfo(1, 1, 2, "node-a"), "127.0.0.1", 19421).remove()
    assert "http://127.0.0.1:19421/metrics" not in {t.url for t in expand_targets(specs)}
    assert read_file_sd(tmp_path / "gone.json") == []


def test_poller_a_hanging_rank_does_not_hold_up_the_others() -> None:
    release = threading.Event()
    calls: list[str] = []

    def fetcher(url: str, access: Access) -> str:
        calls.append(url)
        if "hang" in url:
            release.wait(10)
            return STEP8
        if "refused" in url:
            raise FetchError("Connection refused")
        if "other" in url:
            return "# not ours\nprocess_cpu_seconds_total 1.0\n"
        return STEP4 if url.endswith("1/metrics") else STEP8.replace('rank="1"', 'rank="0"')

    urls = [
        "http://a:1/metrics",
        "http://b:2/metrics",
        "http://hang:3/metrics",
        "http://refused:4/metrics",
        "http://other:5/metrics",
    ]
    poller = Poller([TargetSpec("url", u) for u in urls], Access(timeout=0.3), fetcher=fetcher)
    try:
        started = time.monotonic()
        rows = poller.poll()
        assert time.monotonic() - started < 2.0
        by_target = {r.target: r for r in rows}
        assert by_target["http://a:1/metrics"].step == 4 and by_target["http://b:2/metrics"].step == 8
        assert by_target["http://hang:3/metrics"].error == "no answer within 0.3s"
        assert by_target["http://refused:4/metrics"].error == "Connection refused"
        assert "not an ms_exporter endpoint" in (by_target["http://other:5/metrics"].error or "")
        assert [r.rank for r in rows[:2]] == ["0", "1"]  # sorted by rank
        rows = poller.poll()
        assert calls.count("http://hang:3/metrics") == 1  # not asked again while its request is open
        release.set()
    finally:
        poller.close()


def test_cli_errors_say_what_is_allowed(capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    cases = [
        (["top", "--once", "node"], "is not a URL (http[s]://host:port[/path]"),
        (["top", "--once", "--interval", "0", "h:1"], "--interval must be a number of seconds > 0"),
        (
            ["top", "--once", "--user", "u", "h:1"],
            "--user needs a password: --password, or the MS_EXPORTER_TOP_PASSWORD environment variable",
        ),
        (["top", "--once", "--password", "p", "h:1"], "needs --user"),
        (["top", "--once", "--cafile", "ca.pem", "--insecure", "h:1"], "exclude each other"),
        (["top", "--once", "--cafile", "/nonexistent/ca.pem", "h:1"], "TLS files:"),
        (["top", "--once", "--scheme", "ftp", "h:1"], "invalid choice: 'ftp'"),
        (["top", "h:1"], "the live view needs a terminal; use --once"),
    ]
    for argv, message in cases:
        with pytest.raises(SystemExit) as exit_info:
            cli.main(argv)
        assert exit_info.value.code == 2
        assert message in capsys.readouterr().err
    monkeypatch.setenv("MS_EXPORTER_TOP_PASSWORD", "secret")
    with pytest.raises(SystemExit):
        cli.main(["top", "--once", "h:1"])  # a password from the environment still needs a user
    assert "needs --user" in capsys.readouterr().err


def test_memory_growth_is_flagged_as_the_alert_would() -> None:
    def grown(ratio: float, bytes_per_second: float) -> tuple[str, ...]:
        labels = '{kind="host_rss",project="capture",rank="1"}'
        page = (
            STEP8 + f"mindspore_train_memory_growth_ratio{labels} {ratio}\n"
            f"mindspore_train_memory_growth_bytes_per_second{labels} {bytes_per_second}\n"
        )
        return first_row(page)[0].alerts

    assert "memory +45% rss" in grown(0.45, 2e6)  # above the default 30% and still growing (2 MB/s)
    assert not any(alert.startswith("memory") for alert in grown(0.45, 1000))  # grew once, now flat: no leak
    assert not any(alert.startswith("memory") for alert in grown(0.1, 2e6))  # growing, but within 30%


def with_phase(page: str, phase: str, rank: str = "1") -> str:
    """The captured page (taken before phases existed) with the phase series a rank now serves."""
    page = page.replace('rank="1"', f'rank="{rank}"')
    lines = [
        f'mindspore_train_phase{{phase="{name}",project="capture",rank="{rank}"}} {float(name == phase)}'
        for name in catalogue.PHASES
    ]
    return page + "\n".join(lines) + "\n"


def test_the_phase_is_shown_and_an_ended_rank_is_not_stalled() -> None:
    row, _ = first_row(with_phase(STEP8, "data_wait"))
    assert row.phase == "data_wait" and not row.ended
    late = Scrape(STEP8).value("mindspore_train_last_step_timestamp_seconds") + 3600
    stalled, _ = first_row(with_phase(STEP8, "step"), now=late)
    assert "stalled 1h00m in step" in stalled.alerts
    ended, _ = first_row(with_phase(STEP8, "ended"), now=late)
    assert ended.ended and ended.stall is None and not any("stalled" in alert for alert in ended.alerts)
    screen = render([row, ended])
    assert "PHASE" in screen.header.text and "data_wait" in screen.rows[0].text
    assert screen.title.text.startswith("ms-exporter top - 1 up, 1 ended, 0 down")


def test_a_rank_that_ended_and_went_is_ended_and_one_that_crashed_is_down(tmp_path: Path) -> None:
    answering = {"http://127.0.0.1:19420/metrics", "http://127.0.0.1:19421/metrics"}

    def fetcher(url: str, access: Access) -> str:
        if url not in answering:
            raise FetchError("Connection refused")
        return with_phase(STEP8, "ended", "0") if url.endswith("19420/metrics") else with_phase(STEP8, "step", "1")

    poller = Poller([TargetSpec("url", url) for url in sorted(answering)], Access(timeout=1), fetcher=fetcher)
    try:
        assert [(r.rank, r.phase, r.error) for r in poller.poll()] == [("0", "ended", None), ("1", "step", None)]
        answering.clear()  # both processes exit: rank 0 after its training ended, rank 1 in the middle of it
        ended, down = poller.poll()
        assert ended.error is None and ended.ended and ended.step == 8
        assert ended.alerts == ("ended; endpoint gone (Connection refused)",)
        assert down.rank is None and down.error == "Connection refused"
        assert render([ended, down]).title.text.startswith("ms-exporter top - 0 up, 1 ended, 1 down")
    finally:
        poller.close()

    # Discovered through file_sd: a rank that leaves discovery without having ended stays on screen as DOWN.
    for rank in (0, 1):
        FileSdTarget(str(tmp_path), "capture", RankInfo(rank, rank, 2, "node-a"), "127.0.0.1", 19420 + rank).write()
    answering.update({"http://127.0.0.1:19420/metrics", "http://127.0.0.1:19421/metrics"})
    poller = Poller([TargetSpec("dir", str(tmp_path))], Access(timeout=1), fetcher=fetcher)
    try:
        assert len(poller.poll()) == 2
        for rank in (0, 1):
            FileSdTarget(str(tmp_path), "capture", RankInfo(rank, rank, 2, "node-a"), "127.0.0.1", 0).remove()
        (left,) = poller.poll()
        assert (left.rank, left.error) == ("1", "left discovery without ending")
    finally:
        poller.close()


def test_label_values_with_terminal_escapes_are_shown_not_sent() -> None:
    """A target's label values reach the operator's terminal: escapes (clear screen, retitle, bell) are defused."""
    hostile = "\x1b]0;owned\x07\x1b[2J"
    page = STEP8.replace('project="capture"', f'project="{hostile}"')
    (key,) = parse_ranks(page)
    assert key[0] == hostile  # the page really carries the escape
    row, _ = build_row(URL, key[0], key[1], parse_ranks(page)[key], None, time.time())
    text = plain_text(render([dataclasses.replace(row, slowest=True), row_with_error(hostile)]))
    assert "\x1b" not in text and "\x07" not in text
    assert "\\x1b]0;owned\\x07" in text  # still there to read


def row_with_error(error: str) -> Row:
    return Row(target="http://h:1/metrics", rank="9", project="p", error=f"refused: {error}")


def test_mfu_column_shows_the_ranks_model_flops_utilisation_and_a_dash_without_a_peak() -> None:
    without, _ = first_row(STEP4)
    assert without.mfu is None and render([without]).header.text.split().count("MFU") == 1
    page = STEP4 + '# TYPE mindspore_train_mfu gauge\nmindspore_train_mfu{project="capture",rank="1"} 0.4321\n'
    row, _ = first_row(page)
    assert row.mfu == 0.4321
    header = render([row]).header.text
    cells = render([row]).rows[0].text
    column = header.index("MFU")
    assert cells[column - 3 : column + 3].strip() == "43.2%"
    assert "-" in render([without]).rows[0].text[column - 3 : column + 3]


def with_devices(page: str, lines: dict[str, float]) -> str:
    """The captured page (taken before the hardware monitor existed) with device series, written as `name{labels}`
    without the rank's own labels."""
    extra = [
        f'{series[:-1]},project="capture",rank="1"}} {value}' if series.endswith("}") else f"{series} {value}"
        for series, value in lines.items()
    ]
    return page + "\n".join(extra) + "\n"


def cell(screen_row: str, header: str, column: str) -> str:
    """The text under `column` (right-aligned columns end where their header ends)."""
    end = header.index(column) + len(column)
    start = header.rfind("  ", 0, header.index(column)) + 2
    return screen_row[start:end].strip()


def test_device_columns_show_the_hottest_accelerator_its_throttling_and_the_busiest() -> None:
    page = with_devices(
        STEP4,
        {
            'mindspore_train_device_temperature_celsius{device="gpu0"}': 78,
            'mindspore_train_device_temperature_celsius{device="gpu1"}': 91,
            'mindspore_train_device_temperature_celsius{device="host"}': 99,  # the host is not an accelerator
            'mindspore_train_device_utilization_ratio{device="gpu0"}': 0.93,
            'mindspore_train_device_utilization_ratio{device="gpu1"}': 0.5,
            'mindspore_train_device_utilization_ratio{device="host"}': 0.2,
            # An idle GPU, or a loaded one at its power cap (its normal state), is not throttled.
            'mindspore_train_device_throttled{device="gpu0",reason="gpu_idle"}': 1,
            'mindspore_train_device_throttled{device="gpu0",reason="sw_power_cap"}': 1,
            'mindspore_train_device_throttled{device="gpu1",reason="hw_thermal_slowdown"}': 1,
        },
    )
    row, _ = first_row(page)
    assert row.temperature == ("gpu1", 91) and row.throttled == ("gpu1",) and row.utilization == ("gpu0", 0.93)
    assert "gpu1 hot 91C" in row.alerts and "gpu1 throttled" in row.alerts
    assert not any("host" in alert or "gpu0" in alert for alert in row.alerts)
    screen = render([row])
    header, text = screen.header.text, screen.rows[0].text
    assert cell(text, header, "DEVICE TEMP") == "91C gpu1"
    assert cell(text, header, "THROTTLED") == "gpu1"
    assert cell(text, header, "DEVICE UTIL") == "93.0% gpu0"
    # Below the DeviceHot threshold and clock free: no alert, "no" under THROTTLED.
    thermal = 'reason="hw_thermal_slowdown",project="capture",rank="1"}'
    quiet, _ = first_row(page.replace(" 91\n", " 84\n").replace(f"{thermal} 1", f"{thermal} 0"))
    assert quiet.alerts == () and quiet.throttled == ()
    screen = render([quiet])
    assert cell(screen.rows[0].text, screen.header.text, "THROTTLED") == "no"


def test_a_cpu_only_rank_shows_its_host_or_a_dash() -> None:
    host = with_devices(
        STEP4,
        {
            'mindspore_train_device_temperature_celsius{device="host"}': 95,
            'mindspore_train_device_utilization_ratio{device="host"}': 0.25,
        },
    )
    row, _ = first_row(host)
    assert row.temperature == ("host", 95) and row.utilization == ("host", 0.25) and row.throttled is None
    assert row.alerts == ()  # a host CPU's heat is not DeviceHot's business
    screen = render([row])
    header = screen.header.text
    assert cell(screen.rows[0].text, header, "DEVICE TEMP") == "95C host"
    assert cell(screen.rows[0].text, header, "DEVICE UTIL") == "25.0% host"
    assert cell(screen.rows[0].text, header, "THROTTLED") == "-"
    bare, _ = first_row(STEP4)  # no hardware series at all (a sensorless host, the monitor off)
    assert (bare.temperature, bare.throttled, bare.utilization) == (None, None, None)
    screen = render([bare])
    cells = [cell(screen.rows[0].text, screen.header.text, c) for c in ("DEVICE TEMP", "THROTTLED", "DEVICE UTIL")]
    assert cells == ["-", "-", "-"]


# -- a stall, a non-finite loss, an ended rank and stale values at a glance -----------------------------------------


def with_stall(page: str, phase: str, phase_seconds: float, deadline: float) -> str:
    """The page with the phase, its seconds and the rank's hang deadline (series the captured pages predate)."""
    return with_phase(page, phase) + (
        f'mindspore_train_phase_seconds{{project="capture",rank="1"}} {phase_seconds}\n'
        f'mindspore_train_hang_deadline_seconds{{project="capture",rank="1"}} {deadline}\n'
    )


def right_cell(screen_row: str, header: str, column: str) -> str:
    """The text of a right-aligned column (it ends where its header ends), also one wider than its header."""
    return screen_row[: header.index(column) + len(column)].split()[-1]


def stamp_of(page: str) -> float:
    return Scrape(page).value("mindspore_train_last_step_timestamp_seconds")


def test_pictures_a_stall_is_amber_after_a_few_cycles_and_red_past_the_deadline() -> None:
    _, history = first_row(STEP4)
    stamp = stamp_of(STEP8)

    def poll(seconds: float, deadline: float = 120.0) -> Row:
        return first_row(with_stall(STEP8, "data_wait", seconds - 0.5, deadline), history, now=stamp + seconds)[0]

    fresh = poll(4.0)  # cycles of ~5 ms: the floor (5 s) holds, and 4 s is within it
    assert fresh.cycle_seconds is not None and 3 * fresh.cycle_seconds < 5
    assert fresh.stall is None and not fresh.critical
    assert not any("stalled" in alert.lower() for alert in fresh.alerts)
    screen = render([fresh])
    assert "(" not in screen.rows[0].text and screen.rows[0].dim == ()

    amber = poll(6.0)
    assert amber.stall is not None and not amber.stall.past_deadline and not amber.critical
    assert amber.alerts[0] == "stalled 6s in data_wait, deadline 2m00s"
    screen = render([amber])
    line, header = screen.rows[0], screen.header.text
    assert line.style == "alert"
    # The last step's values are stale: in parentheses, and dimmed on the live screen; the step is not a value.
    assert right_cell(line.text, header, "LOSS") == f"({amber.loss:.5g})"
    assert right_cell(line.text, header, "STEP") == "8"
    dimmed = [line.text[start:end].strip() for start, end in line.dim]
    # Every value of the last step the page has (no MFU here: a "-" is no value) and nothing else.
    assert dimmed == ["(0.89653)", "(0.67819)", "(165.3)", "(3.9ms)", "(2.3ms)", "(4.56)"]

    red = poll(131.0)  # the phase (130.5 s) is past the rank's deadline: MindSporeTrainingStalled's rule
    assert red.stall is not None and red.stall.past_deadline and red.critical
    assert red.alerts[0] == "STALLED 2m11s in data_wait, past deadline 2m00s"
    assert render([red]).rows[0].style == "critical"
    # Past its deadline is red also before a few cycles have passed without a step (the phase is the rule's).
    early = first_row(with_stall(STEP8, "step", 30.0, 20.0), history, now=stamp + 1.0)[0]
    assert early.stall is not None and early.stall.past_deadline
    # A NaN deadline (a phase without one) is no deadline.
    undated = first_row(with_stall(STEP8, "data_wait", 5.5, float("nan")), history, now=stamp + 6.0)[0]
    assert undated.alerts[0] == "stalled 6s in data_wait"


def test_pictures_the_stall_waits_three_cycles_of_a_slow_rank_and_at_most_stale_seconds() -> None:
    page = Scrape(STEP8)
    count = page.value("mindspore_train_step_duration_seconds_count")
    total = page.value("mindspore_train_step_duration_seconds_sum")
    waited = page.value("mindspore_train_data_wait_seconds_sum")
    # The previous poll 4 steps before, 4 s per step then: a cycle of ~4 s, so a stall after ~12 s.
    slow = History(duration=(total - 16.0, count - 4), wait_sum=waited)
    stamp = stamp_of(STEP8)
    within = first_row(with_stall(STEP8, "step", 10.0, 120.0), slow, now=stamp + 10.0)[0]
    assert within.cycle_seconds == pytest.approx(4.0, abs=0.01) and within.stall is None
    beyond = first_row(with_stall(STEP8, "step", 13.0, 120.0), slow, now=stamp + 13.0)[0]
    assert beyond.stall is not None and beyond.alerts[0] == "stalled 13s in step, deadline 2m00s"
    # --stale-seconds is the latest a rank without a step is flagged, whatever its cycle.
    groups = parse_ranks(with_stall(STEP8, "step", 10.0, 120.0))
    capped, _ = build_row(URL, "capture", "1", groups[("capture", "1")], slow, stamp + 10.0, stale_seconds=8.0)
    assert capped.stall is not None
    # In sink mode a hook call covers the sink: 100 steps a call (9 data waits in 10 calls), 0.11 s a step.
    assert _call_seconds(0.1, 0.01, 1000.0, 9.0) == pytest.approx(11.0)
    assert _call_seconds(0.1, 0.01, 8.0, 7.0) == pytest.approx(0.11)


def test_pictures_a_non_finite_loss_is_red_and_an_ended_rank_neutral_with_its_values() -> None:
    nan = STEP8.replace('mindspore_train_loss{project="capture",rank="1"} 0.8965318202972412', "")
    nan += 'mindspore_train_loss{project="capture",rank="1"} NaN\n'
    stamp = stamp_of(STEP8)
    row, _ = first_row(nan, now=stamp + 1.0)
    assert row.critical and row.stall is None and row.alerts[0] == "loss NaN"
    line = render([mark_slowest([row])[0]]).rows[0]
    assert line.style == "critical" and right_cell(line.text, render([row]).header.text, "LOSS") == "NaN"
    # An ended rank, an hour after its last step: "ended" in its alerts, its last values as they are, no colour.
    ended, _ = first_row(with_stall(STEP4, "ended", 3600.0, float("nan")), now=stamp_of(STEP4) + 3600)
    assert ended.ended and ended.stall is None and not ended.critical
    screen = render([ended])
    header, text = screen.header.text, screen.rows[0].text
    assert screen.rows[0].style == "normal" and screen.rows[0].dim == ()
    assert right_cell(text, header, "LOSS") == f"{ended.loss:.5g}"
    assert text.rstrip().endswith("ended")
    # A healthy rank: plain, nothing in parentheses.
    healthy, _ = first_row(STEP4, now=stamp_of(STEP4) + 2.0)
    screen = render([healthy])
    assert screen.rows[0].style == "normal" and "(" not in screen.rows[0].text and healthy.alerts == ()


def test_a_local_gradient_outlier_since_the_last_poll_is_marked_and_held() -> None:
    def with_outliers(text: str, count: int) -> str:
        return (
            text
            + f'mindspore_train_local_grad_outliers_total{{project="capture",rank="1",replica_group="0"}} {count}\n'
        )

    _, history = first_row(with_outliers(STEP4, 1))  # one before the first poll: history, not news
    row, history = first_row(with_outliers(STEP8, 1), history)
    assert "sdc local_gradients" not in row.alerts
    row, history = first_row(with_outliers(STEP8, 2), history)
    assert "sdc local_gradients" in row.alerts
    stamp = Scrape(STEP8).value("mindspore_train_last_step_timestamp_seconds")
    later, _ = first_row(with_outliers(STEP8, 2), history, now=stamp + 125)
    assert "sdc local_gradients" not in later.alerts


def _slow(rank: str, own: float, flagged: bool = False, node: str = "a", stage: str | None = None) -> Row:
    onset, size = (1234.0, own / 0.1) if flagged else (None, None)
    groups = (("stage", stage),) if stage is not None else ()
    return row(rank, 0.1, own, node=node, slowness=Slowness(own, 0.1, flagged, onset, size), groups=groups)


def test_failslow_names_the_flagged_rank_the_job_waits_for_with_its_onset_and_not_a_waiter_flagged_by_noise() -> None:
    rows = [_slow("0", 0.001), _slow("1", 0.0015, flagged=True), _slow("2", 0.021, flagged=True), _slow("3", 0.001)]
    marked = {r.rank: r.alerts for r in mark_failslow(rows)}
    # Rank 1's own detector flagged a blip, but it costs the job nothing against the best rank: no alert.
    assert marked == {"0": (), "1": (), "2": ("fail-slow from step 1234 (+21%)",), "3": ()}


def test_failslow_of_every_rank_of_a_node_names_the_node() -> None:
    rows = [
        _slow("0", 0.001, node="a"),
        _slow("1", 0.001, node="a"),
        _slow("2", 0.03, flagged=True, node="b"),
        _slow("3", 0.03, flagged=True, node="b"),
    ]
    marked = {r.rank: r.alerts for r in mark_failslow(rows)}
    assert marked == {
        "0": (),
        "1": (),
        "2": ("fail-slow node b from step 1234",),
        "3": ("fail-slow node b from step 1234",),
    }


def test_failslow_of_every_rank_of_a_pipeline_stage_names_the_stage_and_a_node_before_a_stage_of_its_ranks() -> None:
    across_nodes = [
        _slow("0", 0.001, node="a", stage="0"),
        _slow("1", 0.001, node="b", stage="0"),
        _slow("2", 0.03, flagged=True, node="a", stage="1"),
        _slow("3", 0.03, flagged=True, node="b", stage="1"),
    ]
    marked = {r.rank: r.alerts for r in mark_failslow(across_nodes)}
    assert marked["2"] == marked["3"] == ("fail-slow stage 1 from step 1234",)
    assert marked["0"] == marked["1"] == ()
    one_node = [replace(r, node="b" if r.rank in ("2", "3") else "a") for r in across_nodes]
    marked = {r.rank: r.alerts for r in mark_failslow(one_node)}
    assert marked["2"] == ("fail-slow node b from step 1234",)


def test_a_rank_reads_its_groups_from_its_page() -> None:
    page = STEP4 + (
        "# TYPE mindspore_train_parallel_group_info gauge\n"
        'mindspore_train_parallel_group_info{project="capture",rank="1",kind="stage",group="1"} 1\n'
        'mindspore_train_parallel_group_info{project="capture",rank="1",kind="node",group="h"} 1\n'
    )
    row, _ = first_row(page)
    assert row.groups == (("node", "h"), ("stage", "1"))
