"""Data quality of the batch each step consumed: label entropy, sequence lengths and padding, duplicate, empty and
out-of-vocabulary samples, and a drop against baselines learned over the run's first batches."""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from ms_exporter.config import DataQualityConfig
from ms_exporter.core import catalogue
from ms_exporter.core.cb_params import epoch_of, sink_mode_of, steps_per_epoch_of
from ms_exporter.core.probe import Probe
from ms_exporter.core.sample import to_numpy
from ms_exporter.core.store import Family, HistogramSeries, MetricStore, Series

logger = logging.getLogger("ms_exporter")


class BatchList(Protocol):
    """Where the batches of a drop go (actions/low_batches.py: save_dir/skipped-batches.json, written by a thread
    of its own)."""

    @property
    def full(self) -> bool:
        """No more batches are taken (data_quality.max_listed): the probe stops identifying them."""

    def identify(
        self, step: int, epoch: int, position: int | None, columns: Sequence[Any], details: dict[str, Any]
    ) -> dict[str, Any]:
        """The batch as the list records it (content hashes), made now, on the training thread."""

    def add(self, entries: list[dict[str, Any]]) -> None:
        """Queue identified batches for the file; never waits."""

    def flush(self) -> None:
        """Write what is queued now (train end, a signal, close)."""


def class_ids(labels: np.ndarray) -> np.ndarray | None:
    """The class of each labelled position of a batch: integer labels as they are, less negative ones (an ignore
    index such as -100); one-hot or probability rows (floats with a last axis over 1) by their largest entry; float
    labels that are whole numbers as those numbers. None when the column holds no class labels (regression targets,
    text)."""
    if labels.dtype == np.bool_ or np.issubdtype(labels.dtype, np.integer):
        values = labels.reshape(-1)
        return values if labels.dtype == np.bool_ or not values.size or values.min() >= 0 else values[values >= 0]
    if not np.issubdtype(labels.dtype, np.floating):
        return None
    if labels.ndim >= 2 and labels.shape[-1] > 1:
        return np.asarray(labels.reshape(-1, labels.shape[-1]).argmax(axis=1))
    values = labels.reshape(-1)
    if not (np.all(np.isfinite(values)) and np.all(values == np.round(values))):
        return None
    return values[values >= 0]


_BINCOUNT_LIMIT = 1 << 20  # class ids below this are counted with one array of that many counts at most


def entropy_bits(ids: np.ndarray) -> float:
    """Shannon entropy of the distribution of `ids` (not empty), in bits: 0 for one class, log2(k) for k classes
    equally often."""
    if np.issubdtype(ids.dtype, np.integer) and int(ids.max()) < _BINCOUNT_LIMIT:
        counts = np.bincount(ids)  # a few µs where np.unique sorts
        counts = counts[counts > 0]
    else:
        _, counts = np.unique(ids, return_counts=True)
    shares = counts / counts.sum()
    return float(-np.dot(shares, np.log2(shares))) + 0.0  # + 0.0: one class gives -0.0


@dataclass(frozen=True)
class _LengthSeries:
    """The series that need padding known, made together at the first batch that has it."""

    mean: Series
    lengths: HistogramSeries
    padding: Series
    empty: Series


class _Watch:
    """One quantity: its baseline (the median of the first `baseline_steps` measured values) and its low streak.
    Its series appear with the baseline: before it there is nothing to be low against."""

    def __init__(self, quantity: str, config: DataQualityConfig, families: tuple[Family, Family, Family]) -> None:
        self.quantity = quantity
        self._config = config
        self._families = families
        self._learning: list[float] = []
        self.baseline: float | None = None
        self.streak = 0
        self._series: tuple[Series, Series, Series] | None = None

    def observe(self, value: float) -> bool:
        """Whether `value` is low (below drop_ratio x the baseline); False while the baseline is being learned."""
        if self.baseline is None:
            self._learning.append(value)
            if len(self._learning) >= self._config.baseline_steps:
                self.baseline = float(np.median(self._learning))
                self._learning = []
                baseline, streak, flag = (family.series(quantity=self.quantity) for family in self._families)
                baseline.value = self.baseline
                self._series = (baseline, streak, flag)
            return False
        low = value < self.baseline * self._config.drop_ratio
        self.streak = self.streak + 1 if low else 0
        if self._series is not None:
            self._series[1].value = self.streak
            self._series[2].value = 1.0 if self.dropped else 0.0
        return low

    @property
    def dropped(self) -> bool:
        """The low streak has reached data_quality.streak: a drop, not a dip."""
        return self.streak >= self._config.streak


class DataQualityProbe(Probe):
    """The batch each step consumed, at step begin on the training thread (on_batch), every `every_n_steps` steps:
    only the label, token and mask columns are read to the host. Label entropy needs `label_column`; lengths,
    padding and empty samples need to know padding (the `attention_mask_column`, else `pad_id`); out-of-vocabulary
    tokens need `vocab_size`. A quantity's baseline is its median over the first `baseline_steps` measured batches;
    a batch below `drop_ratio` x the baseline is low, and `streak` low batches in a row are a drop. With
    `list_batches` every batch of a drop (those of its first `streak` too) goes to save_dir/skipped-batches.json.
    In dataset sink mode MindSpore hands the callback no batch: the probe says so once and measures nothing.

    | name | type | labels | unit |
    |---|---|---|---|
    | mindspore_train_data_label_entropy_bits | gauge | | bits |
    | mindspore_train_data_sequence_length | gauge | | tokens (mean over the batch) |
    | mindspore_train_data_sequence_length_distribution | histogram | | tokens (one per sample) |
    | mindspore_train_data_padding_ratio | gauge | | ratio |
    | mindspore_train_data_checked_samples_total | counter | | samples |
    | mindspore_train_data_duplicate_samples_total | counter | | samples |
    | mindspore_train_data_empty_samples_total | counter | | samples |
    | mindspore_train_data_out_of_vocab_tokens_total | counter | | tokens |
    | mindspore_train_data_quality_baseline | gauge | quantity | the quantity's unit |
    | mindspore_train_data_quality_low_streak | gauge | quantity | batches |
    | mindspore_train_data_quality_low | gauge | quantity | 1 |
    | mindspore_train_data_listed_batches_total | counter | | batches (with list_batches: actions/low_batches.py) |
    """

    name = "data_quality"

    def __init__(
        self,
        store: MetricStore,
        config: DataQualityConfig,
        mask_column: str,
        ids_column: str,
        batch_list: BatchList | None = None,
    ) -> None:
        self._config = config
        self._mask_column = mask_column
        self._ids_column = ids_column
        self._list = batch_list
        self.needs_signals = batch_list is not None  # what is queued for the list is written on SIGTERM
        self._entropy_family = store.register(catalogue.DATA_LABEL_ENTROPY)
        self._length_family = store.register(catalogue.DATA_SEQUENCE_LENGTH)
        self._lengths_family = store.register(catalogue.DATA_SEQUENCE_LENGTH_DISTRIBUTION)
        self._padding_family = store.register(catalogue.DATA_PADDING_RATIO)
        self._checked_family = store.register(catalogue.DATA_CHECKED_SAMPLES)
        self._duplicates_family = store.register(catalogue.DATA_DUPLICATE_SAMPLES)
        self._empty_family = store.register(catalogue.DATA_EMPTY_SAMPLES)
        self._oov_family = store.register(catalogue.DATA_OUT_OF_VOCAB)
        families = (
            store.register(catalogue.DATA_QUALITY_BASELINE),
            store.register(catalogue.DATA_QUALITY_LOW_STREAK),
            store.register(catalogue.DATA_QUALITY_LOW),
        )
        self._watches = {quantity: _Watch(quantity, config, families) for quantity in catalogue.DATA_QUALITY_QUANTITIES}
        # Series appear with their first measurement (no invented values).
        self._entropy: Series | None = None
        self._length_series: _LengthSeries | None = None
        self._checked: Series | None = None
        self._duplicates: Series | None = None
        self._empty: Series | None = None
        self._oov: Series | None = None
        # The batches of a low streak that has not reached `streak` yet: listed if it does.
        self._pending: deque[dict[str, Any]] = deque(maxlen=max(config.streak - 1, 0))
        self._said: set[str] = set()
        self._cb_params: Any = None
        self._steps_per_epoch = 0
        self._next_step = 0
        self._resolved = False
        self._label_index: int | None = None
        self._token_index: int | None = None
        self._mask_index: int | None = None

    # -- hooks -------------------------------------------------------------------------------------------------
    def on_train_begin(self, cb_params: Any) -> None:
        self._resolved = False  # another dataset may come with this training call
        self._next_step = 0
        self._pending.clear()
        if sink_mode_of(cb_params):
            self._cb_params = None
            self._say(
                "sink",
                "ms_exporter: data_quality measures nothing in dataset sink mode: MindSpore hands the callback no "
                "batch there (train with dataset_sink_mode=False to measure the data)",
            )
            return
        self._cb_params = cb_params
        self._steps_per_epoch = steps_per_epoch_of(cb_params)

    def on_batch(self, step: int, columns: Sequence[Any], names: tuple[str, ...]) -> None:
        if step < self._next_step:
            return
        self._next_step = step + self._config.every_n_steps
        if not self._resolved:
            self._resolve(columns, names)
        measured: dict[str, float] = {}
        samples = 0
        if self._label_index is not None:
            samples = self._measure_labels(columns[self._label_index], measured)
        if self._token_index is not None:
            samples = self._measure_tokens(columns[self._token_index], columns, measured) or samples
        if not samples:
            return
        if self._checked is None:
            self._checked = self._checked_family.series()
        self._checked.value += samples
        low: dict[str, float] = {}
        dropped = False
        for quantity, value in measured.items():
            watch = self._watches[quantity]
            if watch.observe(value):
                low[quantity] = value
                dropped = dropped or watch.dropped
        if self._list is not None:
            self._keep_out(self._list, step, columns, low, dropped)

    def on_train_end(self, step: int, completed: bool) -> None:
        self._cb_params = None
        if self._list is not None:
            self._list.flush()

    def on_signal(self, signal_name: str, step: int) -> None:
        if self._list is not None:
            self._list.flush()

    def close(self) -> None:
        if self._list is not None:
            self._list.flush()

    # -- the quantities ----------------------------------------------------------------------------------------
    def _measure_labels(self, column: Any, measured: dict[str, float]) -> int:
        labels = to_numpy(column)
        if labels is None:
            self._label_index = None
            self._say("labels", "ms_exporter: data_quality.label_column is not a tensor: no label entropy")
            return 0
        ids = class_ids(labels)
        if ids is None:
            self._label_index = None
            self._say(
                "labels",
                f"ms_exporter: data_quality.label_column holds no class labels ({labels.dtype} values that are not "
                "whole numbers): no label entropy",
            )
            return 0
        samples = int(labels.shape[0]) if labels.ndim else 1
        if ids.size:  # a batch whose every label is ignored has no label distribution
            entropy = entropy_bits(ids)
            if self._entropy is None:
                self._entropy = self._entropy_family.series()
            self._entropy.value = entropy
            measured[catalogue.LABEL_ENTROPY] = entropy
        return samples

    def _measure_tokens(self, column: Any, columns: Sequence[Any], measured: dict[str, float]) -> int:
        ids = to_numpy(column)
        if ids is None or ids.ndim != 2 or not np.issubdtype(ids.dtype, np.integer):
            self._say("tokens", "ms_exporter: data_quality.token_column holds no 2-D integer token ids", True)
            return 0
        present = self._present(columns, ids)
        rows = ids.shape[0]
        lengths: np.ndarray | None = None
        if present is not None:
            lengths = np.count_nonzero(present, axis=1)
            self._measure_lengths(lengths, present.size, measured)
        if self._duplicates is None:
            self._duplicates = self._duplicates_family.series()
        self._duplicates.value += _duplicates(ids, lengths)
        vocab = self._config.vocab_size
        if vocab is not None:
            if self._oov is None:
                self._oov = self._oov_family.series()
            if ids.size and (int(ids.min()) < 0 or int(ids.max()) >= vocab):  # two reductions when all are in
                outside = (ids < 0) | (ids >= vocab)
                self._oov.value += int(np.count_nonzero(outside & present if present is not None else outside))
        return int(rows)

    def _present(self, columns: Sequence[Any], ids: np.ndarray) -> np.ndarray | None:
        """Where the batch holds tokens rather than padding: the attention mask's non-zero entries (as the token
        counts), else the ids that are not pad_id; None when the batch does not say."""
        if self._mask_index is not None:
            mask = to_numpy(columns[self._mask_index])
            if mask is not None and mask.shape == ids.shape:
                return np.not_equal(mask, 0)
        if self._config.pad_id is not None:
            return np.not_equal(ids, self._config.pad_id)
        return None

    def _measure_lengths(self, lengths: np.ndarray, positions: int, measured: dict[str, float]) -> None:
        if not lengths.size:
            return
        series = self._length_series
        if series is None:
            series = self._length_series = _LengthSeries(
                self._length_family.series(),
                self._lengths_family.histogram(),
                self._padding_family.series(),
                self._empty_family.series(),
            )
        counts = np.bincount(lengths)  # samples by length
        tokens = int(np.dot(counts, np.arange(counts.size)))
        mean = tokens / lengths.size
        series.mean.value = mean
        for length in np.flatnonzero(counts):  # one observe per distinct length
            series.lengths.observe(float(length), int(counts[length]))
        series.padding.value = 1.0 - tokens / positions
        series.empty.value += int(counts[0])
        measured[catalogue.SEQUENCE_LENGTH] = mean

    # -- the action: the batches of a drop listed ---------------------------------------------------------------
    def _keep_out(
        self, batch_list: BatchList, step: int, columns: Sequence[Any], low: dict[str, float], dropped: bool
    ) -> None:
        """A drop's batches to the list: the pending ones of its streak, then each as it comes; a dip's are let go."""
        if not low or batch_list.full:
            self._pending.clear()
            return
        details = {
            "reason": "data_quality",
            "quantities": {
                quantity: {"value": value, "baseline": self._watches[quantity].baseline}
                for quantity, value in low.items()
            },
        }
        cb_params = self._cb_params
        epoch = epoch_of(cb_params) if cb_params is not None else 0
        per_epoch = self._steps_per_epoch
        position = (step - 1) % per_epoch + 1 if per_epoch > 0 else None
        entry = batch_list.identify(step, epoch, position, columns, details)
        if dropped:
            batch_list.add([*self._pending, entry])
            self._pending.clear()
        else:
            self._pending.append(entry)

    # -- which column is which ---------------------------------------------------------------------------------
    def _resolve(self, columns: Sequence[Any], names: tuple[str, ...]) -> None:
        """The label, token and mask columns of this training call's batches, found once (on its first batch)."""
        self._resolved = True
        config = self._config
        self._label_index = self._index_of("label_column", config.label_column, names, len(columns))
        if config.token_column is not None:
            self._token_index = self._index_of("token_column", config.token_column, names, len(columns))
        else:
            self._token_index = self._find_tokens(columns, names)
        mask = names.index(self._mask_column) if self._mask_column in names else None
        self._mask_index = mask if mask not in (self._token_index, self._label_index) else None
        if self._label_index is None and self._token_index is None:
            self._say(
                "nothing",
                "ms_exporter: data_quality finds nothing to measure in this dataset's batches: no label_column, "
                "and no column of 2-D integer token ids (set data_quality.token_column)",
            )
        elif self._token_index is not None and self._mask_index is None and config.pad_id is None:
            self._say(
                "padding",
                f"ms_exporter: data_quality: the dataset has no '{self._mask_column}' column and no pad_id is set: "
                "sequence lengths, padding and empty samples are not measured (set data_quality.pad_id)",
            )

    def _index_of(self, key: str, given: str | int | None, names: tuple[str, ...], count: int) -> int | None:
        if given is None:
            return None
        if isinstance(given, int):
            if given < count:
                return given
            self._say(key, f"ms_exporter: data_quality.{key} is {given}, but a batch has {count} columns", True)
            return None
        if given in names:
            return names.index(given)
        self._say(
            key,
            f"ms_exporter: data_quality.{key} '{given}' is not a column of the dataset (its columns: "
            f"{list(names) if names else 'not said: give a position instead'})",
            True,
        )
        return None

    def _find_tokens(self, columns: Sequence[Any], names: tuple[str, ...]) -> int | None:
        """input_ids_column where it holds 2-D integers, else the first other column that does (never the labels)."""
        order = list(range(len(columns)))
        if self._ids_column in names:
            first = names.index(self._ids_column)
            order.remove(first)
            order.insert(0, first)
        for index in order:
            if index == self._label_index or len(getattr(columns[index], "shape", ())) != 2:
                continue
            array = to_numpy(columns[index])
            if array is not None and np.issubdtype(array.dtype, np.integer):
                return index
        return None

    def _say(self, topic: str, message: str, warning: bool = False) -> None:
        """Each thing once per process."""
        if topic not in self._said:
            self._said.add(topic)
            logger.log(logging.WARNING if warning else logging.INFO, message)


def _duplicates(ids: np.ndarray, lengths: np.ndarray | None) -> int:
    """Rows of `ids` that repeat an earlier row; empty rows (no tokens) are counted as empty, not as duplicates."""
    if not ids.size:
        return 0
    rows = np.ascontiguousarray(ids)
    # Each row as one opaque value, so that np.unique compares whole rows (a sort of memcmp, no Python per row).
    whole = rows.view(np.dtype((np.void, rows.dtype.itemsize * rows.shape[1]))).reshape(-1)
    if lengths is not None:
        whole = whole[lengths > 0]
    return int(whole.size - np.unique(whole).size)
