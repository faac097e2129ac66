"""What a replica fingerprint costs (docs/divergence.md): one CRC-32 over the demo model's trained parameters,
against the demo model's own step time, per `divergence.every_n_steps` (100) steps.

Both are timed in one process after a few GRAPH-mode steps, so the parameters are the compiled graph's.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np


def measure(fingerprints: int, steps: int, every_n_steps: int = 100) -> dict[str, Any]:
    import mindspore as ms
    from mindspore.train import Callback

    from ms_exporter.demo import BATCH, build_model, synthetic_dataset
    from ms_exporter.features.fingerprint import fingerprint

    ms.set_context(mode=ms.GRAPH_MODE)
    model = build_model(grad_norm=False)
    ends: list[float] = []

    class StepEnds(Callback):
        def on_train_step_end(self, run_context: Any) -> None:
            run_context.original_args().net_outputs.asnumpy()  # GRAPH mode does not synchronise otherwise
            ends.append(time.perf_counter())

    model.train(1, synthetic_dataset(size=(steps + 10) * BATCH), callbacks=[StepEnds()], dataset_sink_mode=False)
    step_ms = float(np.median(np.diff(ends[10:]))) * 1e3  # past compilation
    parameters = list(model.train_network.trainable_params())
    times = []
    for _ in range(fingerprints):
        began = time.perf_counter()
        fingerprint(parameters)
        times.append(time.perf_counter() - began)
    fingerprint_ms = float(np.median(times)) * 1e3
    return {
        "parameters": int(sum(int(np.prod(p.shape)) for p in parameters)),
        "tensors": len(parameters),
        "fingerprint_ms": fingerprint_ms,
        "fingerprint_p90_ms": float(np.percentile(times, 90)) * 1e3,
        "step_ms": step_ms,
        "every_n_steps": every_n_steps,
        "share": fingerprint_ms / (every_n_steps * step_ms),
        "n": fingerprints,
    }
