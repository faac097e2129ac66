"""A training script that ends one way or another, written as README's integration snippet (test helper).

    python end_job.py --port P --project NAME --mode {finish,long,stuck} [--save-dir D]

`finish` trains a few epochs and returns without closing the monitor (README's snippet as written). `long` trains
until signalled. `stuck` trains, then its data source blocks forever in a wait that holds no Python frame of the
main thread: the main thread sits in MindSpore's native data pipeline, where a Python signal handler never runs.
With --save-dir the monitor also writes JSON Lines there and a file_sd target under it.
"""

from __future__ import annotations

import argparse
import threading
from typing import Any

import mindspore as ms
import mindspore.dataset as ds

from ms_exporter import TrainingMonitor
from ms_exporter.demo import BATCH, PaddedTokens, build_model, synthetic_dataset

STUCK_AFTER_BATCHES = 12


class StuckTokens:
    """The demo's tokens, until sample STUCK_AFTER_BATCHES * BATCH: that read never returns."""

    def __init__(self) -> None:
        self._tokens = PaddedTokens(size=4096)
        self._never = threading.Event()

    def __getitem__(self, index: int) -> Any:
        if index >= STUCK_AFTER_BATCHES * BATCH:
            print("blocked", flush=True)  # every batch before this one is ready: the training runs out soon
            self._never.wait()
        return self._tokens[index]

    def __len__(self) -> int:
        return len(self._tokens)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--project", required=True)
    parser.add_argument("--mode", choices=("finish", "long", "stuck"), required=True)
    parser.add_argument("--save-dir", default=None)
    args = parser.parse_args()

    config: dict[str, Any] = {"port": args.port, "interval": 0.5}
    if args.save_dir:
        config.update(backend=["prometheus", "local"], save_dir=args.save_dir, file_sd_dir=f"{args.save_dir}/sd")
    ms.set_context(mode=ms.GRAPH_MODE)
    monitor = TrainingMonitor(config, project=args.project)
    print("metrics at", monitor.url, flush=True)
    if args.mode == "stuck":
        dataset = ds.GeneratorDataset(
            StuckTokens(), ["input_ids", "attention_mask", "label"], shuffle=False, python_multiprocessing=False
        ).batch(BATCH, drop_remainder=True)
    else:
        dataset = synthetic_dataset(size=BATCH * (40 if args.mode == "finish" else 4096))
    model = build_model()
    # finish: 400 steps, long enough to be scraped past step 10 on a loaded machine whose scrapes time out at times
    model.train(10 if args.mode == "finish" else 1000, dataset, callbacks=[monitor], dataset_sink_mode=False)
    print("trained", flush=True)


if __name__ == "__main__":
    main()
