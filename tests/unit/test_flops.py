"""The FLOPs model against the published formulas, computed by hand for real models, and the MFU probe."""

from __future__ import annotations

from typing import Any

import pytest

from ms_exporter.config import ConfigError, load_config
from ms_exporter.core import catalogue as c
from ms_exporter.core.analysis.flops import PEAK_PRESETS, ModelShape, from_parameters, from_shape
from ms_exporter.core.analysis.replicas import ParallelLayout, ranks_per_batch
from ms_exporter.core.sample import StepSample
from ms_exporter.core.store import MetricStore
from ms_exporter.probes.mfu import MfuProbe, attention_width

WITHIN = 1e-3  # the 0.1%

LLAMA2_7B = ModelShape(
    num_layers=32, hidden_size=4096, num_heads=32, ffn_hidden_size=11008, vocab_size=32000, gated_mlp=True
)
LLAMA2_70B = ModelShape(
    num_layers=80,
    hidden_size=8192,
    num_heads=64,
    num_kv_heads=8,
    ffn_hidden_size=28672,
    vocab_size=32000,
    gated_mlp=True,
)
MIXTRAL_8X7B = ModelShape(
    num_layers=32,
    hidden_size=4096,
    num_heads=32,
    num_kv_heads=8,
    ffn_hidden_size=14336,
    vocab_size=32000,
    gated_mlp=True,
    num_experts=8,
    moe_top_k=2,
)


def test_a_7b_dense_gpt_follows_megatron_lms_formula() -> None:
    """Narayanan et al. 2021, eq. (3): 96 B s l h^2 (1 + s/(6h) + V/(16 l h)) FLOPs per iteration with activation
    recomputation, which adds a fourth forward pass; model FLOPs have three: 72 B s l h^2 (1 + s/(6h) + V/(12 l h)).
    GPT-3 6.7B: l 32, h 4096, s 2048, V 50257, a plain MLP of 4h, full (non-causal) attention as the paper counts."""
    layers, h, s, v = 32, 4096, 2048, 50257
    gpt3 = ModelShape(num_layers=layers, hidden_size=h, num_heads=32, ffn_hidden_size=4 * h, vocab_size=v, causal=False)
    published_per_token = 72 * layers * h**2 * (1 + s / (6 * h) + v / (12 * layers * h))
    assert from_shape(gpt3).per_token_at(s) == pytest.approx(published_per_token, rel=WITHIN)
    # Causal attention computes half of the attention square: 12 l h s -> 6 l h s.
    causal = ModelShape(**{**gpt3.__dict__, "causal": True})
    assert from_shape(causal).per_token_at(s) == pytest.approx(published_per_token - 6 * layers * h * s, rel=WITHIN)


def test_a_gated_mlp_model_follows_palms_6n_plus_attention_with_llama2_7bs_published_parameter_count() -> None:
    """PaLM (Chowdhery et al. 2022, appendix B): 6N + 12 L H Q T per token, N the parameters that multiply (the
    6,738,415,616 of LLaMA-2 7B less its input embedding, a lookup, and its RMSNorm weights); causal: 6 L H Q T."""
    n = 6_738_415_616 - 32000 * 4096 - (32 * 2 * 4096 + 4096)
    layers, heads, head_dim, seq = 32, 32, 128, 4096
    assert LLAMA2_7B.parameters() == 6_738_415_616
    assert from_shape(LLAMA2_7B).per_token_at(seq) == pytest.approx(
        6 * n + 6 * layers * heads * head_dim * seq, rel=WITHIN
    )


def test_grouped_query_attention_counts_only_its_key_value_heads_llama2_70b() -> None:
    """LLaMA-2 70B: 64 query heads, 8 key/value heads; published 68,976,648,192 parameters."""
    n = 68_976_648_192 - 32000 * 8192 - (80 * 2 * 8192 + 8192)
    assert LLAMA2_70B.parameters() == 68_976_648_192
    assert from_shape(LLAMA2_70B).per_token_at(4096) == pytest.approx(6 * n + 6 * 80 * 64 * 128 * 4096, rel=WITHIN)
    # With all 64 heads for keys and values, the same model would multiply 2 x 80 x 8192 x 7168 more weights.
    full = from_shape(ModelShape(**{**LLAMA2_70B.__dict__, "num_kv_heads": None}))
    assert full.dense - from_shape(LLAMA2_70B).dense == 6 * 2 * 80 * 8192 * 7168


def test_an_moe_model_counts_the_experts_a_token_is_routed_to_mixtral_8x7b() -> None:
    """Mixtral 8x7B: 46.7B parameters, 12.9B of them active per token (Jiang et al. 2024): per layer, attention with
    8 key/value heads, a router to 8 experts and 2 gated experts of 14336."""
    h = 4096
    active_per_layer = 2 * h * h + 2 * h * 1024 + h * 8 + 2 * 3 * h * 14336
    n = 32 * active_per_layer + h * 32000
    assert from_shape(MIXTRAL_8X7B).per_token_at(4096) == pytest.approx(6 * n + 6 * 32 * h * 4096, rel=WITHIN)
    assert MIXTRAL_8X7B.parameters() == pytest.approx(46.7e9, rel=WITHIN)
    assert n + h * 32000 == pytest.approx(12.9e9, rel=0.01)  # the published active count, to its 3 digits


def test_a_packed_batch_pays_each_documents_attention_not_the_rows() -> None:
    model = from_shape(LLAMA2_7B)
    packed = model.of_batch(1024, 128**2 + 896**2)
    assert packed == model.dense * 1024 + model.attention * (128**2 + 896**2)
    assert packed < model.of_batch(1024, 1024**2)
    # One full row costs per_token_at(1024) per token.
    assert model.of_batch(1024, 1024**2) / 1024 == pytest.approx(model.per_token_at(1024))


def test_parameters_fallback_is_6n_plus_the_attention_found() -> None:
    assert from_parameters(1000, 0, True).per_token_at(512) == 6000
    with_attention = from_parameters(1000, 64, causal=False)
    assert with_attention.per_token_at(10) == 6000 + 12 * 64 * 10
    assert (with_attention.source, with_attention.attention_kind) == ("parameters", "full")


def test_every_peak_preset_cites_its_source_in_the_docs() -> None:
    from pathlib import Path

    doc = (Path(__file__).parents[2] / "docs" / "mfu.md").read_text()
    for name, peak in PEAK_PRESETS.items():
        assert f"`{name}`" in doc and peak.citation.split(":")[0] in doc, name


def test_config_takes_one_source_of_flops_per_token_and_names_what_is_missing() -> None:
    config = load_config(
        {
            "flops": {
                "model": {
                    "num_layers": 32,
                    "hidden_size": 4096,
                    "num_heads": 32,
                    "ffn_hidden_size": 11008,
                    "vocab_size": 32000,
                    "gated_mlp": True,
                },
                "peak_flops_per_device": "nvidia_a100_bf16",
            }
        }
    )
    assert config.flops.model_flops() == from_shape(LLAMA2_7B)
    assert config.flops.peak == 312e12
    with pytest.raises(ConfigError, match="one way"):
        load_config(
            {
                "flops": {
                    "per_token": 1e9,
                    "model": {
                        **{k: 1 for k in ("num_layers", "hidden_size", "num_heads", "ffn_hidden_size", "vocab_size")}
                    },
                }
            }
        )
    with pytest.raises(ConfigError, match="needs hidden_size, num_heads, ffn_hidden_size, vocab_size"):
        load_config({"flops": {"model": {"num_layers": 2}}})
    with pytest.raises(ConfigError, match="unknown preset.*nvidia_a100_bf16"):
        load_config({"flops": {"peak_flops_per_device": "a100"}})
    with pytest.raises(ConfigError, match="MFU needs peak_flops_per_device"):
        load_config({"flops": {"alert_below": 0.3}})
    # Only `causal` given: no description, but the parameters fallback reads it.
    assert load_config({"flops": {"model": {"causal": False}}}).flops.model_flops() is None


# -- the probe -------------------------------------------------------------------------------------------------


def _sample(t: float, tokens: int, squares: int, duration: float = 0.1) -> StepSample:
    return StepSample(1, 1, 1, 0.5, duration, 0.0, 4, tokens, 1e9 + t, t, squares=squares)


def _probe(flops: dict[str, Any]) -> tuple[MfuProbe, MetricStore]:
    store = MetricStore()
    probe = MfuProbe(store, load_config({"flops": flops}).flops)
    probe.on_train_begin({})
    return probe, store


def test_probe_flops_per_second_is_tokens_per_second_times_flops_per_token_and_mfu_its_share_of_the_peak() -> None:
    probe, store = _probe({"per_token": 1e6, "peak_flops_per_device": 4e9})
    assert store.series_of(c.MFU) == ()  # nothing before the first tokens
    for k in range(1, 6):
        probe.on_step(_sample(0.1 * k, tokens=1000, squares=0))
    # 5 steps of 1000 tokens from t=0 to t=0.5: 10,000 tokens/s at 1e6 FLOPs each.
    assert store.value_of(c.FLOPS_PER_TOKEN) == 1e6
    assert store.value_of(c.MODEL_FLOPS_PER_SECOND) == pytest.approx(1e10)
    assert store.value_of(c.MFU) == pytest.approx(2.5)  # a peak set too low says so: MFU is not clipped
    assert store.value_of(c.PEAK_FLOPS) == 4e9
    info = store.series_of(c.FLOPS_INFO)[0]
    assert dict(info.labels) == {
        "source": "per_token",
        "attention": "in_per_token",
        "peak": "number",
        "ranks_per_batch": "1",
    }


def test_probe_attention_follows_the_batches_real_lengths() -> None:
    model = {
        "num_layers": 2,
        "hidden_size": 64,
        "num_heads": 4,
        "ffn_hidden_size": 128,
        "vocab_size": 0,
        "causal": False,
    }
    probe, store = _probe({"model": model, "peak_flops_per_device": "ascend_910_fp16"})
    expected = from_shape(ModelShape(**model))
    probe.on_step(_sample(0.1, tokens=12, squares=3 * 3 + 9 * 9))
    probe.on_step(_sample(0.2, tokens=8, squares=8 * 8))
    per_token = (expected.of_batch(12, 90) + expected.of_batch(8, 64)) / 20
    assert store.value_of(c.FLOPS_PER_TOKEN) == pytest.approx(per_token)
    assert store.value_of(c.MODEL_FLOPS_PER_SECOND) == pytest.approx(per_token * 20 / 0.2)
    assert store.value_of(c.MFU) == pytest.approx(per_token * 20 / 0.2 / 256e12)
    assert dict(store.series_of(c.FLOPS_INFO)[0].labels)["peak"] == "ascend_910_fp16"


def test_probe_without_a_peak_has_no_mfu_and_data_without_tokens_has_no_flops() -> None:
    probe, store = _probe({"per_token": 10.0})
    probe.on_step(_sample(0.1, tokens=0, squares=0))
    assert store.series_of(c.FLOPS_PER_TOKEN) == ()
    probe.on_step(_sample(0.2, tokens=5, squares=0))
    assert store.value_of(c.MODEL_FLOPS_PER_SECOND) > 0
    assert store.series_of(c.MFU) == () and store.series_of(c.PEAK_FLOPS) == ()


def test_probe_derives_6n_and_the_attention_layers_from_a_real_network() -> None:
    from ms_exporter.demo import build_model

    model = build_model()
    network = model.train_network
    optimizer = network.optimizer
    trained = sum(int(p.size) for p in optimizer.parameters)
    # The train cell's own trainable parameters include the optimizer's moments: not the model's N.
    assert sum(int(p.size) for p in network.trainable_params()) > 2 * trained
    assert attention_width(network) == 2 * 64  # two nn.MultiheadAttention layers of embed_dim 64
    probe, store = _probe({"model": {"causal": False}})
    probe.on_train_begin({"train_network": network, "optimizer": optimizer})
    probe.on_step(_sample(0.1, tokens=10, squares=100))
    assert store.value_of(c.FLOPS_PER_TOKEN) == pytest.approx(6 * trained + 12 * 128 * 10)
    assert dict(store.series_of(c.FLOPS_INFO)[0].labels)["source"] == "parameters"


def test_ranks_that_share_a_batch_follow_mindsporess_parallel_context() -> None:
    assert ranks_per_batch(ParallelLayout("data_parallel", 8))[0] == 1
    assert ranks_per_batch(ParallelLayout("stand_alone", 1))[0] == 1
    # full_batch: every rank reads the global batch, which all 8 compute together
    assert ranks_per_batch(ParallelLayout("semi_auto_parallel", 8, stages=2, full_batch=True))[0] == 8
    # the batch split 2 ways (data parallel 2): 4 ranks (tensor x pipeline) compute each half
    assert ranks_per_batch(ParallelLayout("semi_auto_parallel", 8, data_parallel=2))[0] == 4
    share, why = ranks_per_batch(ParallelLayout("auto_parallel", 8))
    assert share is None and "does not say" in why


def test_a_rank_that_shares_its_batches_counts_its_share_of_their_flops() -> None:
    probe, store = _probe({"per_token": 1e6, "peak_flops_per_device": 1e9, "ranks_per_batch": 4})
    probe.on_step(_sample(0.1, tokens=1000, squares=0))
    assert store.value_of(c.FLOPS_PER_TOKEN) == 1e6  # the model's, per token
    assert store.value_of(c.MODEL_FLOPS_PER_SECOND) == pytest.approx(1e6 * 1000 / 0.1 / 4)
    assert store.value_of(c.MFU) == pytest.approx(2.5)
    assert dict(store.series_of(c.FLOPS_INFO)[0].labels)["ranks_per_batch"] == "4"


def test_check_config_prints_what_a_description_amounts_to(tmp_path: Any, capsys: pytest.CaptureFixture[str]) -> None:
    from ms_exporter import cli

    path = tmp_path / "llama.yaml"
    path.write_text(
        "monitor_config:\n  flops:\n    model: {num_layers: 32, hidden_size: 4096, num_heads: 32, "
        "ffn_hidden_size: 11008, vocab_size: 32000, gated_mlp: true, seq_length: 4096}\n"
    )
    assert cli.main(["check-config", str(path)]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    per_token = from_shape(LLAMA2_7B).per_token_at(4096)
    assert last == (
        f"# flops.model: 6,738,415,616 parameters, 6,607,077,376 of them multiplied per token; "
        f"{per_token:.4g} training FLOPs per token of a full 4096-token sequence"
    )
