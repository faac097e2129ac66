"""`ms-exporter top` against real ranks: two monitors fed by real Model.train runs, the live view in tmux."""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import mindspore as ms
import pytest
from mindspore import nn
from mindspore.train import Callback, Model

from ms_exporter import TrainingMonitor, cli
from ms_exporter.demo import build_network, synthetic_dataset
from tests.support.scrape import scrape
from tests.support.top_table import table_rows

pytestmark = pytest.mark.integration

BATCH = 8
STEPS = {0: 6, 1: 4}  # different step counts and data per rank, so that a row cannot show the other rank's numbers
SLOW_LOADER_SECONDS = {0: 0.0, 1: 0.15}
EXE = str(Path(sys.executable).with_name("ms-exporter"))


class SlowLoader(Callback):
    """After the monitor's step end: time spent here is the next step's data wait, as with a slow data loader.
    The hook is an instance attribute, which the monitor leaves untimed (features/callback_timer.py): a class
    method would be counted as the `callbacks` phase and taken out of the data wait."""

    def __init__(self, seconds: float) -> None:
        super().__init__()
        self.seconds = seconds
        self.on_train_step_end = self._wait  # type: ignore[method-assign]

    def _wait(self, run_context: Any) -> None:
        time.sleep(self.seconds)


def train_rank(rank: int) -> TrainingMonitor:
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(rank)
    network = build_network(layers=1, d_model=32, heads=2)
    model = Model(network, optimizer=nn.Momentum(network.trainable_params(), 0.01, 0.9))
    # Compile first, so that the monitor's step times are steps, not the graph compile.
    model.train(1, synthetic_dataset(size=BATCH, batch=BATCH, seed=rank), dataset_sink_mode=False)
    monitor = TrainingMonitor(port=0, project="top-test", interval=0.2, web={"cache_seconds": 0})
    model.train(
        1,
        synthetic_dataset(size=STEPS[rank] * BATCH, batch=BATCH, seed=rank),
        callbacks=[monitor, SlowLoader(SLOW_LOADER_SECONDS[rank])],
        dataset_sink_mode=False,
    )
    return monitor


@pytest.fixture(scope="module")
def ranks() -> Iterator[dict[int, TrainingMonitor]]:
    """Rank 0 and rank 1 of one job, in this process; rank 1 has the slow data loader."""
    monitors: dict[int, TrainingMonitor] = {}
    try:
        with pytest.MonkeyPatch.context() as patch:  # the rank is read at construction only
            for key in [k for k in os.environ if k.startswith("MS_EXPORTER_")]:
                patch.delenv(key)
            patch.setenv("RANK_SIZE", "2")
            for rank in STEPS:
                patch.setenv("RANK_ID", str(rank))
                monitors[rank] = train_rank(rank)
        yield monitors
    finally:
        for monitor in monitors.values():
            monitor.close()


def urls(ranks: dict[int, TrainingMonitor]) -> list[str]:
    return [str(ranks[rank].url) for rank in sorted(ranks)]


def test_once_shows_every_rank_as_scraped(ranks: dict[int, TrainingMonitor]) -> None:
    result = subprocess.run([EXE, "top", "--once", *urls(ranks)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    rows = table_rows(result.stdout)
    assert sorted(rows) == ["0", "1"], result.stdout
    for rank, monitor in ranks.items():
        page = scrape(str(monitor.url))
        words = rows[str(rank)]
        assert page.value("mindspore_train_global_step") == STEPS[rank]
        assert words[2] == str(STEPS[rank])
        assert words[3] == f"{page.value('mindspore_train_loss'):.5g}"
        assert words[4] == f"{page.value('mindspore_train_loss_smoothed'):.5g}"
        assert "top-test" in words and str(monitor.url) in words
        # A CPU rank: the host's CPUs under DEVICE UTIL (and DEVICE TEMP where the kernel has a sensor, else "-").
        utilization = page.value("mindspore_train_device_utilization_ratio", device="host")
        assert words[words.index(f"{100 * utilization:.1f}%") + 1] == "host", words
        temperature = page.find("mindspore_train_device_temperature_celsius", device="host")
        if temperature:
            assert words[words.index(f"{temperature[0]:.0f}C") + 1] == "host", words
    # Rank 1 waits ~0.15 s for data before each step: it is the one a synchronous job would wait for.
    assert rows["1"][0] == ">" and rows["0"][0] == " "
    assert "> slowest: rank 1 of top-test" in result.stdout


def tmux(sock: Path, *args: str, check: bool = True) -> str:
    result = subprocess.run(
        ["tmux", "-S", str(sock), *args],
        capture_output=True,
        text=True,
        timeout=20,
        env={**os.environ, "TERM": "xterm-256color"},
    )
    if check and result.returncode != 0:
        raise AssertionError(f"tmux {' '.join(args)}: {result.stderr}")
    return result.stdout


def wait_until(condition: Callable[[], Any], seconds: float, what: str) -> Any:
    deadline = time.monotonic() + seconds
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {seconds}s waiting for {what}")
        time.sleep(0.1)


@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed (make test installs it)")
def test_live_view_in_tmux_marks_the_slowest_rank_adapts_to_resize_and_quits_on_q(
    ranks: dict[int, TrainingMonitor], tmp_path: Path
) -> None:
    sock, status = tmp_path / "tmux.sock", tmp_path / "status"
    command = f"{shlex.quote(EXE)} top --interval 0.5 {' '.join(urls(ranks))}; echo $? > {shlex.quote(str(status))}"
    tmux(sock, "new-session", "-d", "-s", "top", "-x", "120", "-y", "30", command)
    try:

        def screen_with_both_ranks() -> str | None:
            text = tmux(sock, "capture-pane", "-p", "-t", "top")
            return text if sorted(table_rows(text)) == ["0", "1"] else None

        screen = wait_until(screen_with_both_ranks, 30, "both ranks on the live screen")
        lines = screen.splitlines()
        assert lines[0].startswith("ms-exporter top - 0 up, 2 ended, 0 down - ") and "q quits" in lines[0]
        # 120 columns: the TARGET column (the URLs are long) goes first, the alerts stay.
        assert lines[1].split()[:3] == ["RANK", "STEP", "LOSS"] and lines[1].split()[-1] == "ALERTS"
        assert "TARGET" not in lines[1]
        rows = table_rows(screen)
        assert rows["1"][0] == ">" and rows["0"][0] == " "
        # Rank 1's data wait is far above rank 0's: the straggler alert's rule names it, and only it.
        assert rows["1"][-1] == "straggler" and "straggler" not in rows["0"]
        assert rows["0"][2] == str(STEPS[0]) and rows["1"][2] == str(STEPS[1])
        assert any(line.startswith("> slowest: rank 1 of top-test") for line in lines)
        assert all(len(line) <= 120 for line in lines)

        # A narrow terminal: columns go from the right, the alerts column and the marker stay.
        tmux(sock, "resize-window", "-t", "top", "-x", "70", "-y", "30")

        def narrow_screen() -> str | None:
            text = tmux(sock, "capture-pane", "-p", "-t", "top")
            header = text.splitlines()[1] if len(text.splitlines()) > 1 else ""
            return text if "ALERTS" in header and "PROJECT" not in header and "RANK" in header else None

        narrow = wait_until(narrow_screen, 10, "the table redrawn for 70 columns")
        assert all(len(line) <= 70 for line in narrow.splitlines())
        assert table_rows(narrow)["1"][0] == ">"

        tmux(sock, "send-keys", "-t", "top", "q")
        wait_until(lambda: status.exists() and status.read_text().strip(), 10, "the view to exit after q")
        assert status.read_text().strip() == "0"
    finally:
        tmux(sock, "kill-server", check=False)


def test_dead_ranks_show_down_without_holding_up_the_others(
    ranks: dict[int, TrainingMonitor], capsys: pytest.CaptureFixture[str]
) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        refused = f"127.0.0.1:{closed.getsockname()[1]}"  # nothing listens once it is closed
    with socket.socket() as silent:  # accepts connections (the kernel does) but never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        hanging = f"127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        status = cli.main(["top", "--once", "--timeout", "1", refused, *urls(ranks), hanging])
        elapsed = time.monotonic() - started
    out = capsys.readouterr().out
    assert status == 1  # a target is down
    assert elapsed < 2.5, f"one poll took {elapsed:.1f}s"  # the silent rank costs its timeout once, not per rank
    rows = table_rows(out)
    assert rows["0"][2] == str(STEPS[0]) and rows["1"][2] == str(STEPS[1])
    down = [line for line in out.splitlines() if "DOWN:" in line]
    assert len(down) == 2, out
    assert any(f"http://{refused}/metrics" in line and "Connection refused" in line for line in down)
    assert any(f"http://{hanging}/metrics" in line and "timed out after 1s" in line for line in down)
    assert out.startswith("ms-exporter top - 0 up, 2 ended, 2 down - ")


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A self-signed certificate for 127.0.0.1: its own CA."""
    d = tmp_path_factory.mktemp("tls")
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-keyout",
            "server.key",
            "-out",
            "server.crt",
            "-days",
            "2",
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        cwd=d,
        check=True,
        capture_output=True,
        timeout=60,
    )
    return d


def test_https_endpoint_with_basic_auth(
    certificate: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    password = "top-secret"
    monitor = TrainingMonitor(
        port=0,
        project="top-tls",
        web={
            "tls_cert_file": str(certificate / "server.crt"),
            "tls_key_file": str(certificate / "server.key"),
            "basic_auth_users": {"viewer": "sha256:" + hashlib.sha256(password.encode()).hexdigest()},
        },
    )
    try:
        url = str(monitor.url)
        assert url.startswith("https://")
        cafile = ["--cafile", str(certificate / "server.crt")]

        def once(*args: str) -> tuple[int, str]:
            status = cli.main(["top", "--once", *args, url])
            return status, capsys.readouterr().out

        status, out = once(*cafile)
        assert status == 1 and "DOWN: HTTP 401 Unauthorized (check --user and the password)" in out
        status, out = once(*cafile, "--user", "viewer", "--password", "wrong")
        assert status == 1 and "DOWN: HTTP 401 Unauthorized" in out
        monkeypatch.setenv("MS_EXPORTER_TOP_PASSWORD", password)
        status, out = once("--user", "viewer")
        assert status == 1 and "DOWN: TLS: " in out and "(--cafile, or --insecure)" in out  # an unknown CA
        for args in (cafile, ["--insecure"]):
            status, out = once(*args, "--user", "viewer")
            assert status == 0, out
            assert "top-tls" in table_rows(out)["0"] and "DOWN" not in out
    finally:
        monitor.close()
