"""The demo job: a small Transformer encoder classifier on synthetic padded token data, with the monitor on."""

from __future__ import annotations

import math
import os
import shutil
import signal
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from ms_exporter.core import catalogue as c

VOCAB = 1000
SEQ_LEN = 32
BATCH = 16


def demo_flops_model(layers: int = 2, d_model: int = 64, heads: int = 4) -> dict[str, Any]:
    """monitor_config.flops.model of build_network's Transformer: an encoder (attention over the whole sequence,
    not causal), a plain MLP of 2 x d_model, and a classifier on the pooled sequence (no output layer per token)."""
    return {
        "num_layers": layers,
        "hidden_size": d_model,
        "num_heads": heads,
        "ffn_hidden_size": 2 * d_model,
        "vocab_size": 0,
        "causal": False,
    }


DEMO_CONFIG: dict[str, Any] = {
    "backend": ["prometheus", "local"],
    "project": "ms-exporter-demo",
    "interval": 5,
    "tags": {"model": "transformer-demo"},
    "grad_norm": {"layers": ["head"], "threshold": 10.0},
    # Where deploy/prometheus/prometheus.yml discovers ranks: docs/getting-started.md's alerting recipe finds it.
    "file_sd_dir": "/tmp/ms-exporter-targets",
    # run_demo adds the peak it measures (a MindSpore matmul on this machine: ms-exporter peak-flops).
    "flops": {"model": demo_flops_model()},
}


class PaddedTokens:
    """Random-access synthetic data: ids padded with 0 after a random length, a mask, and a learnable label.

    The label is 1 when the mean id of the real tokens is above the middle of the vocabulary, so the loss
    really falls as the model learns; `label_noise` of the labels are flipped so that it levels off above zero
    and keeps moving, as a real loss does.
    """

    def __init__(
        self,
        size: int = 4096,
        seq_len: int = SEQ_LEN,
        vocab: int = VOCAB,
        min_len: int = 8,
        seed: int = 0,
        label_noise: float = 0.1,
    ) -> None:
        rng = np.random.default_rng(seed)
        lengths = rng.integers(min_len, seq_len + 1, size=size)
        self.ids = np.zeros((size, seq_len), dtype=np.int32)
        self.mask = np.zeros((size, seq_len), dtype=np.int32)
        for row, length in enumerate(lengths):
            self.ids[row, :length] = rng.integers(1, vocab, size=length)
            self.mask[row, :length] = 1
        real_mean = (self.ids * self.mask).sum(1) / self.mask.sum(1)
        self.labels = (real_mean > vocab / 2).astype(np.int32)
        flip = rng.random(size) < label_noise
        self.labels[flip] = 1 - self.labels[flip]

    def __getitem__(self, index: int) -> tuple[np.ndarray, np.ndarray, np.int32]:
        return self.ids[index], self.mask[index], self.labels[index]

    def __len__(self) -> int:
        return len(self.labels)


def synthetic_dataset(
    size: int = 4096,
    batch: int = BATCH,
    seq_len: int = SEQ_LEN,
    seed: int = 0,
    num_shards: int | None = None,
    shard_id: int | None = None,
) -> Any:
    """A MindSpore dataset with columns input_ids, attention_mask, label (one shard of it in data parallel)."""
    import mindspore.dataset as ds

    source = PaddedTokens(size=size, seq_len=seq_len, seed=seed)
    dataset = ds.GeneratorDataset(
        source, ["input_ids", "attention_mask", "label"], shuffle=False, num_shards=num_shards, shard_id=shard_id
    )
    return dataset.batch(batch, drop_remainder=True)


def build_network(layers: int = 2, d_model: int = 64, heads: int = 4, seq_len: int = SEQ_LEN) -> Any:
    """Transformer encoder classifier with its loss: construct(input_ids, attention_mask, label) -> loss."""
    import mindspore as ms
    from mindspore import nn, ops

    class TokenClassifierWithLoss(nn.Cell):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(VOCAB, d_model)
            self.position = ms.Parameter(
                ms.Tensor(np.random.default_rng(1).normal(0, 0.02, (1, seq_len, d_model)), ms.float32), name="position"
            )
            layer = nn.TransformerEncoderLayer(d_model, heads, d_model * 2, dropout=0.0, batch_first=True)
            self.encoder = nn.TransformerEncoder(layer, layers)
            self.head = nn.Dense(d_model, 2)
            self.loss = nn.SoftmaxCrossEntropyWithLogits(sparse=True, reduction="mean")

        def logits(self, input_ids: Any, attention_mask: Any) -> Any:
            hidden = self.embed(input_ids) + self.position
            hidden = self.encoder(hidden, src_key_padding_mask=attention_mask == 0)
            weights = ops.expand_dims(attention_mask.astype(ms.float32), -1)
            pooled = (hidden * weights).sum(1) / weights.sum(1)
            return self.head(pooled)

        def construct(self, input_ids: Any, attention_mask: Any, label: Any) -> Any:
            return self.loss(self.logits(input_ids, attention_mask), label)

    return TokenClassifierWithLoss()


def _evaluation(network: Any) -> dict[str, Any]:
    """Model's arguments for evaluating the demo network: outputs (loss, logits, label), as Model.fit needs."""
    from mindspore import nn

    class LossLogitsLabel(nn.Cell):
        def __init__(self) -> None:
            super().__init__(auto_prefix=False)
            self.network = network

        def construct(self, input_ids: Any, attention_mask: Any, label: Any) -> Any:
            logits = self.network.logits(input_ids, attention_mask)
            return self.network.loss(logits, label), logits, label

    return {"eval_network": LossLogitsLabel(), "eval_indexes": [0, 1, 2], "metrics": {"accuracy": nn.Accuracy()}}


def build_model(
    learning_rate: Any = None,
    layers: int = 2,
    d_model: int = 64,
    decay_steps: int = 2000,
    grad_norm: bool = True,
    evaluate: bool = False,
) -> Any:
    """A mindspore Model over the demo network with AdamW, a cosine-decaying LR and (by default) the train cell
    that reports gradient norms; with `evaluate`, `Model.fit` reports the validation set's `eval_loss` and
    `accuracy`."""
    from mindspore import nn
    from mindspore.train import Model

    from ms_exporter.cells.train_cells import GradNormTrainOneStepCell

    network = build_network(layers=layers, d_model=d_model)
    if learning_rate is None:
        learning_rate = nn.CosineDecayLR(1e-4, 1e-3, decay_steps)
    optimizer = nn.AdamWeightDecay(network.trainable_params(), learning_rate=learning_rate)
    evaluation = _evaluation(network) if evaluate else {}
    if grad_norm:
        return Model(GradNormTrainOneStepCell(network, optimizer, clip_norm=5.0), **evaluation)
    return Model(network, optimizer=optimizer, **evaluation)


def _stopper(seconds: float) -> Any:
    from mindspore.train import Callback

    class StopAfter(Callback):
        def __init__(self) -> None:
            super().__init__()
            self.started = time.monotonic()

        def on_train_step_end(self, run_context: Any) -> None:
            if time.monotonic() - self.started >= seconds:
                run_context.request_stop()

    return StopAfter()


def _progress(monitor: Any, every_seconds: float = 5.0) -> Any:
    from mindspore.train import Callback

    value = monitor.store.value_of

    class Progress(Callback):
        def __init__(self) -> None:
            super().__init__()
            self.next_print = time.monotonic() + every_seconds

        def on_train_step_end(self, run_context: Any) -> None:
            if time.monotonic() < self.next_print:
                return
            self.next_print = time.monotonic() + every_seconds
            print(
                f"step {int(value(c.GLOBAL_STEP)):>6} | loss {value(c.LOSS):.4f} "
                f"(smoothed {value(c.LOSS_SMOOTHED):.4f}) | lr {value(c.LEARNING_RATE):.2e}"
                f" | grad norm {value(c.GRAD_NORM):.3f} | {value(c.TOKENS_PER_SECOND):,.0f} tokens/s | "
                f"{value(c.SAMPLES_PER_SECOND):,.0f} samples/s{_mfu(value(c.MFU))}",
                flush=True,
            )

    return Progress()


def _mfu(mfu: float) -> str:
    """The progress line's MFU, where a peak is known (a --config without one has none)."""
    return "" if math.isnan(mfu) else f" | MFU {100 * mfu:.1f}%"


def run_demo(
    steps: int,
    seconds: float | None = None,
    port: int | None = None,
    config: str | None = None,
    mode: str = "graph",
    save_dir: str | None = None,
    inject: str | None = None,
    inject_after: float = 60.0,
) -> int:
    """Train the demo model for `steps` steps: one epoch of exactly that many batches, so the monitor's planned
    steps (and the dashboard's ETA) and the LR schedule, which decays over the same steps, follow the real run.
    `seconds` stops it early; `inject` turns the job faulty after `inject_after` healthy seconds
    (`injector`)."""
    import mindspore as ms

    from ms_exporter.config.run_identity import run_id_of
    from ms_exporter.monitor.callback import TrainingMonitor

    ms.set_context(mode=ms.GRAPH_MODE if mode == "graph" else ms.PYNATIVE_MODE)
    ms.set_seed(0)  # the same run every time: a demo that behaves differently on each try confuses
    overrides: dict[str, Any] = {}
    if port is not None:
        overrides["port"] = port
    if save_dir is not None:
        overrides["save_dir"] = save_dir
    peak = None
    if config is None:
        from ms_exporter.tools.peak_flops import measure_matmul_flops

        peak = measure_matmul_flops()
        overrides["flops"] = {**DEMO_CONFIG["flops"], "peak_flops_per_device": peak}
    # Each demo run is a run of its own: the built-in configuration gives it its own run id and folder (file-level
    # settings, so that MS_EXPORTER_SAVE_DIR, MS_EXPORTER_RUN_ID and --save-dir still win); a --config file decides.
    monitor = TrainingMonitor(config if config is not None else {**DEMO_CONFIG, **demo_run()}, **overrides)
    url = monitor.url
    if url:  # first: scripts and tests read the URL from the first line
        print(f"metrics: {url}\nlive page: {url.removesuffix('metrics')}", flush=True)
    if peak is not None:
        print(
            f"peak: {peak / 1e9:,.1f} GFLOP/s, the best rate of a 1024x1024 float32 matmul here (the MFU's "
            "denominator; docs/mfu.md)",
            flush=True,
        )
    if monitor.jsonl_path:
        print(f"JSON Lines: {monitor.jsonl_path} (run {run_id_of(monitor.config)})", flush=True)
    limit = f"{steps} steps" + (f" (at most {seconds:.0f} s)" if seconds else "")
    print(f"training a {mode.upper()}-mode Transformer classifier for {limit} ...", flush=True)
    model = build_model(decay_steps=steps)
    callbacks = [monitor, _progress(monitor)] + ([_stopper(seconds)] if seconds else [])
    if inject is not None:
        callbacks.append(injector(inject, inject_after))
    model.train(1, synthetic_dataset(size=steps * BATCH), callbacks=callbacks, dataset_sink_mode=False)
    done = monitor.store.value_of(c.STEPS)
    total = 0 if math.isnan(done) else int(done)  # NaN: the monitor is off
    print(f"done: {total} steps", flush=True)
    print(_time_spent(monitor), flush=True)
    monitor.close()
    _next_steps(url, monitor.jsonl_path)
    return 0


def _time_spent(monitor: Any) -> str:
    """Where this process's time went, from the monitor's goodput ledger (docs/goodput.md)."""
    spent = {dict(series.labels)["bucket"]: series.value for series in monitor.store.series_of(c.TIME_SECONDS)}
    total = sum(spent.values())
    if not total:
        return "time: no goodput ledger (goodput.enable is false)"
    parts = ", ".join(f"{bucket} {seconds:.1f} s" for bucket, seconds in spent.items() if seconds >= 0.05)
    return f"time: {100 * spent.get(c.PRODUCTIVE, 0.0) / total:.0f}% of {total:.0f} s productive ({parts})"


def demo_run(now: float | None = None) -> dict[str, str]:
    """The run id and save_dir of one demo run: `demo-<UTC time>-<pid>` in ./monitor_output/, so that runs one
    after another neither share a JSON Lines file nor a run id (one run's goodput ledger, one report per run)."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(time.time() if now is None else now))
    run_id = f"demo-{stamp}-{os.getpid()}"
    return {"run_id": run_id, "save_dir": os.path.join("monitor_output", run_id)}


def command_name() -> str:
    """How to spell `ms-exporter` so that the line printed runs as written from here: the script beside this
    Python (a venv's bin/), relative when it is below the working directory (`.venv/bin/ms-exporter` in a
    checkout, whose shell has no venv on PATH: `make` puts it there only for its own commands), else bare where
    PATH finds that same script, else its whole path; `python -m ms_exporter` where there is no script."""
    script = Path(sys.executable).parent / "ms-exporter"
    if not script.is_file():
        return f"{sys.executable} -m ms_exporter"
    try:
        return str(script.absolute().relative_to(Path.cwd()))
    except ValueError:
        pass
    found = shutil.which("ms-exporter")
    if found is not None and Path(found).resolve() == script.resolve() and "MAKELEVEL" not in os.environ:
        return "ms-exporter"
    return str(script.absolute())


def next_steps(url: str | None, jsonl_path: str | None) -> list[str]:
    """What to try next with what the run left behind: commands that run as written from the working directory."""
    command = command_name()
    lines = ["next:"]
    if jsonl_path:
        lines.append(f"  {command} report {jsonl_path} -o report.html   # this run as one HTML page")
    if url:
        endpoint = url.removeprefix("http://").removeprefix("https://").removesuffix("/metrics")
        lines.append(f"  {command} top {endpoint}   # a live table of the ranks (run it beside the next demo)")
    lines.append("  Prometheus, Alertmanager and the dashboard: README.md, 'Alerts and dashboards'")
    return lines


def _next_steps(url: str | None, jsonl_path: str | None) -> None:
    print("\n".join(next_steps(url, jsonl_path)), flush=True)


# -- faults to inject (`ms-exporter demo --inject`): a newcomer sees the alert each causes arrive ---------------------
#
# | fault | what the job does from then on | the alert it leads to (docs/alerts.md) |
# |---|---|---|
# | nan | the head's bias becomes NaN: every loss is NaN | MindSporeTrainingLossNonFinite (critical) |
# | stall | the next step never begins (the process sleeps) | MindSporeTrainingHang (critical; it mutes Stalled) |
# | slow | each step waits 0.25 s first (a starved data loader) | MindSporeTrainingThroughputDrop (warning) |
# | leak | each step keeps 4 MiB more host memory | MindSporeTrainingMemoryGrowth (warning) |
# | crash | the process kills itself with SIGKILL, as the OOM killer would | MindSporeTrainingRankDown (critical) |

FAULTS = ("nan", "stall", "slow", "leak", "crash")
SLOW_SECONDS = 0.25
LEAK_BYTES = 4 * 2**20
STALL_SECONDS = 24 * 3600.0  # longer than anyone watches: the user stops the demo (Ctrl-C)
STALL_STOP = (
    "the job now stands still until you stop it: Ctrl-C here, or `kill {pid}` from another terminal "
    "(MindSporeTrainingHang pages once the hang deadline has passed: at least 2 minutes)"
)


def injector(fault: str, after_seconds: float) -> Any:
    """A MindSpore callback that trains healthily for `after_seconds`, says so once, then does `fault`."""
    from mindspore import Tensor
    from mindspore.train import Callback

    if fault not in FAULTS:
        raise ValueError(f"unknown fault {fault!r}; one of {', '.join(FAULTS)}")

    class Inject(Callback):
        def __init__(self) -> None:
            super().__init__()
            self.start: float | None = None  # the first step's begin: compilation is not part of the healthy start
            self.began = False
            self.kept: list[Any] = []

        def on_train_step_begin(self, run_context: Any) -> None:
            if not self.began:
                if self.start is None:
                    self.start = time.monotonic()
                if time.monotonic() - self.start < after_seconds:
                    return
                self.began = True
                step = run_context.original_args().cur_step_num
                print(f"injecting '{fault}' at step {step} ({after_seconds:.0f} s after the start)", flush=True)
                if fault == "stall":
                    print(STALL_STOP.format(pid=os.getpid()), flush=True)
                if fault == "nan":
                    network = run_context.original_args().train_network
                    bias = next(p for p in network.trainable_params() if p.name.endswith("head.bias"))
                    # set_data reaches a compiled graph too: the next step's loss is NaN, and so are the ones after
                    bias.set_data(Tensor(np.full(bias.shape, np.nan, np.float32)))
                elif fault == "crash":
                    os.kill(os.getpid(), signal.SIGKILL)
            if fault == "stall":
                time.sleep(STALL_SECONDS)
            elif fault == "slow":
                time.sleep(SLOW_SECONDS)
            elif fault == "leak":
                self.kept.append(np.ones(LEAK_BYTES, np.uint8))  # touched, so it is resident

    return Inject()
