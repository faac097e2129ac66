"""What replica fingerprints and checks cost (docs/divergence.md, docs/sdc.md): one CRC-32 over the demo model's
trained parameters, against the demo model's own step time, per `divergence.every_n_steps` (100) steps; and one
step's replica check (the bit sums of every weight and optimizer state tensor), against one step.

Both are timed in one process after a few GRAPH-mode steps, so the parameters are the compiled graph's. The local
gradient norm the train cell computes every step where replica checks run (and the skipping of outliers, off by
default) is timed as the difference of median steps of the demo's train cell with and without it.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from benchmarks.report import TARGETS, verdict


def measure(fingerprints: int, steps: int, every_n_steps: int = 100) -> dict[str, Any]:
    from benchmarks.opt_in import trained
    from ms_exporter.core.cb_params import optimizer_state_of
    from ms_exporter.features.fingerprint import fingerprint
    from ms_exporter.features.replica_checks import StepChecks

    model, step_ms = trained(2, 64, steps)
    parameters = list(model.train_network.trainable_params())
    times = []
    for _ in range(fingerprints):
        began = time.perf_counter()
        fingerprint(parameters)
        times.append(time.perf_counter() - began)
    fingerprint_ms = float(np.median(times)) * 1e3
    run = {"train_network": model.train_network}
    tensors = {"weights": parameters, "optimizer": optimizer_state_of(run, parameters)}
    checks = StepChecks(tensors, buckets=8, window_steps=64)
    check_times = []
    for step in range(fingerprints):
        began = time.perf_counter()
        checks.read(step)
        check_times.append(time.perf_counter() - began)
    check_ms = float(np.median(check_times)) * 1e3
    local = local_norm_cost(4 if fingerprints < 100 else 30, 20)
    local_share = (local["local_ms"] - local["plain_ms"]) / local["plain_ms"]
    return {
        "parameters": int(sum(int(np.prod(p.shape)) for p in parameters)),
        "tensors": len(parameters),
        "fingerprint_ms": fingerprint_ms,
        "fingerprint_p90_ms": float(np.percentile(times, 90)) * 1e3,
        "step_ms": step_ms,
        "every_n_steps": every_n_steps,
        "share": fingerprint_ms / (every_n_steps * step_ms),
        "n": fingerprints,
        "check_tensors": sum(len(t) for t in tensors.values()),
        "check_values": int(sum(int(np.prod(p.shape)) for t in tensors.values() for p in t)),
        "check_ms": check_ms,
        "check_p90_ms": float(np.percentile(check_times, 90)) * 1e3,
        # A negative difference is the noise between cells (instance_spread), not a saving: it counts as none.
        "check_share": check_ms / step_ms + max(local_share, 0.0),
        "check_sums_share": check_ms / step_ms,
        "local": local,
        "local_share": local_share,
        "skip_share": (local["skip_ms"] - local["plain_ms"]) / local["plain_ms"],
    }


# Each kind of cell twice, in mirrored order of building, all on one network and optimizer: the first cell built runs
# a few percent faster than every later one, and two cells built alike differ by more than the local norm costs, so a
# kind's figure is the mean of its two cells' medians, and a throwaway cell is built first.
_BUILD_ORDER = ("plain", "local", "skip", "skip", "local", "plain")


def local_norm_cost(rounds: int, block: int) -> dict[str, Any]:
    """The demo's train cell (GradNormTrainOneStepCell, clipping at 5) three ways: as it is, measuring the local
    gradient norm every step, and skipping outliers too; each cell runs blocks of `block` steps in turn, `rounds`
    times (the order rotates), so that the machine's drift falls on all alike. Median step times in ms."""
    import mindspore as ms
    from mindspore import nn

    from ms_exporter.cells.train_cells import GradNormTrainOneStepCell
    from ms_exporter.demo import build_network, synthetic_dataset

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    network = build_network()
    optimizer = nn.AdamWeightDecay(network.trainable_params(), learning_rate=1e-3)
    batches = list(synthetic_dataset(size=512).create_tuple_iterator())
    cells = []
    for name in ("first", *_BUILD_ORDER):
        cell = GradNormTrainOneStepCell(network, optimizer, clip_norm=5.0, every_n_steps=1_000_000_000)
        cell.set_train()
        if name == "local":
            cell.measure_local_norms()
        elif name == "skip":
            cell.skip_local_outliers()
        for batch in batches[:5]:
            cell(*batch).asnumpy()  # compiled
        cells.append(cell)
    cells = cells[1:]
    times: list[list[float]] = [[] for _ in cells]
    for turn in range(rounds):
        for index in [*range(turn % len(cells), len(cells)), *range(turn % len(cells))]:
            for step in range(block):
                batch = batches[(turn * block + step) % len(batches)]
                began = time.perf_counter()
                cells[index](*batch).asnumpy()
                times[index].append(time.perf_counter() - began)
    medians: dict[str, list[float]] = {name: [] for name in _BUILD_ORDER}
    for name, values in zip(_BUILD_ORDER, times):
        medians[name].append(float(np.median(values)) * 1e3)
    return {
        "plain_ms": float(np.mean(medians["plain"])),
        "local_ms": float(np.mean(medians["local"])),
        "skip_ms": float(np.mean(medians["skip"])),
        "steps": rounds * block * 2,
        "instances": medians,
        # How far the two cells of one kind lie apart, at most: differences below it are not measured.
        "instance_spread": max(abs(a - b) / ((a + b) / 2) for a, b in medians.values()),
    }


def fingerprint_row(prints: dict[str, Any]) -> str:
    """The fingerprint's line of the targets table."""
    return (
        f"| a replica fingerprint every 100 steps < 0.1% of step time (demo model, GRAPH) | "
        f"{verdict(prints['share'] * 100, TARGETS['fingerprint_share'] * 100, '%')}: a CRC-32 of the "
        f"{prints['parameters']:,} trained parameters ({prints['tensors']} tensors) in "
        f"{prints['fingerprint_ms']:.2f} ms "
        f"(median of {prints['n']}; p90 {prints['fingerprint_p90_ms']:.2f} ms) against {prints['every_n_steps']} "
        f"steps of a median {prints['step_ms']:.1f} ms (docs/divergence.md) |"
    )


def check_row(prints: dict[str, Any]) -> str:
    """The replica checks' line of the targets table."""
    local = prints["local"]
    return (
        f"| replica checks every step < 1% of step time (demo model, GRAPH) | "
        f"{verdict(prints['check_share'] * 100, TARGETS['check_share'] * 100, '%')}: the bit sums of "
        f"{prints['check_values']:,} values ({prints['check_tensors']} tensors: weights and optimizer state) in "
        f"{prints['check_ms']:.3f} ms (median of {prints['n']}; p90 {prints['check_p90_ms']:.3f} ms) against a "
        f"median step of {prints['step_ms']:.1f} ms ({prints['check_sums_share'] * 100:.2f}%), plus the local "
        f"gradient norm in the train cell: median step {local['local_ms']:.2f} ms against {local['plain_ms']:.2f} ms "
        f"without ({prints['local_share'] * 100:+.2f}%, {local['steps']:,} steps each, two cells of each kind in "
        f"turn; two cells of one kind differ by up to {local['instance_spread'] * 100:.1f}%, so a difference "
        f"within that is not measured); skipping outliers "
        f"too (off by default): {local['skip_ms']:.2f} ms ({prints['skip_share'] * 100:+.2f}%) (docs/sdc.md) |"
    )
