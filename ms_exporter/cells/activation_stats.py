"""Statistics of selected layers' outputs, computed on the device from the step's own outputs, in either mode.

GRAPH mode runs no forward hooks (MindSpore ignores them there, and under `jit`, without a word), so each selected
cell is replaced in its parent by an `ActivationStatsCell` that calls it and, in the graph compiled for the measured
steps, also reduces its output to six numbers assigned to a Parameter of its own. `MeasuredGraph` switches the train
network between its ordinary graph and that one by the `phase` MindSpore keys its compiled graphs by (as
`Model.export` compiles a second graph of the same network under `export.<phase>`): the steps in between run the
ordinary graph, in which an inactive wrapper compiles to nothing. PYNATIVE mode runs hooks: `OutputHooks` registers
forward hooks for the measured step only and reduces the outputs they kept after the step, in one compiled call per
layer. Either way the layers' statistics are stacked on the device and read in one transfer per measured step
(6 float32 a layer). docs/activations.md has what each costs.
"""

from __future__ import annotations

from typing import Any

import mindspore as ms
import numpy as np
from mindspore import Parameter, Tensor, nn, ops

from ms_exporter.core.compat import zip_strict
from ms_exporter.core.device.device_reductions import stacked

# The statistics vector, by position. COUNT is the number of values: 0 means the layer was not measured.
COUNT, MEAN, STD, ABS_MAX, ZERO_RATIO, NONFINITE_RATIO = range(6)
SIZE = 6
# The phase the measured steps' graph is compiled under. It begins as Model's own "train" does, in case anything in
# MindSpore tells a training graph by its phase.
MEASURED_PHASE = "train_ms_exporter_activations"


def activation_statistics(x: Any) -> Any:
    """[count, mean, std, max |x|, zero share, non-finite share] of the values of `x`, a float32 vector.

    Mean, std and max |x| are over the finite values (one inf must not hide what the others are; the non-finite
    share says how many were not), the std around that mean in a second pass (no E[x^2] - E[x]^2 cancellation).
    With no finite value they come out 0, which the reader replaces by NaN. Works in a graph and eagerly."""
    x = ops.stop_gradient(x).astype(ms.float32).reshape(-1)
    count = ops.cast(ops.size(x), ms.float32)
    finite = ops.isfinite(x)
    finite_count = finite.astype(ms.float32).sum()
    zero = ops.zeros_like(x)
    kept = ops.select(finite, x, zero)
    divisor = ops.maximum(finite_count, 1.0)
    mean = kept.sum() / divisor
    centred = ops.select(finite, x - mean, zero)
    std = ops.sqrt((centred * centred).sum() / divisor)
    zeros = (x == 0).astype(ms.float32).sum()
    return ops.stack([count, mean, std, ops.abs(kept).max(), zeros / count, (count - finite_count) / count])


class ActivationStatsCell(nn.Cell):
    """Calls the cell it wraps; compiled while `ms_exporter_active`, also assigns its output's statistics to
    `ms_exporter_statistics`.

    The output measured is the cell's output, or the first item of a tuple (an LSTM's sequence). The statistics are
    kept out of the network's parameters: it is not trained, not saved in checkpoints and not in the replicas'
    fingerprint. A cell called twice in a step keeps its second call's statistics."""

    def __init__(self, inner: nn.Cell, layer: str) -> None:
        super().__init__(auto_prefix=False)  # the wrapped cell's parameters keep their names
        # Names of our own, so that none hides an attribute of the wrapped cell (which the wrapper passes through).
        self.ms_exporter_cell = inner
        self.ms_exporter_layer = layer
        self.ms_exporter_active = False
        statistics = Parameter(
            Tensor(np.zeros(SIZE, np.float32)), name=f"ms_exporter_activations.{layer}", requires_grad=False
        )
        # Not Cell.__setattr__: that would make it one of the network's parameters.
        object.__setattr__(self, "ms_exporter_statistics", statistics)

    def __getattr__(self, name: str) -> Any:
        # The wrapped cell's attributes stay where the network's code looks for them (`self.fc1.weight` in a
        # parent's construct, in the training script, in another callback).
        try:
            return super().__getattr__(name)
        except AttributeError:
            inner = self.__dict__.get("_cells", {}).get("ms_exporter_cell")
            if inner is None:
                raise
            return getattr(inner, name)

    def construct(self, *args: Any, **kwargs: Any) -> Any:
        output = self.ms_exporter_cell(*args, **kwargs)
        if self.ms_exporter_active:
            measured = output[0] if isinstance(output, (tuple, list)) else output
            output = ops.depend(output, ops.assign(self.ms_exporter_statistics, activation_statistics(measured)))
        return output


def backbone_of(network: Any, train_network: Any) -> Any:
    """The user's network inside Model's wrappers: the first cell (depth first, from the network Model was given,
    then from the train network) whose parameters carry exactly their paths in it as names, so that its cells' paths
    are the layer names the gradient norms use (`fc1` for `fc1.weight`, not `network._backbone.fc1`). A train cell
    or anything holding the optimizer is never it (a train cell's `weights` carry their own names too). The network
    Model was given when no cell qualifies (parameters renamed by an alias), else the train network."""
    for root in (network, train_network):
        if root is None:
            continue
        for _, cell in root.cells_and_names():
            if isinstance(cell, (nn.Optimizer, nn.TrainOneStepCell)):
                continue
            pairs = list(cell.parameters_and_names())
            if not pairs or not all(parameter.name == name for name, parameter in pairs):
                continue
            if not any(isinstance(inner, nn.Optimizer) for _, inner in cell.cells_and_names()):
                return cell
    return network if network is not None else train_network


def named_cells(root: Any) -> list[tuple[str, Any, Any, str]]:
    """(name, cell, parent, attribute) of every cell under `root`, depth first, each once; a wrapper put there
    earlier is seen through (its cell keeps its own name). A CellList or CellDict is looked into but not listed: it
    holds cells and is never called, and a wrapper in its place would break the parent's loop over it."""
    found: list[tuple[str, Any, Any, str]] = []
    seen = {id(root)}

    def visit(parent: Any, prefix: str) -> None:
        for attribute, child in parent.name_cells().items():
            cell = child.ms_exporter_cell if isinstance(child, ActivationStatsCell) else child
            if cell is None or id(cell) in seen:
                continue
            seen.add(id(cell))
            name = f"{prefix}.{attribute}" if prefix else attribute
            if not isinstance(cell, (nn.CellList, nn.CellDict)):
                found.append((name, cell, parent, attribute))
            visit(cell, name)

    visit(root, "")
    return found


def is_loss(cell: Any) -> bool:
    """A loss function's cell (left out of the default layers: its output is the loss, exported already)."""
    return isinstance(cell, nn.LossBase)


def wrap(
    parents: dict[str, Any], layers: list[tuple[str, Any]], known: dict[int, ActivationStatsCell]
) -> list[ActivationStatsCell]:
    """Replaces each (name, cell) of `layers` in its parent (`parents[name]`: (parent cell, attribute name)) by a
    wrapper; returns the wrappers in the order of `layers`. A cell wrapped before (`known`, by the cell's id, kept
    by the caller across training calls) gets its earlier wrapper back: a measured graph compiled then assigns to
    that wrapper's Parameter, and MindSpore reuses the graph."""
    wrappers = []
    for layer, cell in layers:
        parent, child = parents[layer]
        current = parent.name_cells().get(child)
        wrapper = current if isinstance(current, ActivationStatsCell) else known.get(id(cell))
        if wrapper is None or wrapper.ms_exporter_cell is not cell or wrapper.ms_exporter_layer != layer:
            wrapper = ActivationStatsCell(cell, layer)
        known[id(cell)] = wrapper
        if current is not wrapper:
            _replace(parent, child, wrapper)
        wrappers.append(wrapper)
    return wrappers


def unwrap(parents: dict[str, Any], wrappers: list[ActivationStatsCell]) -> None:
    """Puts the wrapped cells back where the wrappers stand."""
    for wrapper in wrappers:
        parent, child = parents[wrapper.ms_exporter_layer]
        if parent.name_cells().get(child) is wrapper:
            _replace(parent, child, wrapper.ms_exporter_cell)


def _replace(parent: Any, child: str, cell: Any) -> None:
    # insert_child_to_cell renames no parameter (SequentialCell.__setitem__ would prefix them again); a
    # SequentialCell calls the list it keeps beside its cells, so that list follows.
    parent.insert_child_to_cell(child, cell)
    if isinstance(getattr(parent, "cell_list", None), list):
        parent.cell_list = list(parent.name_cells().values())


class MeasuredGraph:
    """GRAPH mode: the measured steps run the train network's second graph, compiled with the wrappers active.

    `arm()` before a measured step, `disarm()` after it. The cells switched are the train network and the train
    cells inside it (GradNormTrainOneStepCell calls one of its two graphs per step); each keeps its own phase.
    With `always` (dataset sink mode on a device, where the whole loop is one graph compiled once) the wrappers
    are active from the start and every step is measured."""

    def __init__(self, train_network: Any, wrappers: list[ActivationStatsCell], always: bool = False) -> None:
        self._wrappers = wrappers
        self._tops = [train_network] + [
            cell for _, cell in train_network.cells_and_names() if isinstance(cell, nn.TrainOneStepCell)
        ]
        self._tops = list({id(top): top for top in self._tops}.values())
        self._saved: list[str] | None = None
        self.always = always
        for wrapper in wrappers:
            wrapper.ms_exporter_active = always

    @property
    def armed(self) -> bool:
        return self._saved is not None

    def arm(self) -> None:
        if self.always or self._saved is not None:
            return
        self._saved = [top.phase for top in self._tops]
        for top in self._tops:
            top.phase = MEASURED_PHASE
        for wrapper in self._wrappers:
            wrapper.ms_exporter_active = True

    def disarm(self) -> None:
        if self._saved is None:
            return
        for top, phase in zip_strict(self._tops, self._saved):
            top.phase = phase
        for wrapper in self._wrappers:
            wrapper.ms_exporter_active = False
        self._saved = None

    def compile_ahead(self, batch: Any) -> None:
        """Compiles the graph the first step did not run (the measured one, or the ordinary one when the first
        step was measured) from that step's batch, inside the first step's compile time: the step that first runs
        it does not compile it, and does not look like a hang."""
        if self.always or not isinstance(batch, (tuple, list)):
            return
        armed = self.armed
        if armed:
            self.disarm()
        else:
            self.arm()
        try:
            for top in self._tops:
                top.compile(*batch)
        finally:
            if armed:
                self.arm()
            else:
                self.disarm()

    def statistics(self) -> dict[str, np.ndarray]:
        """Every wrapper's statistics of its last measured step (COUNT 0: none yet), in one read."""
        rows = _read_stacked([wrapper.ms_exporter_statistics for wrapper in self._wrappers])
        return {wrapper.ms_exporter_layer: row for wrapper, row in zip_strict(self._wrappers, rows)}

    def drop(self, layers: list[str]) -> None:
        """Nothing to do: a wrapper that is not called costs nothing."""

    def close(self) -> None:
        self.disarm()


class OutputHooks:
    """PYNATIVE mode: forward hooks on the selected cells for the measured step only, each keeping its cell's
    output (the first item of a tuple); `statistics()` reduces them after the step, one compiled call a layer, and
    reads the layers' statistics in one transfer."""

    always = False  # hooks are registered for the measured steps only

    def __init__(self, layers: list[tuple[str, Any]]) -> None:
        self._layers = layers
        self._handles: list[Any] = []
        self._outputs: dict[str, Any] = {}

    @property
    def armed(self) -> bool:
        return bool(self._handles)

    def arm(self) -> None:
        if self._handles:
            return
        self._outputs.clear()
        self._handles = [cell.register_forward_hook(self._keeper(layer)) for layer, cell in self._layers]

    def _keeper(self, layer: str) -> Any:
        outputs = self._outputs

        def keep(cell: Any, args: Any, output: Any) -> None:
            outputs[layer] = output[0] if isinstance(output, (tuple, list)) else output

        return keep

    def disarm(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def drop(self, layers: list[str]) -> None:
        """Hook these layers no more (their hooks did not run: inside `ms.jit`, which may try to compile a hook)."""
        gone = set(layers)
        self._layers = [(layer, cell) for layer, cell in self._layers if layer not in gone]

    def statistics(self) -> dict[str, np.ndarray]:
        reduce = _eager_statistics()
        measured = {layer: reduce(output) for layer, output in self._outputs.items() if isinstance(output, Tensor)}
        self._outputs.clear()  # the outputs are the step's: let them go
        rows = _read_stacked(list(measured.values()))
        return dict(zip_strict(measured, rows))

    def close(self) -> None:
        self.disarm()
        self._outputs.clear()


def _read_stacked(statistics: list[Any]) -> np.ndarray:
    """Statistics vectors (device tensors, Parameters among them) as one [layers, SIZE] array, in one read."""
    if not statistics:
        return np.zeros((0, SIZE))
    return stacked(statistics).astype(np.float64).reshape(len(statistics), SIZE)


_COMPILED: list[Any] = []


def _eager_statistics() -> Any:
    """`activation_statistics` compiled once (about 1 ms a call on a CPU, where its dozen operators one by one take
    30), with dynamic shapes, so that a layer whose output length varies is not compiled again at every length."""
    if not _COMPILED:
        _COMPILED.append(ms.jit(activation_statistics, dynamic=1))
    return _COMPILED[0]
