"""Data-parallel training of the demo Transformer with one monitor per rank.

    msrun --worker_num=2 --local_worker_num=2 --master_port=8118 --log_dir=msrun_log --join=True \\
        examples/distributed_train.py --port 19420 --file-sd-dir /tmp/ms-exporter-targets

Each rank serves http://127.0.0.1:<port + local rank>/metrics and writes its file_sd target file.
`--slow-rank 1 --slow-seconds 0.2` makes rank 1's data loader take 200 ms longer per batch: the other rank waits
for it in every step's all-reduce, and MindSporeTrainingStraggler names rank 1. A stall shorter than a step
(40-100 ms with 2 workers on 2 CPU cores) hides behind the pipeline's prefetch and slows nothing, as it should.
`--block-rank 1 --block-after 2400` makes rank 1's data loader block for good after that many samples (step
~150, once the prefetched batches are used up): the others wait for it in the all-reduce, and
MindSporeTrainingHang names rank 1.
`--diverge-rank 2 --diverge-at 300` moves one weight of rank 2 by 1e-3 after step 300, as silent data corruption
would: its parameter fingerprint leaves those of its replicas, and MindSporeTrainingReplicaDivergence names rank 2.
`--slow-hook-rank 2 --slow-hook-from 150 --slow-hook-seconds 0.1` makes a callback of rank 2 take 100 ms longer from
step 150 on (a logger writing to a slow disk, say): its own work grows, every rank waits for it, and
MindSporeTrainingFailSlow names rank 2 with onset step 150 (docs/failslow.md).
`--loop` trains with a functional loop of the script's own instead of `Model.train` (MindSpore 2.x's way:
`value_and_grad`, `nn.DistributedGradReducer`, an optimizer call, a compiled step) and hands the monitor each step
through the loop API (`monitor.steps()`, `monitor.step_end(loss, grads=grads)`); the loader options work the same.
`--print-losses` prints every rank's loss at every step (with `actions` that read the loss, in
`MS_EXPORTER_ACTIONS`, the same on every rank: the train cell averages it over the replicas).
`--checkpoint-every 100 --pause-every 200 --pause-seconds 40 --eval-every 5` is a healthy job with the slow
parts a real one has: each rank saves a checkpoint (ModelCheckpoint, in its save_dir) every 100 steps, a
checkpoint-like callback (an upload, say) holds every rank for 40 s every 200 steps, and an evaluation pass over a
validation set runs every 5 epochs. None of it is a hang: the monitor counts those times as the `checkpoint`
(ModelCheckpoint, and the pause, named in hang.checkpoint_callbacks) and `eval` phases, each with its own deadline.
"""

from __future__ import annotations

import argparse
import os
import threading
import time
from pathlib import Path
from typing import Any

import mindspore as ms
import numpy as np
from mindspore import ops
from mindspore.communication import get_group_size, get_rank, init
from mindspore.train import Callback, CheckpointConfig, ModelCheckpoint

from ms_exporter import TrainingMonitor
from ms_exporter.demo import BATCH, PaddedTokens, build_model, build_network, synthetic_dataset


class SlowSamples:
    """A data-loader stall: each sample takes `seconds` longer to read (slow storage, heavy preprocessing)."""

    def __init__(self, samples: PaddedTokens, seconds: float) -> None:
        self._samples = samples
        self._seconds = seconds

    def __getitem__(self, index: int) -> tuple[Any, ...]:
        time.sleep(self._seconds)
        return self._samples[index]

    def __len__(self) -> int:
        return len(self._samples)


class BlockingSamples:
    """A data loader that hangs: the `block_at`-th sample this rank reads (and any after it) never comes. The moment
    it first blocks goes to `mark` (unix time), for a test to measure from."""

    def __init__(self, samples: PaddedTokens, block_at: int, mark: Path | None) -> None:
        self._samples = samples
        self._block_at = block_at
        self._mark = mark
        self._read = 0
        self._never = threading.Event()

    def __getitem__(self, index: int) -> tuple[Any, ...]:
        self._read += 1
        if self._read > self._block_at:
            if self._mark is not None and not self._mark.exists():
                self._mark.parent.mkdir(parents=True, exist_ok=True)
                self._mark.write_text(str(time.time()))
            self._never.wait()
        return self._samples[index]

    def __len__(self) -> int:
        return len(self._samples)


class SlowHook(Callback):
    """A callback that turns slow at step `begin`: every step end from then on takes `seconds` longer."""

    def __init__(self, begin: int, seconds: float) -> None:
        super().__init__()
        self._begin = begin
        self._seconds = seconds

    def on_train_step_end(self, run_context: Any) -> None:
        if run_context.original_args().cur_step_num >= self._begin:
            time.sleep(self._seconds)


class PeriodicPause(Callback):
    """A checkpoint-like callback: every `every` steps it holds training for `seconds` (copying the checkpoint to
    remote storage, say)."""

    def __init__(self, every: int, seconds: float) -> None:
        super().__init__()
        self._every = every
        self._seconds = seconds

    def on_train_step_end(self, run_context: Any) -> None:
        if run_context.original_args().cur_step_num % self._every == 0:
            time.sleep(self._seconds)


def dataset_for_this_rank(size: int, slow_seconds: float, block_at: int | None = None, mark: Path | None = None) -> Any:
    """This rank's shard; with slow_seconds > 0, read through a loader that is that much slower per batch; with
    block_at, through one that blocks for good at that sample."""
    if slow_seconds <= 0 and block_at is None:
        return synthetic_dataset(size=size, num_shards=get_group_size(), shard_id=get_rank())
    import mindspore.dataset as ds

    if block_at is not None:
        blocking = BlockingSamples(PaddedTokens(size=size), block_at, mark)
        dataset = ds.GeneratorDataset(
            blocking,
            ["input_ids", "attention_mask", "label"],
            shuffle=False,
            num_shards=get_group_size(),
            shard_id=get_rank(),
        )
        return dataset.batch(BATCH, drop_remainder=True)

    # One reader (GeneratorDataset's default num_parallel_workers=1): the stall cannot be spread over
    # parallel workers. The pipeline's prefetch queues fill while the first step compiles, but a loader slower
    # than the step has drained them after 20-30 steps; from then on every batch waits for the reader, and the
    # wait falls between this rank's steps (mindspore_train_data_wait_seconds), as a slow loader's does.
    source = SlowSamples(PaddedTokens(size=size), slow_seconds / BATCH)
    dataset = ds.GeneratorDataset(
        source,
        ["input_ids", "attention_mask", "label"],
        shuffle=False,
        num_shards=get_group_size(),
        shard_id=get_rank(),
    )
    return dataset.batch(BATCH, drop_remainder=True)


class PrintLosses(Callback):
    """Prints `rank R step S loss L` after every step: the loss the train cell returned (with an action that reads
    the loss on, ms_exporter's cell returns the replicas' mean: docs/rollback.md#in-a-job-of-several-ranks)."""

    def on_train_step_end(self, run_context: Any) -> None:
        cb_params = run_context.original_args()
        outputs = cb_params.net_outputs
        loss = outputs[0] if isinstance(outputs, (tuple, list)) else outputs
        print(f"rank {get_rank()} step {cb_params.cur_step_num} loss {float(loss.asnumpy())!r}", flush=True)


class Perturb(Callback):
    """Silent corruption on one rank: at the end of step `at`, one element of the last weight moves by `delta`,
    written into the compiled graph's own Parameter with ops.assign (after compilation a GRAPH-mode graph on CPU
    does not see set_data; docs/development.md). The all-reduced updates that follow keep it apart from the other
    replicas."""

    def __init__(self, at: int, delta: float = 1e-3) -> None:
        super().__init__()
        self._at = at
        self._delta = delta

    def on_train_step_end(self, run_context: Any) -> None:
        cb_params = run_context.original_args()
        if cb_params.cur_step_num != self._at:
            return
        parameter = cb_params.train_network.trainable_params()[-1]
        bump = np.zeros(parameter.shape, np.float32)
        bump.flat[0] = self._delta
        ops.assign(parameter, parameter + ms.Tensor(bump))
        print(f"rank {get_rank()}: {parameter.name}[0] moved by {self._delta} after step {self._at}", flush=True)


def train_in_a_loop(monitor: TrainingMonitor, dataset: Any, epochs: int) -> None:
    """The demo network trained data-parallel by a functional loop: the gradients all-reduced by
    DistributedGradReducer in a compiled step, each step handed to the monitor through the loop API."""
    from mindspore import nn

    network = build_network()
    optimizer = nn.AdamWeightDecay(network.trainable_params(), learning_rate=nn.CosineDecayLR(1e-4, 1e-3, 2000))
    grad_fn = ms.value_and_grad(network, None, optimizer.parameters)
    reducer = nn.DistributedGradReducer(optimizer.parameters)

    @ms.jit
    def train_step(input_ids: Any, attention_mask: Any, label: Any) -> Any:
        loss, grads = grad_fn(input_ids, attention_mask, label)
        grads = reducer(grads)
        optimizer(grads)
        return loss, grads

    for _ in range(epochs):
        for batch in monitor.steps(dataset.create_tuple_iterator(), network=network, optimizer=optimizer):
            loss, grads = train_step(*batch)
            monitor.step_end(loss, grads=grads)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=19420, help="base port; rank r serves on port + local rank")
    parser.add_argument("--file-sd-dir", default=None)
    parser.add_argument("--project", default="distributed-demo")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--linger", type=float, default=0, help="keep serving this long after training")
    parser.add_argument("--slow-rank", type=int, default=None, help="slow this rank's data loader on purpose")
    parser.add_argument(
        "--slow-seconds", type=float, default=0.2, help="how much longer the slowed rank's loader takes per batch"
    )
    parser.add_argument("--block-rank", type=int, default=None, help="this rank's data loader blocks for good")
    parser.add_argument("--block-after", type=int, default=2400, help="after this many samples of its shard")
    parser.add_argument("--hang-min-seconds", type=float, default=None, help="monitor_config hang.min_seconds")
    parser.add_argument("--save-dir", default=None, help="each rank's save_dir is <this>/rank<r>")
    parser.add_argument(
        "--checkpoint-every",
        type=int,
        default=0,
        help="save a checkpoint every this many steps (ModelCheckpoint, into the rank's save_dir)",
    )
    parser.add_argument("--pause-every", type=int, default=0, help="a callback holds training every this many steps")
    parser.add_argument("--pause-seconds", type=float, default=40.0, help="... for this long")
    parser.add_argument("--eval-every", type=int, default=0, help="evaluate every this many epochs (Model.fit)")
    parser.add_argument("--diverge-rank", type=int, default=None, help="this rank's weights leave its replicas")
    parser.add_argument("--diverge-at", type=int, default=300, help="... at the end of this step")
    parser.add_argument("--slow-hook-rank", type=int, default=None, help="a callback of this rank turns slow")
    parser.add_argument("--slow-hook-from", type=int, default=150, help="... from this step on")
    parser.add_argument("--slow-hook-seconds", type=float, default=0.1, help="... by this much per step")
    parser.add_argument("--samples", type=int, default=None, help="samples in the dataset (1024; 6144 with a block)")
    parser.add_argument("--loop", action="store_true", help="a functional loop with the loop API, not Model.train")
    parser.add_argument("--print-losses", action="store_true", help="print each step's loss on every rank")
    args = parser.parse_args()
    if args.checkpoint_every and not args.save_dir:
        parser.error("--checkpoint-every needs --save-dir (each rank saves into its own save_dir)")
    if args.loop and (
        args.checkpoint_every
        or args.pause_every
        or args.eval_every
        or args.diverge_rank is not None
        or args.slow_hook_rank is not None
        or args.print_losses
    ):
        parser.error("--loop takes the loader options only (--slow-rank, --block-rank)")

    ms.set_context(mode=ms.PYNATIVE_MODE if args.loop else ms.GRAPH_MODE)  # a loop compiles its step with @ms.jit
    init()
    ms.set_auto_parallel_context(parallel_mode=ms.ParallelMode.DATA_PARALLEL, gradients_mean=True)
    options: dict[str, Any] = {}
    hang: dict[str, Any] = {}
    if args.hang_min_seconds is not None:
        hang["min_seconds"] = args.hang_min_seconds
    if args.pause_every:
        hang["checkpoint_callbacks"] = [PeriodicPause.__name__]  # its time is a checkpoint's, not a hang
    if hang:
        options["hang"] = hang
    if args.save_dir is not None:
        options["save_dir"] = str(Path(args.save_dir, f"rank{get_rank()}"))
    monitor = TrainingMonitor(port=args.port, project=args.project, file_sd_dir=args.file_sd_dir, interval=1, **options)
    if args.file_sd_dir:  # lets a test find (and stop) one rank's process
        Path(args.file_sd_dir, f"pid-rank{get_rank()}").write_text(str(os.getpid()))
    print(f"rank {get_rank()} of {get_group_size()}: {monitor.url}", flush=True)
    ms.set_seed(0)
    slow = args.slow_seconds if args.slow_rank == get_rank() else 0.0
    blocked = args.block_rank == get_rank()
    mark = Path(args.save_dir, "blocked-at") if blocked and args.save_dir else None
    samples = args.samples or (1024 if args.block_rank is None else 6144)
    dataset = dataset_for_this_rank(samples, slow, args.block_after if blocked else None, mark)
    if args.loop:
        train_in_a_loop(monitor, dataset, args.epochs)
        time.sleep(args.linger)
        monitor.close()
        return
    model = build_model(evaluate=args.eval_every > 0)
    callbacks: list[Any] = [monitor]
    if args.checkpoint_every:
        callbacks.append(
            ModelCheckpoint(
                prefix="demo",
                directory=str(Path(args.save_dir, f"rank{get_rank()}", "ckpt")),
                config=CheckpointConfig(save_checkpoint_steps=args.checkpoint_every, keep_checkpoint_max=2),
            )
        )
    if args.pause_every:
        callbacks.append(PeriodicPause(args.pause_every, args.pause_seconds))
    if args.diverge_rank == get_rank():
        callbacks.append(Perturb(args.diverge_at))
    if args.slow_hook_rank == get_rank():
        callbacks.append(SlowHook(args.slow_hook_from, args.slow_hook_seconds))
    if args.print_losses:
        callbacks.append(PrintLosses())
    if args.eval_every:
        validation = synthetic_dataset(size=256, seed=1, num_shards=get_group_size(), shard_id=get_rank())
        model.fit(
            args.epochs,
            dataset,
            validation,
            valid_frequency=args.eval_every,
            callbacks=callbacks,
            dataset_sink_mode=False,
        )
    else:
        model.train(args.epochs, dataset, callbacks=callbacks, dataset_sink_mode=False)
    time.sleep(args.linger)
    monitor.close()


if __name__ == "__main__":
    main()
