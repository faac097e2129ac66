"""MindSpore Transformers 2.0.0's PyNative Trainer loop, as trainer/trainer.py writes it, around real MindSpore PYNATIVE
steps of a tiny network, with PyNativeTrainingMonitor built from a run YAML's `callbacks:` by 2.0.0's registry.
Runs with ./.mindformers2 on PYTHONPATH (tests/support/mindformers2.py). Usage:
    python mindformers2_job.py train RUN_YAML WORK_DIR   # the entry's auto_register, REGISTER_PATH set
    python mindformers2_job.py type RUN_YAML             # `import ms_exporter.mindformers`, then `type:` alone

What is 2.0.0's own here: TrainConfig (the YAML), MindFormerRegister (building the entries, loading the class by
path), CallbackHandler (every hook call and its arguments), TrainerState, MonitorGroup and MonitorCallback (the
built-in callback before ours). What stands in for the Trainer, whose module imports hyper-parallel: Trainer.train and
_inner_train_loop below, call for call; the step's arithmetic (value_and_grad instead of loss.backward(), which
hyper-parallel provides) and MindSpore's AdamWeightDecay on a cosine schedule instead of 2.0.0's AdamW; a
CheckpointCallback of the same name that sleeps where 2.0.0's saves.
WORK_DIR/steps.jsonl holds, after every step, what the handler passed and the /metrics page read then.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import mindspore as ms
import numpy as np
import yaml
from mindspore import nn, ops
from mindspore.dataset import GeneratorDataset

from tests.support import mindformers2
from tests.support.scrape import scrape

SEQUENCE, VOCABULARY, CLASSES, ROWS = 8, 32, 4, 40
SAVE_EVERY, SAVE_SECONDS = 5, 2.0  # the stand-in CheckpointCallback's saves (test_mindformers2.py reads them)


class TinyClassifier(nn.Cell):
    def __init__(self) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCABULARY, 16)
        self.head = nn.Dense(16, CLASSES)

    def construct(self, input_ids: ms.Tensor) -> ms.Tensor:
        return self.head(self.embedding(input_ids).mean(axis=1))


class TrainingStep:
    """Trainer.training_step: a micro-batch of training.local_batch_size per accumulation step, each loss divided by
    the accumulation steps and summed; then the global gradient norm (_calculate_global_grad_norm, whose clipping
    max_norm leaves alone here) and the optimizer."""

    def __init__(self, network: nn.Cell, optimizer: nn.Optimizer, local_batch: int, accumulation: int) -> None:
        loss_fn = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

        def forward(input_ids: ms.Tensor, labels: ms.Tensor) -> ms.Tensor:
            return loss_fn(network(input_ids), labels) / accumulation

        self._grad = ms.value_and_grad(forward, None, optimizer.parameters)
        self._optimizer = optimizer
        self._local_batch, self._accumulation = local_batch, accumulation
        self.applied_lr = 0.0

    def __call__(self, inputs: dict[str, ms.Tensor]) -> tuple[Any, Any]:
        loss: Any = 0.0
        summed: tuple[ms.Tensor, ...] | None = None
        for micro in range(self._accumulation):
            start, end = micro * self._local_batch, (micro + 1) * self._local_batch
            micro_loss, grads = self._grad(inputs["input_ids"][start:end], inputs["labels"][start:end])
            loss += micro_loss
            summed = grads if summed is None else tuple(a + b for a, b in zip(summed, grads, strict=True))
        assert summed is not None
        global_norm = ops.sqrt(ops.stack([ops.sum(ops.square(g.astype(ms.float32))) for g in summed]).sum())
        # What the optimizer applies now: its schedule at its own step, read before it advances (the record's truth).
        schedule = self._optimizer.learning_rate
        self.applied_lr = float(schedule(self._optimizer.global_step).asnumpy().reshape(-1)[0])
        self._optimizer(summed)
        return loss, global_norm


def dataset(rows: int) -> GeneratorDataset:
    rng = np.random.default_rng(0)
    ids = rng.integers(0, VOCABULARY, size=(rows, SEQUENCE)).astype(np.int32)
    labels = (ids[:, 0] % CLASSES).astype(np.int32)
    return GeneratorDataset(list(zip(ids, labels, strict=True)), column_names=["input_ids", "labels"], shuffle=False)


def train(run_yaml: Path, work: Path) -> None:
    mf = mindformers2.load()
    ms.set_context(mode=ms.PYNATIVE_MODE, device_target="CPU")
    ms.set_seed(0)
    config = mf.TrainConfig.load_from_yaml(str(run_yaml))
    training = config.training
    callbacks = [mf.build_callback(entry) for entry in config.callbacks]  # Trainer._create_callback_handler
    (ours,) = callbacks
    data_parallel = 1
    accumulation = training.global_batch_size // (data_parallel * training.local_batch_size)
    data = dataset(ROWS).batch(training.global_batch_size, drop_remainder=True)
    network = TinyClassifier()
    model = [network]  # the Trainer keeps its model as a list of chunks
    schedule = nn.CosineDecayLR(1e-4, 1e-2, training.steps)
    optimizer = nn.AdamWeightDecay(network.trainable_params(), learning_rate=schedule, weight_decay=0.01)
    step_fn = TrainingStep(network, optimizer, training.local_batch_size, accumulation)
    records = (work / "steps.jsonl").open("w")

    class Scraper(mf.TrainerCallback):  # type: ignore[name-defined]
        """Appended last, like the 1.8 job's scraper: reads /metrics once the callbacks before it saw the step."""

        def on_step_end(self, args: Any, state: Any, **kwargs: Any) -> None:
            ours.monitor.publish()
            record = {
                "step": state.global_step,
                "loss": float(kwargs["loss"].asnumpy()),
                "grad_norm": float(kwargs["grad_norm"].asnumpy()),
                "lr": step_fn.applied_lr,
                "metrics": scrape(ours.monitor.url).text,
            }
            records.write(json.dumps(record) + "\n")
            records.flush()

    class CheckpointCallback(mf.TrainerCallback):  # type: ignore[name-defined]
        """Stands in for 2.0.0's CheckpointCallback (its module imports hyper-parallel), by its class name: it saves
        from on_step_end on every SAVE_EVERY-th step, as 2.0.0's does, before the YAML's callbacks; a save here
        is SAVE_SECONDS of sleep."""

        def on_step_end(self, args: Any, state: Any, **kwargs: Any) -> None:
            if state.global_step % SAVE_EVERY == 0:
                time.sleep(SAVE_SECONDS)

    # Trainer.__init__ -> _create_callback_handler: the built-ins first (MonitorCallback, LossCallback,
    # CheckpointCallback where checkpoint.enable_save), then the YAML's. LossCallback is left out: it imports
    # mindformers.models, whose models import hyper-parallel, and it reads a GPT config off the model.
    handler = mf.CallbackHandler(
        callbacks=[mf.MonitorCallback(), CheckpointCallback(), *callbacks, Scraper()],
        model=model,
        train_dataset=data,
        eval_dataset=None,
        optimizer=optimizer,
        lr_scheduler=schedule,
    )
    group = mf.MonitorGroup(config, model=model)
    epoch_step = data.get_dataset_size()
    # Trainer._init_train_state
    state = mf.TrainerState(
        epoch_step=epoch_step,
        max_steps=training.steps,
        save_steps=config.checkpoint.save_interleaved_steps,
        global_batch_size=training.global_batch_size,
        num_accumulation_steps=accumulation,
        is_train_begin=True,
        is_train_end=False,
    )
    # Trainer.train
    handler.on_train_begin(config, state)
    # Trainer._inner_train_loop
    epochs = max(training.steps // epoch_step, 1)
    iterator = data.create_dict_iterator(output_numpy=False, num_epochs=epochs)
    network.set_train(True)
    step = state.global_step
    while step < state.max_steps:
        if step % state.epoch_step == 0 and step > 0:
            handler.on_epoch_begin(config, state)
            state.update_epoch()
        try:
            inputs = next(iterator)
        except StopIteration:
            iterator = data.create_dict_iterator(output_numpy=False, num_epochs=epochs)
            inputs = next(iterator)
        handler.on_step_begin(config, state)
        group.reset()
        group.record("moe_tpe_step_begin")
        loss, grad_norm = step_fn(inputs)
        state.global_step += 1
        step = state.global_step
        handler.on_step_end(
            config,
            state,
            loss=loss,
            grad_norm=grad_norm,
            monitor=group,
            metric_reduce_group=None,
            metric_reduce_group_size=None,
            pp_metric_reduce_group=None,
            pp_metric_reduce_group_size=None,
            has_last=True,
        )
        if step % state.epoch_step == 0:
            handler.on_epoch_end(config, state)
    handler.on_train_end(config, state)
    ours.monitor.publish()
    (work / "ended.txt").write_text(scrape(ours.monitor.url).text)
    print("BUILT", type(ours).__module__, type(ours).__name__, isinstance(ours, mf.TrainerCallback))
    ours.close()
    print("MINDFORMERS2_TRAIN_DONE", mf.version, ms.__version__, flush=True)


def by_type(run_yaml: Path) -> None:
    """A launcher of one's own: `import ms_exporter.mindformers`, then the entry names the type alone."""
    mf = mindformers2.load()
    import ms_exporter.mindformers  # noqa: F401  (registers ours)

    run = yaml.safe_load(run_yaml.read_text())
    run["callbacks"] = [{"type": "PyNativeTrainingMonitor", "enable": False, "project": "by-type"}]
    config = mf.TrainConfig.from_dict(run)
    (callback,) = [mf.build_callback(entry) for entry in config.callbacks]
    print(
        "BUILT",
        type(callback).__module__,
        type(callback).__name__,
        isinstance(callback, mf.TrainerCallback),
        callback.monitor.config.project,
    )


if __name__ == "__main__":
    if sys.argv[1] == "train":
        train(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        by_type(Path(sys.argv[2]))
