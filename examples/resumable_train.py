"""Train the demo Transformer with checkpoints and resume after a crash: the goodput ledger across restarts.

    python examples/resumable_train.py --save-dir /tmp/resumable --run-id demo-run --epochs 6
    # kill it (kill -9) half-way, then run the same command again: it resumes from the newest checkpoint

An epoch is --steps-per-epoch steps, and ModelCheckpoint saves every --checkpoint-every steps (a multiple of it, so
that a resume starts at an epoch boundary). At start the newest checkpoint in save_dir/ckpt is loaded into the
network and its optimizer, and training goes on from its epoch. The steps between that checkpoint and where the
killed process got to are done again: the monitor counts their time as `redo` (docs/goodput.md), and
`mindspore_train_restarts_total` says how many processes came before.

`--record FILE` appends one JSON line per step end (the run's step and time.perf_counter(), measured here, apart
from the monitor), a reference for tests. `--linger SECONDS` keeps the process and its endpoint up after training.
"""

from __future__ import annotations

import argparse
import json
import re
import time
from pathlib import Path
from typing import Any

import mindspore as ms
from mindspore.train import Callback, CheckpointConfig, ModelCheckpoint

from ms_exporter import TrainingMonitor
from ms_exporter.demo import BATCH, build_model, synthetic_dataset

PREFIX = "resumable"
_CHECKPOINT = re.compile(rf"^{PREFIX}(?:_\d+)?-(?P<epoch>\d+)_(?P<step>\d+)\.ckpt$")


def newest_checkpoint(directory: Path) -> tuple[Path, int] | None:
    """The checkpoint of the latest epoch ModelCheckpoint wrote here, and that epoch."""
    found = [(int(m.group("epoch")), path) for path in directory.glob("*.ckpt") if (m := _CHECKPOINT.match(path.name))]
    if not found:
        return None
    epoch, path = max(found)
    return path, epoch


class StepRecorder(Callback):
    """One JSON line per step end: the run's step (resumed epochs included) and perf_counter, flushed at once."""

    def __init__(self, path: Path, first_step: int) -> None:
        super().__init__()
        self._file = path.open("a", encoding="utf-8")
        self._first_step = first_step

    def on_train_step_end(self, run_context: Any) -> None:
        step = self._first_step + int(run_context.original_args().cur_step_num)
        self._file.write(json.dumps({"step": step, "perf": time.perf_counter(), "time": time.time()}) + "\n")
        self._file.flush()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--save-dir", required=True, help="the monitor's save_dir; checkpoints go to its ckpt/")
    parser.add_argument("--run-id", default=None, help="monitor_config run_id (default: derived)")
    parser.add_argument("--project", default="resumable")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--steps-per-epoch", type=int, default=50)
    parser.add_argument("--checkpoint-every", type=int, default=100)
    parser.add_argument("--d-model", type=int, default=64, help="the Transformer's width (wider: slower steps)")
    parser.add_argument("--record", default=None, help="append each step's end here (JSON Lines)")
    parser.add_argument("--linger", type=float, default=0.0, help="seconds to stay up after training")
    parser.add_argument("--save-seconds", type=float, default=5.0, help="monitor_config goodput.save_seconds")
    args = parser.parse_args()
    if args.checkpoint_every % args.steps_per_epoch:
        parser.error("--checkpoint-every must be a multiple of --steps-per-epoch (a resume starts at an epoch)")

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    # JSON Lines too: `ms-exporter report save_dir/metrics-rank0.jsonl` shows where the run's time went.
    config: dict[str, Any] = {
        "project": args.project,
        "save_dir": args.save_dir,
        "port": args.port,
        "backend": ["prometheus", "local"],
        "goodput": {"save_seconds": args.save_seconds},
    }
    if args.run_id:
        config["run_id"] = args.run_id
    monitor = TrainingMonitor(config)
    print(f"metrics: {monitor.url}", flush=True)
    model = build_model(grad_norm=False, d_model=args.d_model)
    checkpoints = Path(args.save_dir) / "ckpt"
    newest = newest_checkpoint(checkpoints)
    initial_epoch = 0
    if newest is not None:
        path, initial_epoch = newest
        ms.load_param_into_net(model.train_network, ms.load_checkpoint(str(path)))
        print(f"resumed from {path.name} (epoch {initial_epoch})", flush=True)
    saver = ModelCheckpoint(
        prefix=PREFIX,
        directory=str(checkpoints),
        config=CheckpointConfig(save_checkpoint_steps=args.checkpoint_every, keep_checkpoint_max=1000),
    )
    callbacks: list[Any] = [monitor, saver]
    if args.record:
        callbacks.append(StepRecorder(Path(args.record), initial_epoch * args.steps_per_epoch))
    model.train(
        args.epochs,
        synthetic_dataset(size=args.steps_per_epoch * BATCH),
        callbacks=callbacks,
        dataset_sink_mode=False,
        initial_epoch=initial_epoch,
    )
    print("training ended", flush=True)
    time.sleep(args.linger)
    monitor.close()


if __name__ == "__main__":
    main()
