"""What the hang watchdog and the endpoint do while a native call holds the GIL, measured.

    python -m benchmarks.gil_hold [--output docs/gil-hold.md] [--hold-seconds 20] [--repeats 3]

A real training (the demo's tiny classifier, GRAPH mode, hang.min_seconds 3) runs in a child process. At step
HOLD_AT its data source calls libc's sleep() through ctypes.PyDLL, which keeps the GIL for the whole call: a C
extension that does not release the GIL (a decoder, a compressor, a binding written without
Py_BEGIN_ALLOW_THREADS). For contrast the same job blocks in time.sleep(), which releases it. From outside, this
script scrapes /metrics every POLL seconds and, where py-spy is installed, runs `py-spy dump --native` once in the
middle of the hold. It reports when the scrapes failed, when the watchdog wrote its dump (if it did) and what the
dump and py-spy saw.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

HOLD_AT = 40  # the sample index that blocks (batch 1: the step)
POLL = 0.5
SCRAPE_TIMEOUT = 2.0
MIN_SECONDS = 3.0


# -- the training (child process) ---------------------------------------------------------------------------------


def _job(kind: str, hold: float, mark: Path, port_file: Path, save_dir: Path) -> None:
    import mindspore as ms
    import mindspore.dataset as ds

    from benchmarks.detection_job import TinyClassifier
    from ms_exporter import TrainingMonitor
    from ms_exporter.demo import PaddedTokens

    class Source:
        def __init__(self) -> None:
            self._tokens = PaddedTokens(size=400)
            self._libc = ctypes.PyDLL(None)  # PyDLL: the call keeps the GIL

        def __getitem__(self, index: int) -> Any:
            if index == HOLD_AT:
                mark.write_text(json.dumps({"began": time.time()}))
                if kind == "holds":
                    self._libc.sleep(int(hold))
                else:
                    time.sleep(hold)
                mark.write_text(json.dumps({"began": json.loads(mark.read_text())["began"], "ended": time.time()}))
            return self._tokens[index]

        def __len__(self) -> int:
            return 400

    ms.set_context(mode=ms.GRAPH_MODE)
    monitor = TrainingMonitor(
        port=0, project=f"gil-{kind}", save_dir=str(save_dir), interval=0.5, hang={"min_seconds": MIN_SECONDS}
    )
    port_file.write_text(monitor.url or "")
    # One reader thread and no prefetch beyond a batch, so that the training thread needs the sample soon.
    ds.config.set_prefetch_size(1)
    data = ds.GeneratorDataset(
        Source(),
        ["input_ids", "attention_mask", "label"],
        shuffle=False,
        python_multiprocessing=False,
        num_parallel_workers=1,
    ).batch(1)
    network = TinyClassifier()
    model = ms.train.Model(network, optimizer=ms.nn.Adam(network.trainable_params(), 1e-3))
    model.train(1, data, callbacks=[monitor], dataset_sink_mode=False)
    monitor.close()


# -- the measurement (this process) -------------------------------------------------------------------------------


def _scrape(url: str) -> tuple[bool, float | None]:
    try:
        with urllib.request.urlopen(url, timeout=SCRAPE_TIMEOUT) as response:
            page = response.read().decode()
    except OSError:
        return False, None
    for line in page.splitlines():
        if line.startswith("mindspore_train_phase_seconds{"):
            return True, float(line.rsplit(" ", 1)[1])
    return True, None


def measure(kind: str, hold: float, scratch: Path) -> dict[str, Any]:
    scratch.mkdir(parents=True, exist_ok=True)
    mark, port_file, save_dir = scratch / "hold", scratch / "url", scratch / "save"
    child = _start_job(kind, hold, scratch)
    try:
        polls, spy = _watch(child, hold, mark, port_file)
    finally:
        child.kill()
        child.wait(30)
    held = json.loads(mark.read_text())
    dumps = sorted(save_dir.glob("hang-rank*.txt"))
    dump_at = dumps[0].stat().st_mtime if dumps else None
    during = [ok for at, ok in polls if held["began"] + 0.5 <= at <= held["ended"] - SCRAPE_TIMEOUT]
    text = dumps[0].read_text() if dumps else ""
    return {
        "kind": kind,
        "hold": held["ended"] - held["began"],
        "scrapes_during": len(during),
        "scrapes_answered": sum(during),
        "dump_after_block": None if dump_at is None else dump_at - held["began"],
        "dump_header": text.splitlines()[1:3] if text else [],
        "dump_names_source": "__getitem__" in text,
        "py_spy": _spy_summary(spy),
    }


def _start_job(kind: str, hold: float, scratch: Path) -> subprocess.Popen[bytes]:
    """The training, in a child process of its own (this module's --job)."""
    env = {**os.environ, "GLOG_v": "3", "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "benchmarks.gil_hold",
            "--job",
            kind,
            "--hold-seconds",
            str(hold),
            "--scratch",
            str(scratch),
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _watch(
    child: subprocess.Popen[bytes], hold: float, mark: Path, port_file: Path
) -> tuple[list[tuple[float, bool]], str | None]:
    """Scrapes the child every POLL seconds until 10 s after its hold ended: when each scrape began and whether it
    was answered, and what py-spy saw in the middle of the hold (None where the hold ended first)."""
    polls: list[tuple[float, bool]] = []
    spy: str | None = None
    deadline = time.time() + 300
    while not (port_file.exists() and port_file.read_text()) and time.time() < deadline:
        time.sleep(0.2)
    url = port_file.read_text()
    while child.poll() is None and time.time() < deadline:
        began = time.time()
        ok, _ = _scrape(url)
        polls.append((began, ok))
        held = json.loads(mark.read_text()) if mark.exists() else {}
        if spy is None and "began" in held and "ended" not in held and time.time() > held["began"] + hold / 2:
            spy = _py_spy(child.pid)
        if "ended" in held and time.time() > held["ended"] + 10:
            break
        time.sleep(max(0.0, POLL - (time.time() - began)))
    return polls, spy


def _py_spy(pid: int) -> str:
    spy = shutil.which("py-spy")
    if spy is None:
        return "(py-spy is not installed)"
    done = subprocess.run(
        [spy, "dump", "--native", "--pid", str(pid)], capture_output=True, text=True, timeout=60, check=False
    )
    return done.stdout if done.returncode == 0 else f"(py-spy could not read the process: {done.stderr.strip()})"


def _spy_summary(text: str | None) -> str:
    if text is None:
        return "(not run: the hold ended first)"
    if text.startswith("("):
        return text
    lines = [line.strip() for line in text.splitlines()]
    for index, line in enumerate(lines):
        if "__getitem__" in line:  # the frames from the blocking call up to the Python one that made it
            start = max(0, index - 3)
            return " <- ".join(lines[start : index + 1])
    return "(no __getitem__ frame)"


def render(results: list[dict[str, Any]], command: str) -> str:
    rows = [
        "| the source's call | hold (s) | scrapes answered during it | watchdog dump, s after the block began "
        "| the dump shows the blocking frame | `py-spy dump --native` from outside, mid-hold |",
        "|---|---|---|---|---|---|",
    ]
    for r in results:
        dump = "none" if r["dump_after_block"] is None else f"{r['dump_after_block']:.1f}"
        call = (
            "libc sleep() via ctypes.PyDLL (holds the GIL)"
            if r["kind"] == "holds"
            else "time.sleep() (releases the GIL)"
        )
        rows.append(
            f"| {call} | {r['hold']:.1f} | {r['scrapes_answered']} of {r['scrapes_during']} | {dump} | "
            f"{'yes' if r['dump_names_source'] else 'no'} | `{r['py_spy']}` |"
        )
    return "\n".join(
        [
            "# A native call that holds the GIL: measured",
            "",
            f"Produced by `{command}` on {platform.node() or 'this machine'} ({os.cpu_count()} CPUs, "
            f"Python {platform.python_version()}), {time.strftime('%Y-%m-%d', time.gmtime())}.",
            "",
            f"A training with `hang.min_seconds: {MIN_SECONDS:g}` blocks in its data source at sample {HOLD_AT}, once "
            "in a call that keeps the GIL and once in one that releases it. This script scrapes `/metrics` every "
            f"{POLL} s ({SCRAPE_TIMEOUT:g} s timeout) and runs py-spy once mid-hold.",
            "",
            *rows,
            "",
            "While the GIL is held no Python thread of the process runs: not the watchdog, not the endpoint's server "
            "thread. Scrapes time out (Prometheus records `up` 0, and MindSporeTrainingRankDown pages once that lasts "
            "past its `for` of 20 s), and the watchdog can only look again once the call returned: its dump, if the "
            "phase is still past its deadline by then, shows where the thread is *after* the call, not the call. "
            "py-spy reads the process from outside without the GIL and names the native frame that holds it. With "
            "the GIL released the watchdog dumps at the deadline, showing the blocked frame, and every scrape is "
            "answered.",
            "",
        ]
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--output", default=None)
    parser.add_argument("--hold-seconds", type=float, default=20.0)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--job", choices=("holds", "releases"), default=None, help=argparse.SUPPRESS)
    parser.add_argument("--scratch", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.job:
        scratch = Path(args.scratch)
        _job(args.job, args.hold_seconds, scratch / "hold", scratch / "url", scratch / "save")
        return
    results = []
    with tempfile.TemporaryDirectory() as scratch_root:
        for repeat in range(args.repeats):
            for kind in ("holds", "releases"):
                results.append(measure(kind, args.hold_seconds, Path(scratch_root, f"{kind}-{repeat}")))
                print(json.dumps(results[-1]), flush=True)
    command = "python -m benchmarks.gil_hold" + (f" --output {args.output}" if args.output else "")
    text = render(results, command)
    if args.output:
        Path(args.output).write_text(text)
    print(text)


if __name__ == "__main__":
    main()
