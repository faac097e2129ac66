"""Model FLOPs per token and per second, and their share of the device's peak (MFU)."""

from __future__ import annotations

import logging
from typing import Any

from ms_exporter.config import FlopsConfig, MonitorConfig
from ms_exporter.core import catalogue
from ms_exporter.core.analysis.flops import FlopsModel, from_parameters
from ms_exporter.core.analysis.replicas import ranks_per_batch, read_layout
from ms_exporter.core.cb_params import network_of
from ms_exporter.core.device.optimizer_step import find_optimizer
from ms_exporter.core.part import PartContext
from ms_exporter.core.probe import Probe
from ms_exporter.core.rate_window import RateWindow
from ms_exporter.core.registry import ProbeEntry
from ms_exporter.core.sample import StepSample
from ms_exporter.core.store import MetricStore, Series

logger = logging.getLogger("ms_exporter")


class MfuProbe(Probe):
    """FLOPs of each published step from core/analysis/flops.py (its tokens, and the batch's sequence lengths for
    attention), as rates over the same window as ThroughputProbe's, so that FLOPs/s = tokens/s x FLOPs/token (over
    the ranks that compute each batch together, where tensor or pipeline parallelism shares it).

    | name | type | labels | unit |
    |---|---|---|---|
    | mindspore_train_flops_per_token | gauge | | FLOPs/token |
    | mindspore_train_model_flops_per_second | gauge | | FLOPs/s |
    | mindspore_train_mfu | gauge | | ratio (only with a peak) |
    | mindspore_train_peak_flops_per_device | gauge | | FLOPs/s (only with a peak) |
    | mindspore_train_flops_info | gauge | source, attention, peak, ranks_per_batch | 1 |

    The series appear with the first step that has tokens: data without a token column has no model FLOPs here.
    """

    name = "mfu"

    def __init__(self, store: MetricStore, config: FlopsConfig, world_size: int = 1) -> None:
        self._store = store
        self._config = config
        self._world_size = world_size
        self._share = 1  # ranks that compute each batch this rank counts (set at train begin)
        self._stated = config.model_flops()  # None: derived from the network at train begin
        self._model: FlopsModel | None = self._stated
        self._peak = config.peak
        self._window = RateWindow()
        self._tokens = 0
        self._flops = 0.0
        self._per_token: Series | None = None
        self._per_second: Series | None = None
        self._mfu: Series | None = None

    def on_train_begin(self, cb_params: Any) -> None:
        self._window.clear()
        if self._stated is None:
            self._model = _derive(cb_params, self._config.model.causal)
        self._share = self._config.ranks_per_batch or self._layout_share()

    def _layout_share(self) -> int:
        share, why = ranks_per_batch(read_layout(self._world_size))
        if share is None:
            logger.warning(
                "ms_exporter: model FLOPs counted as if this rank computed its batches alone (%s; set "
                "flops.ranks_per_batch, docs/mfu.md)",
                why,
            )
            return 1
        if share > 1:
            logger.info("ms_exporter: a rank's model FLOPs are its batches' over %d (%s)", share, why)
        return share

    def on_step(self, sample: StepSample) -> None:
        model = self._model
        if model is None:
            return
        added = model.of_batch(sample.tokens, sample.squares)
        self._tokens += sample.tokens
        self._flops += added
        elapsed, (tokens, flops) = self._window.advance(
            sample.monotonic, sample.cycle_began, (self._tokens, self._flops), (sample.tokens, added)
        )
        if elapsed <= 0 or tokens <= 0:
            return
        per_token = self._per_token or self._bind(model)
        per_token.value = flops / tokens
        per_second = flops / elapsed / self._share
        if self._per_second is not None:
            self._per_second.value = per_second
        if self._mfu is not None and self._peak:
            self._mfu.value = per_second / self._peak

    def _bind(self, model: FlopsModel) -> Series:
        """The series, once the first FLOPs were counted; the info says where the figure comes from."""
        store = self._store
        peak = self._config.peak_flops_per_device
        store.register(catalogue.FLOPS_INFO).series(
            source=model.source,
            attention=model.attention_kind,
            peak=peak if isinstance(peak, str) else "number" if peak is not None else "none",
            ranks_per_batch=str(self._share),
        ).value = 1
        self._per_token = store.register(catalogue.FLOPS_PER_TOKEN).series()
        self._per_second = store.register(catalogue.MODEL_FLOPS_PER_SECOND).series()
        if self._peak:
            store.register(catalogue.PEAK_FLOPS).series().value = self._peak
            self._mfu = store.register(catalogue.MFU).series()
        return self._per_token


def _derive(cb_params: Any, causal: bool) -> FlopsModel | None:
    """6N from the parameters the optimizer trains (the train cell's own include the optimizer's moments), plus the
    attention of the attention layers found in the network; None without either."""
    optimizer = find_optimizer(cb_params)
    network = network_of(cb_params)
    parameters = getattr(optimizer, "parameters", None)
    if parameters is None and network is not None:
        parameters = network.trainable_params()
    if not parameters:
        return None
    count = sum(int(parameter.size) for parameter in parameters)
    width = attention_width(network) if network is not None else 0
    logger.info(
        "ms_exporter: model FLOPs from %d trainable parameters (6N) and attention layers of total width %d "
        "(no flops.model description; docs/mfu.md)",
        count,
        width,
    )
    return from_parameters(count, width, causal)


def attention_width(network: Any) -> int:
    """The query widths (heads x head size) of the network's attention layers, summed: cells whose class name ends
    in 'Attention' with an embed_dim (MindSpore's nn.MultiheadAttention) or a hidden_size, counted once each
    (an attention layer's own inner attention cells are not counted again)."""
    width = 0
    counted: list[str] = []
    for name, cell in network.cells_and_names():
        if not type(cell).__name__.endswith("Attention") or any(name.startswith(prefix + ".") for prefix in counted):
            continue
        size = getattr(cell, "embed_dim", None) or getattr(cell, "hidden_size", None)
        if isinstance(size, int) and size > 0:
            width += size
            counted.append(name)
    return width


def build(context: PartContext) -> list[Probe]:
    config: MonitorConfig = context.config
    return [MfuProbe(context.store, config.flops, context.rank.world_size)] if config.flops.enable else []


PART = ProbeEntry("mfu", build, (), order=90)
