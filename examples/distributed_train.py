"""Data-parallel training of the demo Transformer with one monitor per rank.

    msrun --worker_num=2 --local_worker_num=2 --master_port=8118 --log_dir=msrun_log --join=True \\
        examples/distributed_train.py --port 19420 --file-sd-dir /tmp/ms-exporter-targets

Each rank serves http://127.0.0.1:<port + local rank>/metrics and writes its file_sd target file.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import mindspore as ms
from mindspore.communication import get_group_size, get_rank, init

from ms_exporter import TrainingMonitor
from ms_exporter.demo import build_model, synthetic_dataset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=19420, help="base port; rank r serves on port + local rank")
    parser.add_argument("--file-sd-dir", default=None)
    parser.add_argument("--project", default="distributed-demo")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--linger", type=float, default=0, help="keep serving this long after training")
    args = parser.parse_args()

    ms.set_context(mode=ms.GRAPH_MODE)
    init()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    monitor = TrainingMonitor(port=args.port, project=args.project, file_sd_dir=args.file_sd_dir, interval=1)
    if args.file_sd_dir:  # lets a test find (and stop) one rank's process
        Path(args.file_sd_dir, f"pid-rank{get_rank()}").write_text(str(os.getpid()))
    print(f"rank {get_rank()} of {get_group_size()}: {monitor.url}", flush=True)
    ms.set_seed(0)
    model = build_model()
    dataset = synthetic_dataset(size=1024, num_shards=get_group_size(), shard_id=get_rank())
    model.train(args.epochs, dataset, callbacks=[monitor], dataset_sink_mode=False)
    time.sleep(args.linger)
    monitor.close()


if __name__ == "__main__":
    main()
