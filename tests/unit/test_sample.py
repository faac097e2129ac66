"""Reading the loss and counting samples/tokens from what MindSpore hands the step hook."""

from __future__ import annotations

import math

import mindspore as ms
import numpy as np
import pytest

from ms_exporter.core.sample import BatchCounter, document_squares, read_loss


@pytest.mark.parametrize(
    ("outputs", "expected"),
    [
        (ms.Tensor(np.float32(0.25)), 0.25),
        (ms.Tensor(np.array([0.5], np.float32)), 0.5),
        ((ms.Tensor(np.float32(1.5)), ms.Tensor(False), ms.Tensor(np.float32(1024.0))), 1.5),
        ([np.float32(2.5), "ignored"], 2.5),
        (np.float64(3.25), 3.25),
        (np.array([1.0, 3.0], np.float32), 2.0),  # a per-sample loss vector: its mean
        (4.0, 4.0),
        (7, 7.0),
        (None, None),
        ((), None),
        ((None, 1.0), None),
        ("not a loss", None),
    ],
)
def test_read_loss_shapes(outputs: object, expected: float | None) -> None:
    assert read_loss(outputs) == expected


def test_read_loss_keeps_float32_value_and_nonfinite() -> None:
    value = np.float32(0.1)
    assert read_loss(ms.Tensor(value)) == float(value)  # exactly the float32 the network produced
    assert math.isnan(read_loss(ms.Tensor(np.float32("nan"))))
    assert read_loss(ms.Tensor(np.float32("inf"))) == math.inf
    assert read_loss(ms.Tensor(np.float16(0.5))) == 0.5


def test_read_loss_bfloat16() -> None:
    tensor = ms.Tensor(np.float32(1.25)).astype(ms.bfloat16)
    assert read_loss(tensor) == 1.25


class FakeDataset:
    def __init__(self, names: list[str], batch: int, shapes: list[list[int]]) -> None:
        self._names, self._batch, self._shapes = names, batch, shapes

    def get_col_names(self) -> list[str]:
        return self._names

    def get_batch_size(self) -> int:
        return self._batch

    def output_shapes(self) -> list[list[int]]:
        return self._shapes

    def output_types(self) -> list[np.dtype]:
        return [np.dtype(np.float32 if name == "features" else np.int32) for name in self._names]


def test_tokens_exclude_padding_with_a_mask_column() -> None:
    counter = BatchCounter("attention_mask", "input_ids")
    counter.bind(FakeDataset(["label", "input_ids", "attention_mask"], 2, [[2], [2, 4], [2, 4]]))
    mask = ms.Tensor(np.array([[1, 1, 1, 0], [1, 0, 0, 0]], np.int32))
    ids = ms.Tensor(np.ones((2, 4), np.int32))
    batch = [ms.Tensor(np.zeros(2, np.int32)), ids, mask]
    assert counter.count(counter.keep(batch), 1) == (2, 4, 0)
    assert counter.count(counter.keep(batch), 3) == (6, 12, 0)


def test_tokens_without_mask_are_batch_times_length() -> None:
    counter = BatchCounter("attention_mask", "input_ids")
    counter.bind(FakeDataset(["input_ids", "label"], 3, [[3, 8], [3]]))
    batch = [ms.Tensor(np.ones((3, 8), np.int32)), ms.Tensor(np.zeros(3, np.int32))]
    assert counter.count(counter.keep(batch), 1) == (3, 24, 0)


def test_image_data_has_no_tokens() -> None:
    counter = BatchCounter("attention_mask", "input_ids")
    counter.bind(FakeDataset(["image", "label"], 4, [[4, 3, 8, 8], [4]]))
    images = ms.Tensor(np.zeros((4, 3, 8, 8), np.float32))
    assert counter.count(counter.keep([images.reshape(4, -1)[:, 0], ms.Tensor(np.zeros(4, np.int32))]), 1) == (4, 0, 0)


def test_sink_mode_uses_dataset_shape_times_sink_size() -> None:
    counter = BatchCounter("attention_mask", "input_ids")
    counter.bind(FakeDataset(["input_ids", "attention_mask", "label"], 16, [[16, 32], [16, 32], [16]]))
    assert counter.keep(None) is None
    assert counter.count(None, 10) == (160, 16 * 32 * 10, 0)


def test_sink_mode_float_features_are_not_tokens() -> None:
    counter = BatchCounter("attention_mask", "input_ids")
    counter.bind(FakeDataset(["features", "label"], 16, [[16, 4], [16]]))
    assert counter.count(None, 2) == (32, 0, 0)


def test_a_batch_that_is_not_tensors_counts_nothing() -> None:
    counter = BatchCounter("attention_mask", "input_ids")
    counter.bind(FakeDataset(["input_ids", "attention_mask"], 2, [[2, 4], [2, 4]]))
    assert counter.count(counter.keep({"input_ids": 1}), 1) == (0, 0, 0)
    assert counter.count(counter.keep(["text", None]), 1) == (0, 0, 0)


# -- the attention term's sum of sequence lengths squared (flops on) -------------------------------------------------


def test_squares_of_a_padded_batch_are_each_samples_real_length_squared() -> None:
    counter = BatchCounter("attention_mask", "input_ids", "actual_seq_len")
    counter.bind(FakeDataset(["input_ids", "attention_mask"], 2, [[2, 4], [2, 4]]))
    mask = ms.Tensor(np.array([[1, 1, 1, 0], [1, 0, 0, 0]], np.int32))
    batch = [ms.Tensor(np.ones((2, 4), np.int32)), mask]
    assert counter.count(counter.keep(batch), 1) == (2, 4, 3 * 3 + 1 * 1)
    assert counter.count(counter.keep(batch), 2) == (4, 8, 2 * 10)


def test_a_packed_row_of_documents_of_128_and_896_tokens_counts_128_squared_plus_896_squared() -> None:
    counter = BatchCounter("attention_mask", "input_ids", "actual_seq_len")
    counter.bind(FakeDataset(["input_ids", "labels", "actual_seq_len"], 1, [[1, 1024], [1, 1024], [1, 4]]))
    # MindSpore Transformers' compressed EOD column: each document's end, padded with the sequence length.
    ends = ms.Tensor(np.array([[128, 1024, 1024, 1024]], np.int32))
    batch = [ms.Tensor(np.ones((1, 1024), np.int32)), ms.Tensor(np.ones((1, 1024), np.int32)), ends]
    samples, tokens, squares = counter.count(counter.keep(batch), 1)
    assert (samples, tokens) == (1, 1024)
    assert squares == 128**2 + 896**2 != 1024**2


def test_packed_rows_offset_across_the_batch_or_starting_again_give_the_same_squares() -> None:
    fresh = np.array([[128, 1024, 1024], [512, 1024, 1024]])
    offset = np.array([[128, 1024, 1024], [1536, 2048, 2048]])  # row 1 offset by row 0's 1024 tokens
    expected = 128**2 + 896**2 + 512**2 + 512**2
    assert document_squares(fresh, 1024) == document_squares(offset, 1024) == expected
    assert document_squares(np.array([[0, 100, 300]]), 300) == 100**2 + 200**2  # a leading 0 adds nothing


def test_without_a_mask_every_sample_is_a_sequence_of_the_full_length() -> None:
    counter = BatchCounter("attention_mask", "input_ids", "actual_seq_len")
    counter.bind(FakeDataset(["input_ids", "label"], 3, [[3, 8], [3]]))
    batch = [ms.Tensor(np.ones((3, 8), np.int32)), ms.Tensor(np.zeros(3, np.int32))]
    assert counter.count(counter.keep(batch), 1) == (3, 24, 3 * 64)
    counter.bind(FakeDataset(["input_ids", "label"], 16, [[16, 32], [16]]))
    assert counter.count(None, 10) == (160, 16 * 32 * 10, 16 * 32 * 32 * 10)  # sink mode: the static shape
