"""Reads cb_params once per step into a small immutable StepSample that every probe derives from."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import numpy as np

from ms_exporter.core.compat import SLOTS
from ms_exporter.core.output_layout import SCALAR, OutputLayout


@dataclass(frozen=True, **SLOTS)
class StepSample:
    """What one call of the step-end hook saw. In sink mode one call covers `steps` steps."""

    step: int  # cb_params.cur_step_num after this call
    epoch: int
    steps: int  # steps completed by this call (sink size in sink mode, else 1)
    loss: float | None  # None when the network returned nothing readable
    duration: float  # seconds from step begin to step end, measured after the loss read
    data_wait: float | None  # seconds from the previous step's end to this step's begin
    samples: int  # samples consumed by this call
    tokens: int  # non-padding tokens consumed by this call (0 when the data has no token column)
    wall_time: float  # unix time the call ended
    monotonic: float  # perf_counter at the end, for rates
    outputs: Any = None  # the train cell's net_outputs, for probes that read more than the loss
    layout: OutputLayout = SCALAR  # what each item of `outputs` is
    # Sum over the call's sequences (samples, or the documents packed into them) of their length squared: what
    # attention costs grows with it (ms_exporter/core/analysis/flops.py). 0 when not counted.
    squares: int = 0
    # Seconds from the step's begin to the collective the loop marked (loop API: collective_begin()); 0 unmarked.
    own_compute: float = 0.0
    # Seconds of other callbacks' hooks, checkpoints and evaluations in this step's cycle (out of duration and
    # data_wait both).
    hooks: float = 0.0

    @property
    def cycle_began(self) -> float:
        """perf_counter when this call's step cycle began: its data wait's start (the step's, without one)."""
        return self.monotonic - self.duration - (self.data_wait or 0.0)


def read_loss(outputs: Any) -> float | None:
    """The loss as a Python float: Tensor, numpy value, float, or a tuple/list whose first item is the loss."""
    while isinstance(outputs, (tuple, list)):
        if not outputs:
            return None
        outputs = outputs[0]
    return read_scalar(outputs)


def read_scalar(value: Any) -> float | None:
    """A Tensor, numpy value or Python number as a float (a vector: its mean; a bool: 0.0 or 1.0)."""
    if value is None:
        return None
    if isinstance(value, (float, int)):
        return float(value)
    if getattr(value, "size", None) == 1 and hasattr(value, "item"):
        # One value (the usual loss): Tensor.item() reads it without building a numpy array, whose buffer
        # format numpy parses in Python (tens of µs per step under a training's GIL contention); bf16 works.
        try:
            return float(value.item())
        except (TypeError, ValueError, RuntimeError):
            pass
    array = to_numpy(value)
    if array is None or array.size == 0:
        return None
    if array.size == 1:
        return float(array.reshape(-1)[0])
    # A per-sample loss vector: the mean is what the optimiser minimises.
    return float(np.mean(array, dtype=np.float64))


def to_numpy(value: Any) -> np.ndarray | None:
    """A Tensor (bfloat16 included) or numpy value as a numpy array; None for anything else."""
    if isinstance(value, np.ndarray):
        return value
    if isinstance(value, np.generic):
        return np.asarray(value)
    asnumpy = getattr(value, "asnumpy", None)
    if asnumpy is None:
        return None
    if value.dtype == _bfloat16():
        # numpy has no bfloat16: widen on the device side first, which is exact.
        import mindspore

        return np.asarray(value.astype(mindspore.float32).asnumpy())
    return np.asarray(asnumpy())


@functools.cache
def _bfloat16() -> Any:
    try:
        import mindspore

        return mindspore.bfloat16
    except (ImportError, AttributeError):
        return None


UNCOUNTABLE = object()  # keep()'s answer for a batch that is not a list of tensors


@dataclass(frozen=True)
class Counted:
    """Samples and tokens a driver counted itself (the loop API's samples=, tokens=), over what keep() kept."""

    samples: int | None  # None: as the batch says
    tokens: int | None
    kept: Any


class BatchCounter:
    """Samples and non-padding tokens of a batch, resolved once against the dataset's column names; with a
    `lengths_column`, also the sum of its sequences' lengths squared (for the FLOPs of attention)."""

    def __init__(self, mask_column: str, ids_column: str, lengths_column: str | None = None) -> None:
        self._mask_column = mask_column
        self._ids_column = ids_column
        self._lengths_column = lengths_column
        self._squares = lengths_column is not None
        self._mask_index: int | None = None
        self._lengths_index: int | None = None
        self._ids_index = 0
        self._dataset_batch = 0
        self._dataset_tokens_per_sample = 0
        self._ids_are_tokens: bool | None = None

    def bind(self, dataset: Any) -> None:
        """Look up column positions and the static batch shape once, at train begin."""
        self._mask_index = None
        self._lengths_index = None
        self._ids_index = 0
        self._dataset_batch = 0
        self._dataset_tokens_per_sample = 0
        self._ids_are_tokens = None
        if dataset is None:
            return
        try:
            names = list(dataset.get_col_names())
        except Exception:
            names = []
        if self._mask_column in names:
            self._mask_index = names.index(self._mask_column)
        if self._lengths_column is not None and self._lengths_column in names:
            self._lengths_index = names.index(self._lengths_column)
        if self._ids_column in names:
            self._ids_index = names.index(self._ids_column)
        try:
            self._dataset_batch = int(dataset.get_batch_size())
            shapes = dataset.output_shapes()
            shape = shapes[self._ids_index] if shapes else []
            self._dataset_tokens_per_sample = int(shape[1]) if len(shape) >= 2 else 0
            types = dataset.output_types()
            if types and not np.issubdtype(np.dtype(types[self._ids_index]), np.integer):
                self._dataset_tokens_per_sample = 0  # float features: no tokens
        except Exception:  # shapes are only a fallback for sink mode; a dataset without them is fine
            pass

    def keep(self, element: Any) -> Any:
        """At step begin: what count() needs of the batch (its shape, the mask and the document lengths tensors),
        not the batch itself.

        Keeping the whole batch until the step is published measured 0.4% of the demo model's step time; the
        mask alone, which is counted later, costs ~6 µs a record when it is released (docs/development.md).
        """
        if not element:
            return None  # sink mode: count() uses the dataset's static shape
        try:
            ids = element[self._ids_index] if self._ids_index < len(element) else element[0]
            shape = tuple(ids.shape)
            index = self._lengths_index
            lengths = element[index] if index is not None and index < len(element) else None
            if self._mask_index is not None and self._mask_index < len(element):
                return shape, element[self._mask_index], lengths
            if self._ids_are_tokens is None and len(shape) >= 2:
                self._integer_ids(ids)  # once per run, on the first batch
            return shape, None, lengths
        except (AttributeError, TypeError, IndexError, KeyError, ValueError):
            return UNCOUNTABLE  # not a batch of tensors (strings, a dict, None columns): nothing to count

    def count(self, kept: Any, steps: int) -> tuple[int, int, int]:
        """(samples, tokens, sum of sequence lengths squared) for `steps` steps from what keep() returned (None in
        sink mode); the squares are 0 unless a lengths column was asked for."""
        if kept is None:
            # Sink mode: the hook does not see the batch, so use the dataset's static shape (padding included).
            batch, per_sample = self._dataset_batch, self._dataset_tokens_per_sample
            squares = batch * per_sample * per_sample * steps if self._squares else 0
            return batch * steps, batch * per_sample * steps, squares
        if kept is UNCOUNTABLE:
            return 0, 0, 0
        if isinstance(kept, Counted):
            samples, tokens, squares = self.count(kept.kept, steps) if kept.kept is not None else (0, 0, 0)
            if kept.tokens is not None:
                tokens, squares = int(kept.tokens) * steps, 0
            return (samples if kept.samples is None else int(kept.samples) * steps), tokens, squares
        shape, mask, lengths = kept
        samples = int(shape[0]) if shape else 1
        row_lengths: np.ndarray | None = None
        if mask is not None:
            try:
                # A mask is integer or bool, never bfloat16: asnumpy() directly, without to_numpy's checks.
                array = mask.asnumpy() if hasattr(mask, "asnumpy") else to_numpy(mask)
            except (AttributeError, TypeError, ValueError, RuntimeError):
                return samples * steps, 0, 0
            if array is None:
                tokens = 0
            elif self._squares and array.ndim == 2:
                row_lengths = np.count_nonzero(array, axis=1)
                tokens = int(row_lengths.sum())
            else:
                tokens = int(np.count_nonzero(array))
        elif len(shape) >= 2 and self._ids_are_tokens:
            tokens = samples * int(shape[1])
        else:
            tokens = 0
        squares = self._count_squares(shape, samples, tokens, row_lengths, lengths) if self._squares and tokens else 0
        return samples * steps, tokens * steps, squares * steps

    @staticmethod
    def _count_squares(
        shape: tuple[int, ...], samples: int, tokens: int, row_lengths: np.ndarray | None, lengths: Any
    ) -> int:
        """Packed documents' lengths squared where the batch says them, else each sample's real length squared."""
        seq_len = int(shape[1]) if len(shape) >= 2 else 0
        if lengths is not None:
            ends = to_numpy(lengths)
            if ends is not None and ends.size:
                return document_squares(ends, seq_len)
        if row_lengths is not None:
            return int(np.dot(row_lengths.astype(np.int64), row_lengths.astype(np.int64)))
        return samples * (tokens // samples) ** 2 if samples else 0

    def _integer_ids(self, ids: Any) -> bool:
        """Token ids are integers; a float feature matrix has a second axis too but holds no tokens."""
        if self._ids_are_tokens is None:  # decided once per run: the read below is a one-off
            array = to_numpy(ids)
            self._ids_are_tokens = array is not None and bool(np.issubdtype(array.dtype, np.integer))
        return self._ids_are_tokens


def document_squares(ends: np.ndarray, seq_len: int = 0) -> int:
    """The sum of the packed documents' lengths squared, from each row's cumulative end offsets: MindSpore
    Transformers' `actual_seq_len` is [128, 1024] for a row of documents of 128 and 896 tokens. A leading 0 and
    trailing repeats of the last end (the column padded to a fixed size) add nothing.

    Across a batch, MindSpore Transformers offsets each row's ends by the rows before it (row k's ends lie in
    (k * seq_len, (k + 1) * seq_len]); rows that start again from 0 are read as they are.
    """
    rows = ends.reshape(ends.shape[0], -1) if ends.ndim >= 2 else ends.reshape(1, -1)
    total = 0
    previous_end = 0
    for k, row in enumerate(rows.astype(np.int64)):
        if seq_len:
            base = k * seq_len if row.min() > k * seq_len else 0
        else:
            base = previous_end if row[0] > previous_end else 0
        documents = np.diff(row, prepend=base)
        documents = documents[documents > 0]
        total += int(np.dot(documents, documents))
        previous_end = int(row.max())
    return total
