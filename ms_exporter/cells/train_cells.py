"""Train-one-step cells that hand the monitor what it cannot see from outside the step.

`GradNormTrainOneStepCell` is the one-line way for `Model(network, loss_fn, optimizer)` users to get gradient
norms from the real step: it returns `(loss, global_norm, parameter_norms)` computed in-graph from the very
gradients it applies. `LossScaleTrainOneStepCell` scales the loss, detects overflow in-graph with
`ops.isfinite`, skips the update on overflow and adjusts the scale, returning `(loss, overflow, scale)`: the
shape of MindSpore's `TrainOneStepWithLossScaleCell`, which cannot run on CPU.
"""

from __future__ import annotations

from typing import Any

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from ms_exporter.core.device.bit_flip import flipped_copy
from ms_exporter.core.device.optimizer_step import optimizer_step

_square_sum = ops.MultitypeFuncGraph("_square_sum")
_all_finite = ops.MultitypeFuncGraph("_all_finite")
_scale_by = ops.MultitypeFuncGraph("_scale_by")


@_square_sum.register("Tensor")
def _square_sum_tensor(grad: Tensor) -> Tensor:
    grad = grad.astype(ms.float32)
    return ops.reduce_sum(grad * grad)


@_all_finite.register("Tensor")
def _all_finite_tensor(grad: Tensor) -> Tensor:
    return ops.isfinite(grad).all()


@_scale_by.register("Tensor", "Tensor")
def _scale_by_tensor(factor: Tensor, grad: Tensor) -> Tensor:
    return grad * factor.astype(grad.dtype)


class _NormedStep(nn.TrainOneStepCell):
    """The gradients of a step, their global L2 norm and the optional clipping by it: the one place both graphs of
    GradNormTrainOneStepCell (the norm step and the plain one) compute them."""

    def __init__(self, network: nn.Cell, optimizer: nn.Optimizer, sens: float | None, clip_norm: float | None) -> None:
        super().__init__(network, optimizer, sens)
        self._clip = clip_norm is not None
        self._clip_value = Tensor(clip_norm if clip_norm is not None else 1.0, ms.float32)
        self.hyper_map = ops.HyperMap()
        # Read when the graph compiles: GradNormTrainOneStepCell.measure_local_norms(), skip_local_outliers() and
        # share_loss().
        self.local_norms = False
        self.skip_outliers = False
        self.shares_loss = False

    def _loss_and_grads(self, *inputs: Any) -> tuple[Any, Any, Any]:
        loss, grads = self._local_gradients(*inputs)
        return self._reduced(loss, grads)

    def _local_gradients(self, *inputs: Any) -> tuple[Any, Any]:
        """The loss and this rank's own gradients, before the all-reduce."""
        loss = self.network(*inputs)
        sens = ops.fill(loss.dtype, loss.shape, self.sens)
        return loss, self.grad(self.network, self.weights)(*inputs, sens)

    def _reduced(self, loss: Any, grads: Any) -> tuple[Any, Any, Any]:
        """(loss, local norm, the gradients all-reduced across the replicas). With local norms on, this rank's own
        global norm of its gradients before the reducer is written to `local_grad_norm` first (a corruption of a
        local gradient reaches every replica identically through the reducer: only the norm of the rank it happened
        on shows it); else the local norm is None."""
        local = None
        if self.local_norms:
            local = ops.sqrt(ops.stack(self.hyper_map(_square_sum, grads)).sum()).reshape((1,))
            loss = ops.depend(loss, ops.assign(self.local_grad_norm, local))
        return loss, local, self.grad_reducer(grads)

    def _applied(self, loss: Any, local: Any, grads: Any) -> Any:
        """The optimizer's update of `grads`, and the loss (with the loss shared, its mean over the replicas: one
        all-reduce of a number after the update, in every graph alike)."""
        loss = self._updated(loss, local, grads)
        if self.shares_loss:
            loss = self._loss_sum(loss) / self._replica_count.astype(loss.dtype)
        return loss

    def _updated(self, loss: Any, local: Any, grads: Any) -> Any:
        """The optimizer's update of `grads`; with outlier skipping on, not where any replica's local norm is over
        its own limit or not finite: every replica of the reducer's group learns of it through one all-reduce of a
        number and skips the same step (`local_grad_skipped` says whether this step was)."""
        if not self.skip_outliers:
            return ops.depend(loss, self.optimizer(grads))
        over = ops.logical_or(local > self.local_grad_limit, ops.logical_not(ops.isfinite(local)))
        votes = over.astype(ms.float32)
        if self.reducer_flag:  # after the gradients' all-reduce, in every graph alike: collectives meet in order
            votes = self._votes(ops.depend(votes, grads))
        skipped = votes.sum() > 0
        loss = ops.depend(loss, ops.assign(self.local_grad_skipped, skipped.astype(ms.float32).reshape((1,))))
        if not skipped:
            loss = ops.depend(loss, self.optimizer(grads))
        return loss

    def _norms(self, grads: Any) -> tuple[Any, Any]:
        """(global norm, each gradient's sum of squares): the L2 norm of all gradients together, in float32."""
        squares = ops.stack(self.hyper_map(_square_sum, grads))
        return ops.sqrt(squares.sum()), squares

    def _clipped(self, grads: Any, global_norm: Any) -> Any:
        """The gradients scaled down to a global norm of at most `clip_norm` (unchanged without one)."""
        if self._clip:
            return self.hyper_map(
                ops.partial(_scale_by, self._clip_value / ops.maximum(global_norm, self._clip_value)), grads
            )
        return grads


class _PlainStep(_NormedStep):
    """The ordinary step (with the optional clipping): what runs on the steps whose norms nobody reads."""

    def construct(self, *inputs: Any) -> Any:
        loss, local, grads = self._loss_and_grads(*inputs)
        if self._clip:
            grads = self._clipped(grads, self._norms(grads)[0])
        return self._applied(loss, local, grads)


class _LocalGradientsStep(_NormedStep):
    """The first half of a drill's step: the loss and the local gradients, nothing applied."""

    def construct(self, *inputs: Any) -> Any:
        return self._local_gradients(*inputs)


class _AppliedGradientsStep(_NormedStep):
    """The second half of a drill's step: the given local gradients reduced, measured and applied."""

    def construct(self, loss: Any, grads: Any) -> Any:
        loss, local, grads = self._reduced(loss, grads)
        global_norm, squares = self._norms(grads)
        loss = self._applied(loss, local, self._clipped(grads, global_norm))
        return loss, global_norm, ops.sqrt(squares)


class GradNormTrainOneStepCell(_NormedStep):
    """TrainOneStepCell that also reports the global L2 gradient norm (before clipping) and one norm per parameter.

    On every `every_n_steps`-th step it returns `(loss, global_norm, parameter_norms)`, computed in-graph from the
    gradients it applies (`parameter_norms[i]` belongs to `optimizer.parameters[i]`); on the other steps it runs
    the ordinary step and returns the loss alone. The two are separate graphs, so the steps in between cost
    exactly what a plain TrainOneStepCell costs: one reduction per parameter is ~1.7 ms of kernel launches on a
    2-core CPU, and an in-graph `if` alone ~0.8 ms. `clip_norm` (optional) clips by the global norm on every step.
    TrainingMonitor sets `every_n_steps` to its `grad_norm.every_n_steps` at train begin.

    In dataset sink mode MindSpore compiles the whole loop into one graph from `construct`: the norms are then
    computed (and clipped) on every step.

    `measure_local_norms()` (the monitor calls it at train begin where replica checks run) makes every step also
    write this rank's global norm of its own gradients, before the all-reduce, to the Parameter `local_grad_norm`
    (docs/sdc.md#local-gradients); `flip_local_gradient()` arms a drill's bit flip in a local gradient;
    `share_loss()` (the monitor calls it at train begin in a job of several ranks with an action that reads the
    loss) makes the loss it returns the mean over the replicas (docs/rollback.md#in-a-job-of-several-ranks).
    """

    outputs_norms_when_measured = True  # core.output_layout.NORMS_WHEN_MEASURED: how the monitor reads the outputs

    def __init__(
        self,
        network: nn.Cell,
        optimizer: nn.Optimizer,
        sens: float | None = None,
        clip_norm: float | None = None,
        every_n_steps: int = 10,
    ) -> None:
        if clip_norm is not None and not clip_norm > 0:
            raise ValueError(f"clip_norm must be a number greater than 0 or None, got {clip_norm!r}")
        if isinstance(every_n_steps, bool) or not isinstance(every_n_steps, int) or every_n_steps < 1:
            raise ValueError(f"every_n_steps must be an integer of at least 1, got {every_n_steps!r}")
        super().__init__(network, optimizer, sens, clip_norm)
        self.clip_norm = clip_norm
        self.every_n_steps = every_n_steps
        self._plain = _PlainStep(network, optimizer, sens, clip_norm)
        self._calls: int | None = None
        self._ran = {True: False, False: False}  # whether the norm graph / the plain graph has run (compiled)
        self._flips: dict[int, list[tuple[int, int, int]]] = {}  # step -> (gradient, element, bit) drills
        self._split: tuple[_LocalGradientsStep, _AppliedGradientsStep] | None = None

    def measure_local_norms(self) -> Parameter:
        """Every step from now on writes this rank's local gradient norm (before the all-reduce) to the returned
        Parameter (shape (1,), float32). Before the first step: a graph compiled already keeps what it does."""
        if not self.local_norms:
            self.local_grad_norm = Parameter(
                Tensor(np.full(1, np.nan, np.float32)), name="ms_exporter_local_grad_norm", requires_grad=False
            )
            self.local_norms = True
            self._share(self._plain)
        return self.local_grad_norm

    def skip_local_outliers(self) -> tuple[Parameter, Parameter]:
        """From now on every step is skipped on every replica where one replica's local gradient norm is over its
        limit or not finite: (limit, skipped), two Parameters of shape (1,): the limit this rank's monitor sets (inf
        until it has a history), and whether the last step was skipped (1.0) or applied (0.0). Measures the local
        norms too. Before the first step: a graph compiled already keeps what it does."""
        self.measure_local_norms()
        if not self.skip_outliers:
            self.local_grad_limit = Parameter(
                Tensor(np.full(1, np.inf, np.float32)), name="ms_exporter_local_grad_limit", requires_grad=False
            )
            self.local_grad_skipped = Parameter(
                Tensor(np.zeros(1, np.float32)), name="ms_exporter_local_grad_skipped", requires_grad=False
            )
            self._votes = ops.AllReduce() if self.reducer_flag else None
            self.skip_outliers = True
            self._share(self._plain)
        return self.local_grad_limit, self.local_grad_skipped

    def share_loss(self) -> bool:
        """From now on the loss every graph returns is its mean over the replicas of the gradients' reducer (one
        all-reduce of a number a step), the same on every replica: what the monitor's actions decide from in a job
        of more than one rank (docs/rollback.md#in-a-job-of-several-ranks). False, changing nothing, without a
        reducer (one process, or a parallel mode that reduces otherwise). Before the first step: a graph compiled
        already keeps what it does."""
        if not self.reducer_flag:
            return False
        if not self.shares_loss:
            self._loss_sum = ops.AllReduce()
            self._replica_count = Tensor(float(getattr(self, "degree", 1) or 1), ms.float32)
            self.shares_loss = True
            self._share(self._plain)
        return True

    def _share(self, other: _NormedStep) -> None:
        """Another graph of this cell measures, skips and shares its loss as it does, into the same Parameters."""
        other.local_norms, other.skip_outliers = self.local_norms, self.skip_outliers
        other.shares_loss = self.shares_loss
        if self.shares_loss:
            other._loss_sum, other._replica_count = self._loss_sum, self._replica_count
        if self.local_norms:
            other.local_grad_norm = self.local_grad_norm
        if self.skip_outliers:
            other.local_grad_limit, other.local_grad_skipped = self.local_grad_limit, self.local_grad_skipped
            other._votes = self._votes

    def flip_local_gradient(self, step: int, gradient: int, element: int, bit: int) -> None:
        """A drill: at optimizer step `step`, bit `bit` of element `element` of the local gradient of the
        `gradient`-th trained weight flips after the backward pass, before the all-reduce. That step runs as two
        graphs (gradients; reduce and apply), compiled at its first use; the others as always. Every replica of
        the group must run that step the same way (`split_step` on the others): their all-reduces meet."""
        self._flips.setdefault(step, []).append((gradient, element, bit))

    def split_step(self, step: int) -> None:
        """Runs optimizer step `step` as the two graphs of a drill, flipping nothing here: another replica flips a
        bit of its local gradient at that step, and the collectives of both graphs must match theirs."""
        self._flips.setdefault(step, [])

    def __call__(self, *inputs: Any) -> Any:
        if self._calls is None:
            # Count in the optimizer's steps, so that a resumed run measures at the same steps as the monitor.
            self._calls = optimizer_step(self.optimizer, 0)
        self._calls += 1
        norms = self._calls % self.every_n_steps == 0
        flips = self._flips.pop(self._calls, None)
        if flips is not None:
            return self._flipped_step(inputs, flips, norms)
        self._ran[norms] = True
        return super().__call__(*inputs) if norms else self._plain(*inputs)

    def _flipped_step(self, inputs: tuple[Any, ...], flips: list[tuple[int, int, int]], norms: bool) -> Any:
        if self._split is None:
            halves = [half(self.network, self.optimizer, self.sens, self.clip_norm) for half in _SPLIT]
            for half in halves:
                self._share(half)
            self._split = (halves[0], halves[1])
        loss, grads = self._split[0](*inputs)
        grads = list(grads)
        for gradient, element, bit in flips:
            if gradient < len(grads):
                grads[gradient] = flipped_copy(grads[gradient], element, bit)
        outputs = self._split[1](loss, ms.mutable(tuple(grads)))  # no recompiling for new values
        return outputs if norms else outputs[0]

    def compiles_next(self) -> bool:
        """Whether the next call runs one of the two graphs for the first time, so MindSpore compiles it inside
        that step: the monitor counts that step as compilation (a large model's norm graph compiling at step
        `every_n_steps` is not a hang)."""
        if self._calls is None:
            return True
        return not self._ran[(self._calls + 1) % self.every_n_steps == 0]

    def construct(self, *inputs: Any) -> Any:
        loss, local, grads = self._loss_and_grads(*inputs)
        global_norm, squares = self._norms(grads)
        loss = self._applied(loss, local, self._clipped(grads, global_norm))
        return loss, global_norm, ops.sqrt(squares)


_SPLIT = (_LocalGradientsStep, _AppliedGradientsStep)


class LossScaleTrainOneStepCell(nn.Cell):
    """Dynamic loss scaling that runs on CPU: scale, unscale, `ops.isfinite` over the gradients, skip on overflow.

    On overflow the scale is divided by `scale_factor` (not below 1); after `scale_window` clean steps it is
    multiplied by it. Outputs `(loss, overflow, scale)` like `nn.TrainOneStepWithLossScaleCell`.
    """

    def __init__(
        self,
        network: nn.Cell,
        optimizer: nn.Optimizer,
        init_scale: float = 2.0**16,
        scale_factor: float = 2.0,
        scale_window: int = 1000,
    ) -> None:
        super().__init__(auto_prefix=False)
        if not init_scale >= 1 or not scale_factor > 1 or scale_window < 1:
            raise ValueError(
                "init_scale must be >= 1, scale_factor > 1 and scale_window >= 1; got "
                f"{init_scale!r}, {scale_factor!r}, {scale_window!r}"
            )
        self.network = network
        self.network.set_grad()
        self.optimizer = optimizer
        self.weights = optimizer.parameters
        self.grad = ops.GradOperation(get_by_list=True, sens_param=True)
        self.hyper_map = ops.HyperMap()
        self.scale = Parameter(Tensor(init_scale, ms.float32), name="loss_scale")
        self.good_steps = Parameter(Tensor(0, ms.int32), name="loss_scale_good_steps")
        self.scale_factor = Tensor(scale_factor, ms.float32)
        self.scale_window = Tensor(scale_window, ms.int32)
        self.one = Tensor(1.0, ms.float32)

    def construct(self, *inputs: Any) -> Any:
        loss = self.network(*inputs)
        scale = self.scale.value()
        sens = ops.fill(loss.dtype, loss.shape, scale.astype(loss.dtype))
        grads = self.grad(self.network, self.weights)(*inputs, sens)
        grads = self.hyper_map(ops.partial(_scale_by, self.one / scale), grads)
        overflow = ops.logical_not(ops.stack(self.hyper_map(_all_finite, grads)).all())
        good = ops.select(overflow, ops.zeros_like(self.good_steps), self.good_steps + 1)
        grow = good >= self.scale_window
        new_scale = ops.select(
            overflow,
            ops.maximum(scale / self.scale_factor, self.one),
            ops.select(grow, scale * self.scale_factor, scale),
        )
        good = ops.select(grow, ops.zeros_like(good), good)
        if not overflow:
            loss = ops.depend(loss, self.optimizer(grads))
        loss = ops.depend(loss, ops.assign(self.good_steps, good))
        loss = ops.depend(loss, ops.assign(self.scale, new_scale))
        return loss, overflow, scale
