"""The loop API's methods: what a training loop of the script's own (or a trainer's callback) calls on the monitor.

A mixin of TrainingMonitor, apart from the Callback for two reasons: the loop API is one home here, and MindSpore's
`Model.fit` refuses a callback class whose own namespace defines `step_begin` or `step_end` (the old names of its
hooks). These are not hooks: when MindSpore's base class calls them the old way (with a RunContext: an evaluation's
steps, `_CallbackManager.step_end`) they return at once; the monitor's `on_*` hooks already ran.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any

from ms_exporter.core.catalogue import CHECKPOINT
from ms_exporter.monitor.core import MonitorCore
from ms_exporter.monitor.loop import LoopDriver


class LoopAPI:
    """`steps()`, `step_end()` and the calls a driver without steps() makes (docs/getting-started.md)."""

    _core: MonitorCore | None
    _loop: LoopDriver | None
    _enabled: bool

    def steps(self, dataset: Iterable[Any], *, network: Any = None, optimizer: Any = None) -> Iterator[Any]:
        """The batches of `dataset` (a MindSpore dataset, its tuple or dict iterator, any iterable), one step each:
        the step begins when its batch is handed out and ends at step_end(). The first call begins the run; each
        call is an epoch. `network` and `optimizer` serve the parts that read them (learning rate, rollback,
        fingerprints, MFU). After an action stopped the run it hands out no more batches."""
        loop = self._loop
        if loop is None or not self._enabled:
            return iter(dataset)
        return loop.steps(dataset, network, optimizer)

    def step_end(
        self,
        loss: Any,
        *,
        grads: Any = None,
        grad_norm: Any = None,
        lr: Any = None,
        tokens: int | None = None,
        samples: int | None = None,
        outputs: Any = None,
        local_grad_norm: Any = None,
    ) -> None:
        """The step ended with `loss` (a Tensor or a number; reading it waits for the device). Known more, by
        keyword: `grads` (the gradients, in the optimizer's parameter order, or {name: grad}: norms are taken on
        the device on the sampled steps), `grad_norm` (a global norm already computed), `lr` (the LR applied),
        `tokens` and `samples` (else counted from the batch), `outputs` (a train cell's outputs tuple),
        `local_grad_norm` (this rank's global norm of its own gradients before the all-reduce: checked against
        its history and its replicas', docs/sdc.md#local-gradients)."""
        if _is_run_context(loss):
            return  # MindSpore's deprecated alias of on_train_step_end/on_eval_step_end: the hooks already ran
        loop = self._loop
        if loop is None or not self._enabled:
            return
        core = self._core
        try:
            loop.step_end(loss, grads, grad_norm, lr, tokens, samples, outputs, local_grad_norm)
        except Exception as exc:  # nothing the monitor does raises into the loop
            if core is not None:
                core.errors.absorb("callback", exc)

    def collective_begin(self) -> None:
        """This rank's own computation of the step is done and its collective begins now (call it just before the
        gradient all-reduce): the time up to here counts as the rank's own work, which the fail-slow scores and
        onsets read (docs/failslow.md). Once per step; a call outside a step is ignored."""
        if self._loop is not None and self._enabled and self._core is not None:
            self._core.clock.mark_collective()

    def checkpointing(self) -> AbstractContextManager[None]:
        """`with monitor.checkpointing(): ms.save_checkpoint(...)`: the block is the `checkpoint` phase (its hang
        deadline is hang.checkpoint_seconds, not the one learned from the steps), its time is kept out of the step
        or data wait it falls in and booked as checkpoint time, and a block of 1 ms or more is a save the checkpoint
        interval advisor counts (docs/goodput.md). On the training thread; outside a run it does nothing."""
        core = self._core
        if not self._enabled or core is None or self._loop is None or not core.running:
            return contextlib.nullcontext()
        return core.phases.apart(CHECKPOINT)

    def step_begin(self, batch: Any = None) -> None:
        """A step begins with `batch` (for a driver without steps(): a trainer's callback)."""
        if _is_run_context(batch):
            return  # MindSpore's deprecated alias of on_train_step_begin/on_eval_step_begin
        if self._loop is not None and self._enabled and self._core is not None:
            self._core.guard("callback", self._loop.step_begin, batch)

    def train_begin(self, *, network: Any = None, optimizer: Any = None, dataset: Any = None, step: int = 0) -> None:
        """A run begins (steps() calls it on first use): what it trains, and the step it starts from."""
        if self._loop is not None and self._enabled and self._core is not None:
            self._core.guard("callback", self._loop.train_begin, network, optimizer, dataset, step)

    def train_end(self, completed: bool = True) -> None:
        """The run ended: normally (`completed`), or by an exception (close() and `with` decide it themselves)."""
        if self._loop is not None and self._enabled and self._core is not None:
            self._core.guard("callback", self._loop.train_end, completed)

    def eval_end(self, results: Mapping[str, Any]) -> None:
        """An evaluation's results (metric name -> number), e.g. between two loops of a run."""
        if self._enabled and self._core is not None and self._loop is not None:
            self._core.guard("eval", self._loop.eval_end, results)

    @property
    def stop_requested(self) -> bool:
        """Whether an action (early stop, rollback) stopped the loop's run."""
        return self._loop is not None and self._loop.stop_requested


def _is_run_context(value: Any) -> bool:
    return hasattr(value, "original_args") and hasattr(value, "request_stop")
