"""What actions.rollback costs (docs/rollback.md): keeping a good state of the demo model every 100 steps, the
per-step bookkeeping (the batch's content hashes and the health score), against the demo model's own step time;
and what keeping and restoring a state costs by its size, as device copies (memory) and on disk: the training
thread's share of a keep (the device copies), the background thread's write of the file, and a restore.

Timed in one process after a few GRAPH-mode steps, so the parameters are the compiled graph's.
"""

from __future__ import annotations

import math
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.report import TARGETS, table, verdict


def _restored(states: Any) -> None:
    """Restore the newest state and read a Parameter back: an assign may return before it is done."""
    states.restore(states.newest)
    states._parameters[-1].asnumpy()


def _median_ms(func: Any, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        began = time.perf_counter()
        func()
        times.append(time.perf_counter() - began)
    return float(np.median(times)) * 1e3


def measure(captures: int, steps: int, sizes_mib: tuple[int, ...], every_n_steps: int = 100) -> dict[str, Any]:
    from ms_exporter.actions.good_state import GoodStates

    model, step_ms, columns = _trained(steps)
    workspace = tempfile.TemporaryDirectory(prefix="ms_exporter_bench_")  # removed when this returns
    scratch = Path(workspace.name)
    states = GoodStates("memory", math.inf, scratch, 1)
    states.bind(model.train_network)
    capture_ms = _median_ms(lambda: states.capture(1), captures)
    restore_ms = _median_ms(lambda: _restored(states), max(5, captures // 10))
    identity_us, health_us = _bookkeeping_us(columns, captures * 20)
    per_step_ms = (identity_us + health_us) / 1e3
    by_size = [_keep_and_restore(size, scratch) for size in sizes_mib]
    states.close()
    return {
        "parameters": int(sum(p.size for p in states._parameters)),
        "tensors": len(states.names),
        "state_mib": states.nbytes / 2**20,
        "capture_ms": capture_ms,
        "restore_ms": restore_ms,
        "identity_us": identity_us,
        "health_us": health_us,
        "step_ms": step_ms,
        "every_n_steps": every_n_steps,
        "batch": [f"{c.dtype}{list(c.shape)}" for c in columns],
        "share": (capture_ms / every_n_steps + per_step_ms) / step_ms,
        "by_size": by_size,
        "n": captures,
    }


def _trained(steps: int) -> tuple[Any, float, list[np.ndarray]]:
    """The demo model after `steps` GRAPH-mode steps: the model, its median step time in ms (the first 10 steps
    left out) and the columns of its first batch."""
    import mindspore as ms
    from mindspore.train import Callback

    from ms_exporter.demo import BATCH, build_model, synthetic_dataset

    ms.set_context(mode=ms.GRAPH_MODE)
    model = build_model(grad_norm=False)
    ends: list[float] = []
    batches: list[list[np.ndarray]] = []

    class StepEnds(Callback):
        def on_train_step_end(self, run_context: Any) -> None:
            cb_params = run_context.original_args()
            cb_params.net_outputs.asnumpy()  # GRAPH mode does not synchronise otherwise
            ends.append(time.perf_counter())
            if not batches:
                batches.append([t.asnumpy() for t in cb_params.train_dataset_element])

    model.train(1, synthetic_dataset(size=(steps + 10) * BATCH), callbacks=[StepEnds()], dataset_sink_mode=False)
    step_ms = float(np.median(np.diff(ends[10:]))) * 1e3
    return model, step_ms, batches[0]


def _bookkeeping_us(columns: list[np.ndarray], repeats: int) -> tuple[float, float]:
    """What a step's bookkeeping costs, in µs: the batch's content hashes, and the health score."""
    from ms_exporter.actions.health import HealthScore
    from ms_exporter.actions.skipped_batches import batch_identity

    health = HealthScore(20, 10.0, 100.0, 0.3)
    identity_us = _median_ms(lambda: batch_identity(1, 1, 1, columns), repeats) * 1e3
    health_us = _median_ms(lambda: health.observe(0.5, 0.5, 1.0, 0.01), repeats) * 1e3
    return identity_us, health_us


def _keep_and_restore(size: int, scratch: Path) -> dict[str, Any]:
    """Keeping and restoring a state of 16 float32 Parameters of `size` MiB in all, in memory and on disk."""
    from mindspore import Parameter, Tensor, nn

    from ms_exporter.actions.good_state import GoodStates

    net = nn.Cell()
    per = size * 2**20 // 16 // 4
    for index in range(16):
        setattr(net, f"p{index}", Parameter(Tensor(np.ones(per, np.float32)), name=f"p{index}"))
    row: dict[str, Any] = {"mib": size}
    for storage in ("memory", "disk"):
        kept = GoodStates(storage, math.inf, scratch / storage, 1)
        kept.bind(net)
        keeps, writes = [], []
        for _ in range(5):  # from the third on, a keep in memory reuses the memory of the state it let go
            state = kept.capture(1)
            keeps.append(state.seconds)
            kept.finished(wait=600)  # the disk state's file, written in the background
            writes.append(state.write_seconds)
        row[f"{storage}_capture_ms"] = float(np.median(keeps)) * 1e3
        if storage == "disk":
            row["disk_write_ms"] = float(np.median(writes)) * 1e3
        row[f"{storage}_restore_ms"] = _median_ms(lambda kept=kept: _restored(kept), 3)
        kept.close()
    return row


def rollback_row(goods: dict[str, Any]) -> str:
    """Rollback's line of the targets table."""
    return (
        f"| rollback: a good state every 100 steps < 2% of step time (demo model, GRAPH) | "
        f"{verdict(goods['share'] * 100, TARGETS['rollback_share'] * 100, '%')}: keeping the state of "
        f"{goods['parameters']:,} values ({goods['tensors']} Parameters, {goods['state_mib']:.1f} MiB: weights, "
        f"Adam's moments and step) as device copies takes {goods['capture_ms']:.2f} ms (median of {goods['n']}), "
        f"spread over {goods['every_n_steps']} steps of a median {goods['step_ms']:.1f} ms, plus "
        f"{goods['identity_us']:.0f} µs a step for the batch's content hashes ({', '.join(goods['batch'])}) and "
        f"{goods['health_us']:.1f} µs for the health score; a restore takes {goods['restore_ms']:.1f} ms "
        f"(docs/rollback.md) |"
    )


def rollback_section(goods: dict[str, Any]) -> list[str]:
    """Keeping and restoring a good state by its size."""
    return [
        "## Rollback: keeping and restoring a good state by its size",
        "",
        "A state of 16 float32 Parameters of the given total size (GRAPH mode), kept and restored by",
        "`ms_exporter/actions/good_state.py` as device copies (memory: a copy of each Parameter on the device",
        "where it lives, here the CPU) and on disk (the same copies, written by a background thread into one",
        "uncompressed .npz under `save_dir/good-states`, to a temporary name then renamed); median of 5 keeps",
        "and 3 restores. A keep is what the training thread spends (the device copies); the disk write is the",
        "background thread's. In memory a keep reuses the memory of the state let go last, once there is one",
        "(from the third keep on here). On an accelerator a device copy runs at the speed of its memory, queued",
        "behind the step: these CPU figures do not carry over (docs/rollback.md says what a keep costs there).",
        "",
        table(
            goods["by_size"],
            [
                ("mib", "state MiB", "d"),
                ("memory_capture_ms", "memory: keep ms", ".1f"),
                ("memory_restore_ms", "memory: restore ms", ".1f"),
                ("disk_capture_ms", "disk: keep ms", ".1f"),
                ("disk_write_ms", "disk: write ms (background)", ".1f"),
                ("disk_restore_ms", "disk: restore ms", ".1f"),
            ],
        ),
        "",
    ]


if __name__ == "__main__":
    import json

    print(json.dumps(measure(20, 60, (16, 64)), indent=1))
