"""Model FLOPs utilisation of a real CPU training, against a peak measured on this machine."""

from __future__ import annotations

from typing import Any

import mindspore as ms
import numpy as np
import pytest
from mindspore import nn
from mindspore.train import Model

from ms_exporter import TrainingMonitor
from ms_exporter.core.analysis.flops import ModelShape, from_parameters, from_shape
from ms_exporter.demo import PaddedTokens, build_network, demo_flops_model, synthetic_dataset
from ms_exporter.tools.peak_flops import measure_matmul_flops
from tests.support.scrape import Scrape, scrape

pytestmark = pytest.mark.integration

BATCH = 8
SEQ_LEN = 32
EPOCHS = 60  # of one batch each: every step trains the same 8 padded samples, whatever the rate window holds


def train(flops: dict[str, Any]) -> tuple[Scrape, Model]:
    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    network = build_network(layers=2, d_model=64, heads=4)
    model = Model(network, optimizer=nn.Momentum(network.trainable_params(), 0.01, 0.9))
    monitor = TrainingMonitor(port=0, project="mfu", web={"cache_seconds": 0}, flops=flops)
    try:
        model.train(
            EPOCHS,
            synthetic_dataset(size=BATCH, batch=BATCH, seq_len=SEQ_LEN),
            callbacks=[monitor],
            dataset_sink_mode=False,
        )
        monitor.publish()
        return scrape(monitor.url), model
    finally:
        monitor.close()


def batch_lengths() -> np.ndarray:
    """The real (unpadded) length of each of the 8 samples every step trains on."""
    return PaddedTokens(size=BATCH, seq_len=SEQ_LEN).mask.sum(axis=1).astype(np.int64)


def test_mfu_of_a_real_training_against_a_measured_matmul_peak_is_between_0_and_1() -> None:
    peak = measure_matmul_flops()  # the best FLOPs per second of a 1024x1024 float32 matmul here
    described = demo_flops_model(layers=2, d_model=64, heads=4)
    page, _ = train({"model": described, "peak_flops_per_device": peak})
    mfu = page.value("mindspore_train_mfu")
    per_second = page.value("mindspore_train_model_flops_per_second")
    per_token = page.value("mindspore_train_flops_per_token")
    tokens_per_second = page.value("mindspore_train_tokens_per_second")
    assert 0 < mfu < 1, (mfu, per_second, peak)
    # One window, two ways: tokens/s times FLOPs per token is the model FLOPs per second; MFU is its share.
    assert per_second == pytest.approx(tokens_per_second * per_token, rel=1e-9)
    assert mfu == pytest.approx(per_second / peak, rel=1e-9)
    assert page.value("mindspore_train_peak_flops_per_device") == peak
    # FLOPs per token from the description and the samples' real lengths: the attention term sums each sample's
    # length squared (padding is not attended to as work), which is less than the padded 32 squared.
    lengths = batch_lengths()
    model = from_shape(ModelShape(**described))
    expected = model.of_batch(int(lengths.sum()), int(np.dot(lengths, lengths))) / lengths.sum()
    assert per_token == pytest.approx(expected, rel=1e-9)
    assert per_token < model.per_token_at(SEQ_LEN)
    (info,) = page.labels_of("mindspore_train_flops_info")
    assert (info["source"], info["attention"], info["peak"]) == ("model", "full", "number")


def test_without_a_description_flops_per_token_are_6n_of_the_trained_parameters_plus_the_attention_found() -> None:
    page, model = train({})
    trained = sum(int(p.size) for p in model.train_network.optimizer.parameters)
    lengths = batch_lengths()
    # Two nn.MultiheadAttention layers of width 64; causal unless flops.model.causal says otherwise.
    expected = from_parameters(trained, 2 * 64, causal=True)
    assert page.value("mindspore_train_flops_per_token") == pytest.approx(
        expected.of_batch(int(lengths.sum()), int(np.dot(lengths, lengths))) / lengths.sum(), rel=1e-9
    )
    (info,) = page.labels_of("mindspore_train_flops_info")
    assert (info["source"], info["attention"], info["peak"]) == ("parameters", "causal", "none")
    assert page.find("mindspore_train_mfu") == []  # no peak: no MFU
