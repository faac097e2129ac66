"""The loop driver: a training loop of the script's own (MindSpore's quick start, `value_and_grad`) feeds the core.

```python
for batch in monitor.steps(dataset, network=net, optimizer=opt):   # one iteration = one step
    loss, grads = train_step(*batch)
    monitor.step_end(loss, grads=grads)
```

What the loop hands in stands where MindSpore's cb_params would: the network, the optimizer and the dataset for
the parts that read the run (learning rate, rollback, fingerprints, MFU), the batch for the parts that count it.
The gradients, when given, are reduced on the device to one norm per parameter on the sampled steps only
(`grad_norm.every_n_steps`), and the probes read that one small tensor: the same items GradNormTrainOneStepCell
returns. Between two loops of one run (the quick start evaluates there) the rank is in phase `eval`, kept aside.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from ms_exporter.core.cb_params import (
    CUR_EPOCH_NUM,
    CUR_STEP_NUM,
    NET_OUTPUTS,
    NETWORK,
    OPTIMIZER,
    TRAIN_DATASET,
    TRAIN_DATASET_ELEMENT,
    TRAIN_NETWORK,
)
from ms_exporter.core.device.device_reductions import norms_on_device
from ms_exporter.core.output_layout import OutputLayout
from ms_exporter.features.local_gradients import RUN_VIEW_KEY
from ms_exporter.monitor.core import MonitorCore


class LoopContext:
    """What MindSpore's RunContext is to a Callback: the run's view, and a stop the actions can ask for."""

    __slots__ = ("_run", "stop_requested")

    def __init__(self, run: dict[str, Any]) -> None:
        self._run = run
        self.stop_requested = False

    def original_args(self) -> dict[str, Any]:
        return self._run

    def request_stop(self) -> None:
        """An action (early stop, rollback's stop) asks the loop to end: steps() yields no more batches."""
        self.stop_requested = True

    def get_stop_requested(self) -> bool:
        return self.stop_requested


def run_view(network: Any, optimizer: Any, dataset: Any, step: int) -> dict[str, Any]:
    """A loop's run under MindSpore's cb_params keys, which the parts read (core/cb_params.py)."""
    return {
        NETWORK: network,
        TRAIN_NETWORK: None,  # the loop's step is the script's function, not a cell the parts could look into
        OPTIMIZER: optimizer,
        TRAIN_DATASET: _dataset_of(dataset),
        CUR_STEP_NUM: step,
        CUR_EPOCH_NUM: 0,
        TRAIN_DATASET_ELEMENT: None,
        NET_OUTPUTS: None,
    }


class LoopDriver:
    """Turns the loop API's calls into the core's step interface, one step per batch."""

    def __init__(self, core: MonitorCore) -> None:
        self._core = core
        self._context: LoopContext | None = None
        self._run: dict[str, Any] = {}
        self._step = 0
        self._epoch = 0
        self._began = False  # a step began and has not ended
        self._in_loop = False  # inside a steps() loop
        self._between_loops = False
        self._norms: _GradNorms | None = None
        grad_norm = core.config.grad_norm
        self._every = grad_norm.every_n_steps if grad_norm.enable else 0
        self._layouts: dict[tuple[bool, bool, bool], OutputLayout] = {}

    @property
    def stop_requested(self) -> bool:
        """Whether an action (early stop, rollback) stopped this run: steps() then hands out no more batches."""
        return self._context is not None and self._context.stop_requested

    @property
    def active(self) -> bool:
        """Whether this driver began the core's current run."""
        return self._context is not None and self._core.running

    def train_begin(self, network: Any = None, optimizer: Any = None, dataset: Any = None, step: int = 0) -> None:
        core = self._core
        if core.running:
            core.guard("callback", self.train_end, True)  # a new run ends the one before it
        self._step, self._epoch, self._began = int(step), 0, False
        self._run = run_view(network, optimizer, dataset, self._step)
        self._context = LoopContext(self._run)
        self._norms = _GradNorms() if self._every else None
        self._between_loops = False
        core.train_begin(self._run, self._context)

    def steps(self, dataset: Iterable[Any], network: Any = None, optimizer: Any = None) -> Iterator[Any]:
        """Yields the batches of `dataset`; each is a step that begins when it is handed out."""
        if not self.active:
            self.train_begin(network, optimizer, dataset)
        elif self._between_loops:
            self._core.eval_end(None)  # the time since the last loop ended was not the data pipeline's
            self._between_loops = False
        self._epoch += 1
        self._run[CUR_EPOCH_NUM] = self._epoch
        context = self._context
        self._in_loop = True
        exhausted = False
        try:
            iterator = iter(dataset)
            while context is None or not context.stop_requested:  # an action stopped the run: no more steps
                try:
                    batch = next(iterator)
                except StopIteration:
                    exhausted = True
                    break
                self.step_begin(batch)
                yield batch
        finally:
            self._in_loop = False
            if self._core.running and context is self._context:
                if exhausted:
                    self._core.epoch_end(self._step)
                # The loop's last steps are served now, not when the next loop steps (the script may evaluate,
                # save or end without close() in between): this is the training thread, between steps.
                self._core.publish()
                self._core.eval_begin()
                self._between_loops = True

    def step_begin(self, batch: Any = None) -> None:
        if not self.active:
            self.train_begin()
        self._step += 1
        self._began = True
        run = self._run
        run[CUR_STEP_NUM] = self._step
        columns = self._columns(batch)
        run[TRAIN_DATASET_ELEMENT] = columns
        self._core.step_begin(self._step, columns)

    def step_end(
        self,
        loss: Any,
        grads: Any = None,
        grad_norm: Any = None,
        lr: Any = None,
        tokens: int | None = None,
        samples: int | None = None,
        outputs: Any = None,
        local_grad_norm: Any = None,
    ) -> None:
        if not self.active:
            self.train_begin()
        self._run[RUN_VIEW_KEY] = local_grad_norm
        if not self._began:  # a driver that reports step ends only
            self._step += 1
            self._run[CUR_STEP_NUM] = self._step
        self._began = False
        step = self._step
        norms = self._norms
        sampled = grads is not None and norms is not None and step % self._every == 0
        parameter_norms = norms.of(grads) if sampled and norms is not None else None
        if parameter_norms is None and grad_norm is None and lr is None:
            items: Any = outputs if outputs is not None else loss
            layout = None
        else:
            items, layout = self._outputs(loss, grad_norm, parameter_norms, lr)
        self._run[NET_OUTPUTS] = items
        counted = (samples, tokens) if tokens is not None or samples is not None else None
        self._core.step_end(step, self._epoch, items, self._run[TRAIN_DATASET_ELEMENT], layout, counted)

    def eval_end(self, results: Mapping[str, Any]) -> None:
        """An evaluation's results; between two loops the rank stays in `eval` after it (that time stays aside)."""
        self._core.eval_end(results)
        if self._between_loops and self.active:
            self._core.eval_begin()

    def train_end(self, completed: bool = True, stopped: bool = False) -> None:
        if self.active:
            self._core.end(completed, stopped)
        self._context = None
        self._between_loops = False

    def end_at_close(self) -> None:
        """close() with this driver's run still on: how did it end? An uncaught exception (the interpreter keeps it in
        sys.last_value before the exit handlers run) is a crash unless it was Ctrl-C or sys.exit; a step begun and
        not ended, with no exception seen, is a crash too. Else the loop ended or broke out: the run completed."""
        last = getattr(sys, "last_value", None)
        if last is not None:
            stopped = isinstance(last, (KeyboardInterrupt, SystemExit))
            self.train_end(False, stopped)
        else:
            self.train_end(not (self._began and self._in_loop))

    # -- internals ----------------------------------------------------------------------------------------------
    def _columns(self, batch: Any) -> Any:
        """The batch as its tensors in column order: a dict's values (its keys name the columns), a tuple or list
        as it is, anything else as a batch of one column."""
        if batch is None or isinstance(batch, (tuple, list)):
            return batch
        if isinstance(batch, Mapping):
            self._core.bind_columns(tuple(str(key) for key in batch))
            return tuple(batch.values())
        return (batch,)

    def _outputs(
        self, loss: Any, grad_norm: Any, parameter_norms: Any, lr: Any
    ) -> tuple[tuple[Any, ...], OutputLayout]:
        """The step's items in the layout GradNormTrainOneStepCell's measured steps use, plus the LR when given."""
        key = (grad_norm is not None, parameter_norms is not None, lr is not None)
        layout = self._layouts.get(key)
        if layout is None:
            layout = self._layouts[key] = OutputLayout(
                global_norm=1 if key[0] else None,
                parameter_norms=2 if key[1] else None,
                learning_rate=3 if key[2] else None,
                measured_by_cell=key[0] or key[1],  # the norms are read on the steps that have them
            )
        return (loss, grad_norm, parameter_norms, lr), layout


class _GradNorms:
    """One L2 norm per gradient, computed where the gradients are by one compiled reduction, stacked into one tensor:
    the probe's one read (core/device/device_reductions.py). Compiled at the first sampled step for the run's gradient
    shapes (about a second on CPU for the demo), and again only if they change."""

    def of(self, grads: Any) -> Any:
        tensors: Sequence[Any] = list(grads.values()) if isinstance(grads, Mapping) else list(grads)
        return norms_on_device(tensors)


class _Columns:
    """A MindSpore dataset iterator's column names, answered as the dataset would (the batch counter asks)."""

    def __init__(self, iterator: Any) -> None:
        self._iterator = iterator

    def get_col_names(self) -> list[str]:
        return list(self._iterator.get_col_names())


def _dataset_of(dataset: Any) -> Any:
    """What the loop iterates, where it can say its columns (a MindSpore dataset, or one of its iterators)."""
    if hasattr(dataset, "get_batch_size") or dataset is None:
        return dataset
    return _Columns(dataset) if callable(getattr(dataset, "get_col_names", None)) else None
