"""The FLOPs model: training FLOPs per token of a described Transformer, and the cited peak FLOPs presets.

docs/mfu.md gives every term and the published formula it follows. In short, per token, forward plus backward
(the backward pass costs twice the forward one), counting matrix multiplies only (2 FLOPs per multiply-add):

    dense     = 3 * (layers * (attention projections + MLP or routed experts) + output layer)
    attention = 3 * layers * 4 * (heads * head_dim) * L   (x 1/2 when causal), per token of a sequence of L tokens

so a batch costs `dense * tokens + attention_coefficient * sum(L**2 over its sequences)`: a packed row of
documents of 128 and 896 tokens costs 128**2 + 896**2 in the attention term, not 1024**2.

Importing this module costs nothing: no MindSpore, no numpy (config validation and the CLI use it).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

FlopsSource = Literal["per_token", "model", "parameters"]
Attention = Literal["causal", "full", "none", "in_per_token"]
# A multiply-add is two FLOPs; the backward pass computes the gradients of inputs and of weights: twice the forward.
FORWARD_AND_BACKWARD = 3


@dataclass(frozen=True)
class Peak:
    """A device's peak dense FLOPs per second at a precision, and where the figure is published."""

    flops: float
    citation: str


# No preset without the vendor's published figure (docs/mfu.md#peak-presets repeats each citation). Dense figures:
# NVIDIA's datasheets list Tensor Core figures "with sparsity", which are twice the dense ones.
PEAK_PRESETS: dict[str, Peak] = {
    "nvidia_a100_bf16": Peak(
        312e12, "NVIDIA A100 Tensor Core GPU datasheet: BFLOAT16 Tensor Core 312 TFLOPS (624 TFLOPS with sparsity)"
    ),
    "nvidia_a100_fp16": Peak(
        312e12, "NVIDIA A100 Tensor Core GPU datasheet: FP16 Tensor Core 312 TFLOPS (624 TFLOPS with sparsity)"
    ),
    "nvidia_h100_sxm_bf16": Peak(
        989.5e12,
        "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM: BFLOAT16 Tensor Core "
        "1,979 TFLOPS shown with sparsity, 1/2 of it without",
    ),
    "nvidia_h100_pcie_bf16": Peak(
        756.5e12,
        "NVIDIA H100 Tensor Core GPU datasheet, H100 PCIe: BFLOAT16 Tensor Core "
        "1,513 TFLOPS shown with sparsity, 1/2 of it without",
    ),
    "ascend_910_fp16": Peak(
        256e12,
        "Huawei, 'Huawei launches Ascend 910, the world's most powerful AI processor' "
        "(press release, 23 August 2019): 256 TeraFLOPS at FP16",
    ),
}


@dataclass(frozen=True)
class ModelShape:
    """What the FLOPs of a decoder (or encoder) Transformer depend on; the keys of monitor_config.flops.model."""

    num_layers: int
    hidden_size: int
    num_heads: int
    ffn_hidden_size: int
    vocab_size: int  # 0: no per-token output layer (a classifier head on a pooled vector costs nothing per token)
    num_kv_heads: int | None = None  # grouped-query attention: fewer key/value heads (default: num_heads)
    head_dim: int | None = None  # default hidden_size / num_heads
    gated_mlp: bool = False  # SwiGLU/GeGLU: three matrices (gate, up, down) instead of two
    causal: bool = True  # each token attends to the tokens before it: half the attention square
    num_experts: int = 0  # MoE: routed experts per layer (0 or 1: a dense MLP)
    moe_top_k: int | None = None  # experts each token is routed to
    moe_ffn_hidden_size: int | None = None  # an expert's FFN size (default ffn_hidden_size)
    shared_experts: int = 0  # experts every token goes through besides the routed ones
    tied_embeddings: bool = False  # the output layer reuses the input table: fewer parameters, the same FLOPs

    @property
    def head_size(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden_size // self.num_heads

    @property
    def query_width(self) -> int:
        return self.num_heads * self.head_size

    @property
    def kv_width(self) -> int:
        return (self.num_kv_heads if self.num_kv_heads is not None else self.num_heads) * self.head_size

    @property
    def moe(self) -> bool:
        return self.num_experts > 1

    def _mlp_matrices(self) -> int:
        return 3 if self.gated_mlp else 2

    def _layer_weights(self) -> tuple[int, int]:
        """Weights of one layer that a token multiplies with, and all of the layer's weights (MoE: every expert)."""
        h = self.hidden_size
        attention = h * self.query_width + 2 * h * self.kv_width + self.query_width * h
        if not self.moe:
            mlp = self._mlp_matrices() * h * self.ffn_hidden_size
            return attention + mlp, attention + mlp
        expert = self._mlp_matrices() * h * (self.moe_ffn_hidden_size or self.ffn_hidden_size)
        router = h * self.num_experts
        active = attention + router + (int(self.moe_top_k or 1) + self.shared_experts) * expert
        return active, attention + router + (self.num_experts + self.shared_experts) * expert

    def matmul_weights(self) -> int:
        """Weights each token is multiplied with (the active ones of an MoE), the output layer included: the N of
        6N. The input embedding is a lookup, not a multiply."""
        return self.num_layers * self._layer_weights()[0] + self.hidden_size * self.vocab_size

    def parameters(self) -> int:
        """All parameters, with RMSNorm-style norms (two per layer and a final one, a weight of hidden_size each)."""
        h = self.hidden_size
        embeddings = h * self.vocab_size * (1 if self.tied_embeddings else 2)
        return self.num_layers * (self._layer_weights()[1] + 2 * h) + embeddings + h


@dataclass(frozen=True)
class FlopsModel:
    """Training FLOPs (forward and backward) of a batch: `dense` per token, plus `attention` times each sequence's
    length squared."""

    dense: float
    attention: float
    source: FlopsSource
    attention_kind: Attention

    def of_batch(self, tokens: float, squares: float) -> float:
        """FLOPs of a batch of `tokens` tokens whose sequences' lengths squared sum to `squares`."""
        return self.dense * tokens + self.attention * squares

    def per_token_at(self, seq_length: int) -> float:
        """FLOPs per token of full sequences of `seq_length` tokens."""
        return self.dense + self.attention * seq_length


def _attention_coefficient(query_width_sum: float, causal: bool) -> float:
    """Per sequence of L tokens: scores (Q K^T) and the weighted sum of values (A V) are each 2 * width * L^2 FLOPs
    forward for every layer; causal attention computes half of the square."""
    return FORWARD_AND_BACKWARD * 4 * query_width_sum * (0.5 if causal else 1.0)


def from_shape(shape: ModelShape) -> FlopsModel:
    return FlopsModel(
        dense=FORWARD_AND_BACKWARD * 2 * shape.matmul_weights(),
        attention=_attention_coefficient(shape.num_layers * shape.query_width, shape.causal),
        source="model",
        attention_kind="causal" if shape.causal else "full",
    )


def from_per_token(per_token: float) -> FlopsModel:
    """A figure the user states: attention is in it, so sequence lengths do not change it."""
    return FlopsModel(dense=per_token, attention=0.0, source="per_token", attention_kind="in_per_token")


def from_parameters(parameters: int, attention_width: int, causal: bool) -> FlopsModel:
    """6N over the trainable parameters, plus the attention term of the attention layers found in the network
    (`attention_width`: their query widths summed; 0 when none was recognised)."""
    return FlopsModel(
        dense=FORWARD_AND_BACKWARD * 2 * parameters,
        attention=_attention_coefficient(attention_width, causal),
        source="parameters",
        attention_kind=("causal" if causal else "full") if attention_width else "none",
    )
