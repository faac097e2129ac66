"""A tampered save_dir: every state file of docs/goodput.md and docs/rollback.md replaced, then a real training.

Each kind of tampering plants the same thing at every name the monitor keeps state under (the goodput ledger's
run state, step mark and lock, rollback's skipped-batches list and its lock, the good-states directory and a good
state of an earlier process, the JSON Lines file): random bytes, a FIFO, a symlink to a file (or directory) outside
save_dir, or a 2 GiB sparse file. Then a training with goodput, rollback keeping good states on disk, and JSON Lines
runs in a child process. Reported per kind: whether it trained every step, what it said it moved aside, whether
anything outside save_dir changed, and how long it took. `make reliability` prints the table into
docs/reliability.md; tests/integration/test_tampered_state.py holds the same verdicts.

    python -m benchmarks.tampered [KIND ...]      the table for these kinds (default: all)
    python -m benchmarks.tampered job SAVE_DIR     the training itself (the child process)
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks.report import table

ROOT = Path(__file__).resolve().parents[1]
KINDS = ("garbage", "fifo", "symlink", "huge")
PROJECT = "tampered"
STEPS = 30
HUGE_BYTES = 2 * 1024**3


GENERIC_NAMES = (
    "ms_exporter-run-<run_id>-rank0.json",
    "ms_exporter-run-<run_id>-rank0.step",
    "ms_exporter-rank0.lock",
    "skipped-batches.json",
    "skipped-batches.json.lock",
    "metrics-rank0.jsonl",
    "good-states/good-<run_id>-rank0-pid1-step5-0.npz",
    "good-states",
)


def state_names(save_dir: Path) -> list[str]:
    """The names under save_dir where the monitor keeps state across processes, as the docs list them."""
    from ms_exporter.config.run_identity import derived_run_id

    run_id = derived_run_id(PROJECT, str(save_dir))
    return [name.replace("<run_id>", run_id) for name in GENERIC_NAMES]


def tamper(save_dir: Path, outside: Path, kind: str) -> list[str]:
    """Plants `kind` at every state name (the good-states directory last: the earlier state sits inside it)."""
    outside.mkdir(parents=True, exist_ok=True)
    (outside / "precious.txt").write_text("the training user's file\n")
    (outside / "precious-dir").mkdir(exist_ok=True)
    names = state_names(save_dir)
    # A file under the name of a good state of this run: cleaning up must not reach it through a planted link.
    (outside / "precious-dir" / Path(names[-2]).name).write_text("kept\n")
    (save_dir / "good-states").mkdir(parents=True, exist_ok=True)
    for name in names:
        path = save_dir / name
        if name == "good-states":
            if kind != "garbage":  # garbage inside a real directory: the earlier process's state above
                for child in path.iterdir():
                    child.unlink()
                path.rmdir()
            else:
                continue
        if kind == "garbage":
            path.write_bytes(os.urandom(4096))
        elif kind == "fifo":
            os.mkfifo(path)
        elif kind == "symlink":
            path.symlink_to(outside / ("precious-dir" if name == "good-states" else "precious.txt"))
        elif kind == "huge":
            with open(path, "wb") as handle:
                handle.truncate(HUGE_BYTES)
    return names


def snapshot(directory: Path) -> dict[str, str]:
    """Every file under `directory` (links not followed) by relative path, with a hash of its content."""
    found = {}
    for path in sorted(directory.rglob("*")):
        if path.is_file() and not path.is_symlink():
            found[str(path.relative_to(directory))] = hashlib.sha256(path.read_bytes()).hexdigest()
        else:
            found[str(path.relative_to(directory))] = "link" if path.is_symlink() else "dir"
    return found


def run_tampered(kind: str, root: Path, timeout: float = 600) -> dict[str, Any]:
    save_dir, outside = root / kind / "save", root / kind / "outside"
    save_dir.mkdir(parents=True)
    tamper(save_dir, outside, kind)
    before = snapshot(outside)
    started = time.monotonic()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "GLOG_v": "3"}
    try:
        child = subprocess.run(
            [sys.executable, "-m", "benchmarks.tampered", "job", str(save_dir)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        returncode, stdout, stderr = child.returncode, child.stdout, child.stderr
    except subprocess.TimeoutExpired as exc:
        returncode, stdout = None, str(exc.stdout or "")
        stderr = exc.stderr.decode() if isinstance(exc.stderr, bytes) else str(exc.stderr or "")
    seconds = time.monotonic() - started
    trained = next((int(line.split()[1]) for line in stdout.splitlines() if line.startswith("trained ")), 0)
    said = [line for line in stderr.splitlines() if " moved " in line or " removed " in line]
    return {
        "kind": kind,
        "returncode": returncode,
        "trained": trained,
        "said": said,
        "moved": sum(" moved " in line for line in said),
        "outside_unchanged": snapshot(outside) == before,
        "seconds": seconds,
        "stderr": stderr,
    }


def render_tampered(rows: list[dict[str, Any]]) -> str:
    shown = table(
        [
            {
                **r,
                "ok": "yes" if r["trained"] == STEPS and r["returncode"] == 0 else "NO",
                "outside": "unchanged" if r["outside_unchanged"] else "CHANGED",
            }
            for r in rows
        ],
        [
            ("kind", "planted at every state name", ""),
            ("ok", f"trained all {STEPS} steps", ""),
            ("moved", "files said moved aside", "d"),
            ("outside", "outside save_dir", ""),
            ("seconds", "seconds", ".0f"),
        ],
    )
    return f"""### A tampered save_dir
`python -m benchmarks.tampered` (part of `make reliability`): each kind of tampering is planted at every name where
the monitor keeps state in save_dir ({", ".join(f"`{n}`" for n in GENERIC_NAMES)}), then a training of
{STEPS} steps with goodput, rollback keeping good states on disk every 5 steps, and JSON Lines runs in a new process.

{shown}
"""


def job(save_dir: str) -> None:
    import mindspore as ms
    from mindspore.train import Callback

    from ms_exporter import TrainingMonitor
    from ms_exporter.demo import BATCH, build_model, synthetic_dataset

    class Steps(Callback):
        def __init__(self) -> None:
            super().__init__()
            self.last = 0

        def on_train_step_end(self, run_context: Any) -> None:
            self.last = run_context.original_args().cur_step_num

    ms.set_context(mode=ms.GRAPH_MODE)
    monitor = TrainingMonitor(
        port=0,
        project=PROJECT,
        backend=["prometheus", "local"],
        save_dir=save_dir,
        actions={"rollback": {"enable": True, "good_every": 5, "quiet_steps": 1, "min_health": 0.0, "storage": "disk"}},
    )
    steps = Steps()
    build_model().train(1, synthetic_dataset(size=BATCH * STEPS), callbacks=[monitor, steps], dataset_sink_mode=False)
    monitor.close()
    print(f"trained {steps.last}", flush=True)


def tampered(kinds: tuple[str, ...] = KINDS) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory(prefix="ms_exporter_tampered_") as scratch:
        return [run_tampered(kind, Path(scratch)) for kind in kinds]


def main(argv: list[str]) -> int:
    if argv[:1] == ["job"]:
        job(argv[1])
        return 0
    rows = tampered(tuple(argv) or KINDS)
    print(render_tampered(rows))
    for row in rows:
        print(f"{row['kind']}:", *row["said"], sep="\n  ")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
