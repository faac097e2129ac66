"""make sdc: an injection campaign against the replica checks and the local gradient norms (docs/sdc.md).

Three replicas of the demo Transformer (GradNormTrainOneStepCell, AdamWeightDecay, clipping at 5) train in this one
process on the same batches, as data-parallel replicas hold the same weights; each has the monitor's own readers:
`StepChecks` (every weight's and optimizer state tensor's bit sums, every step) and `LocalGradientCheck` (its local
gradient norm against its own history). Every `--every` steps one bit flips on one replica, drawn at random: a
location (weights, optimizer state, local gradients), a bit class (sign; exponent; the top 8 mantissa bits; the low
mantissa bits, of float32: bit 31, 23-30, 15-22, 0-14) and an element drawn uniformly from all values of that
location, with the drill's own code (`ms_exporter.actions.bit_flips.flip_bit`,
`GradNormTrainOneStepCell.flip_local_gradient`).

- Weights and optimizer state: the flip lands at the end of its step, the three replicas' checks read that step, and
  the flip is detected when the flipped tensor's sum differs on that replica at that step; named when
  `first_disagreement` over the three replicas' pages names that step, kind, tensor and replica. The flip is then
  undone (flipped back), so that training goes on as before.
- Local gradients: the flip lands between the backward pass and the reducer of its step; it is detected when that
  replica's LocalGradientCheck flags that step. It changed the update when the replica's weights after the step
  differ from its twins'. The replica then takes its twins' weights and optimizer state back.
- False positives: steps without an injection at which a replica's sums differ from its twins' or a local gradient
  norm is flagged.

The replicas live in one process: their bits agree by construction between injections, so the false positives
counted here are those of the local gradient check's own-history rule over real training; the cross-process
agreement of three msrun replicas is measured by `make divergence-clean` (docs/divergence.md).
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import math
import random
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.report import write_section

BEGIN, END = "<!-- sdc:begin -->", "<!-- sdc:end -->"
CLASSES = {"sign": (31, 32), "exponent": (23, 31), "top 8 mantissa": (15, 23), "low mantissa": (0, 15)}
LOCATIONS = ("weights", "optimizer", "gradients")
REPLICAS = 3


def replica(seed: int) -> Any:
    import mindspore as ms
    from mindspore import nn

    from ms_exporter.cells.train_cells import GradNormTrainOneStepCell
    from ms_exporter.demo import build_network

    ms.set_seed(seed)
    np.random.seed(seed)
    network = build_network()
    optimizer = nn.AdamWeightDecay(network.trainable_params(), learning_rate=1e-3)
    cell = GradNormTrainOneStepCell(network, optimizer, clip_norm=5.0, every_n_steps=1_000_000)
    cell.set_train()
    return cell


class Replica:
    """One replica and the monitor's readers of it."""

    def __init__(self, seed: int, window: int, factor: float) -> None:
        from ms_exporter.core.cb_params import optimizer_state_of
        from ms_exporter.features.local_gradients import LocalGradientCheck
        from ms_exporter.features.replica_checks import StepChecks

        self.cell = replica(seed)
        weights = list(self.cell.weights)
        self.tensors = {"weights": weights, "optimizer": optimizer_state_of({"train_network": self.cell}, weights)}
        self.checks = StepChecks(self.tensors, 8, window)
        norm = self.cell.measure_local_norms()
        self.local = LocalGradientCheck(lambda: float(norm.asnumpy().reshape(-1)[0]), factor)

    def page(self, rank: int) -> dict[str, Any]:
        page: dict[str, Any] = json.loads(self.checks.page(rank, "0"))
        return page

    def take_state_of(self, twin: Replica) -> None:
        """Its twin's weights and optimizer state, bit for bit."""
        from mindspore import ops

        for kind in ("weights", "optimizer"):
            for mine, theirs in zip(self.tensors[kind], twin.tensors[kind]):
                ops.assign(mine, theirs.value().copy())


def flip_scale(target: Replica, batch: Any, tensor: int, element: int, bit: int) -> float:
    """By how much the flip will multiply the element's magnitude (NaN for an element that is 0): its local
    gradient, computed apart with the same weights and batch (the replica computes the same in its step), before
    and after."""
    import mindspore as ms

    grads = ms.grad(target.cell.network, grad_position=None, weights=target.cell.weights)(*batch)
    value = np.array(grads[tensor].asnumpy(), np.float32).reshape(-1)[element : element + 1].copy()
    before = abs(float(value[0]))
    value.view(np.uint32)[0] ^= np.uint32(1 << bit)
    after = abs(float(value[0]))
    if before == 0:
        return math.nan  # a zero element (a token the batch does not hold): no ratio
    return after / before if math.isfinite(after) else math.inf


def draw(rng: random.Random, location: str, sizes: dict[str, list[int]]) -> tuple[str, int, int, int]:
    """(class, tensor, element, bit): an element uniform over all values of the location, a bit of a random class."""
    kind = "weights" if location == "gradients" else location
    cls = rng.choice(list(CLASSES))
    low, high = CLASSES[cls]
    bit = rng.randrange(low, high)
    index = rng.randrange(sum(sizes[kind]))
    for tensor, size in enumerate(sizes[kind]):
        if index < size:
            return cls, tensor, index, bit
        index -= size
    raise AssertionError("unreachable")


def campaign(steps: int, every: int, seed: int, factor: float) -> dict[str, Any]:
    """`steps` steps of REPLICAS replicas on the same batches, a flip every `every` steps past the local check's
    warm-up, each judged at its step; the steps without one count false positives."""
    import mindspore as ms

    from ms_exporter.demo import synthetic_dataset

    ms.set_context(mode=ms.GRAPH_MODE)
    replicas = [Replica(0, every, factor) for _ in range(REPLICAS)]
    sizes = _float_sizes(replicas[0])
    rng = random.Random(seed)
    batches = list(synthetic_dataset(size=512).create_tuple_iterator())
    results: list[dict[str, Any]] = []
    false_positives = {"checksums": 0, "local_gradients": 0}
    clean_steps = 0
    began = time.perf_counter()
    for step in range(1, steps + 1):
        batch = batches[(step - 1) % len(batches)]
        injection = _draw_injection(rng, step, every, sizes) if step % every == 0 and step > 32 else None
        flagged, rows = _step_replicas(replicas, batch, step, injection)
        if injection is None:
            clean_steps += 1
            _count_false_positives(false_positives, flagged, rows)
            continue
        if injection["location"] == "gradients":
            _judge_gradient_flip(injection, replicas, flagged)
        else:
            _judge_stored_flip(injection, replicas, rows)
        results.append(injection)
        if step % 500 == 0:
            print(f"step {step}: {len(results)} injections, {time.perf_counter() - began:.0f} s", file=sys.stderr)
    return {
        "steps": steps,
        "clean_steps": clean_steps,
        "injections": results,
        "false_positives": false_positives,
        "seconds": time.perf_counter() - began,
        "factor": factor,
    }


def _step_replicas(
    replicas: list[Replica], batch: Any, step: int, injection: dict[str, Any] | None
) -> tuple[list[bool], list[dict[str, Any]]]:
    """One step of every replica with this step's flip, if any, and the monitor's readers after it: which replicas
    the local check flagged, and each replica's newest row of checksums."""
    if injection is not None and injection["location"] == "gradients":
        victim = replicas[injection["replica"]]
        injection["scale"] = flip_scale(victim, batch, injection["tensor"], injection["element"], injection["bit"])
        victim.cell.flip_local_gradient(step, injection["tensor"], injection["element"], injection["bit"])
    flagged_before = [r.local.outliers for r in replicas]
    for r in replicas:
        r.cell(*batch)
    if injection is not None and injection["location"] != "gradients":
        _flip(replicas[injection["replica"]], injection)
    for r in replicas:
        r.checks.read(step, r.local.read(step))
    flagged = [r.local.outliers > before for r, before in zip(replicas, flagged_before)]
    rows = [r.checks._window[-1][1] for r in replicas]  # the campaign reads the rows it judges
    return flagged, rows


def _count_false_positives(false_positives: dict[str, int], flagged: list[bool], rows: list[dict[str, Any]]) -> None:
    """A step without a flip: any replica whose checksums differ from another's, or any local flag, is false."""
    false_positives["checksums"] += any(
        int(np.flatnonzero(rows[i][kind] != rows[0 if i else 1][kind]).size)
        for kind in ("weights", "optimizer")
        for i in range(REPLICAS)
    )
    false_positives["local_gradients"] += any(flagged)


def _float_sizes(replica: Replica) -> dict[str, list[int]]:
    """Each weight's and optimizer state's size, 0 for the tensors that are not floats (an integer step counter's
    bits are not a float's classes): where draw() may land."""
    sizes = {}
    for kind in ("weights", "optimizer"):
        tensors = replica.tensors[kind]
        sizes[kind] = [int(t.size) if "Float" in str(t.dtype) else 0 for t in tensors]
    return sizes


def _draw_injection(rng: random.Random, step: int, every: int, sizes: dict[str, list[int]]) -> dict[str, Any]:
    """This step's flip, as the record campaign returns among its "injections": a key changes type on the way
    ("tensor" turns from an index into a name), so it is a JSON object, not a TypedDict. The locations take turns."""
    location = LOCATIONS[(step // every) % len(LOCATIONS)]
    cls, tensor, element, bit = draw(rng, location, sizes)
    return {
        "step": step,
        "location": location,
        "class": cls,
        "tensor": tensor,
        "element": element,
        "bit": bit,
        "replica": rng.randrange(REPLICAS),
    }


def _flip(target: Replica, injection: dict[str, Any]) -> None:
    """Flip (or flip back) the injection's bit of a weight or optimizer state in place."""
    from ms_exporter.actions.bit_flips import flip_bit
    from ms_exporter.config.sections import BitFlip

    kind = injection["location"]
    flip = BitFlip(
        injection["replica"], injection["step"], kind, injection["tensor"], injection["element"], injection["bit"]
    )
    flip_bit(target.tensors[kind], flip)


def _judge_gradient_flip(injection: dict[str, Any], replicas: list[Replica], flagged: list[bool]) -> None:
    """A local gradient's flip: flagged on its replica (and named: on no other), whether it changed the update
    (the replica's weights differ from a twin's after the step); the replica then takes the twin's state back."""
    who = injection["replica"]
    twin = replicas[(who + 1) % REPLICAS]
    changed = any(
        not np.array_equal(np.asarray(a.asnumpy()), np.asarray(b.asnumpy()))
        for a, b in zip(replicas[who].tensors["weights"], twin.tensors["weights"])
    )
    history = list(replicas[who].local._history)
    median = float(np.median(history)) if history else float("nan")
    injection["ratio"] = replicas[who].local.last / median if median else float("inf")
    injection.update(
        detected=flagged[who],
        named=flagged[who] and not any(f for i, f in enumerate(flagged) if i != who),
        changed_update=changed,
        latency=0 if flagged[who] else None,
    )
    replicas[who].take_state_of(twin)


def _judge_stored_flip(injection: dict[str, Any], replicas: list[Replica], rows: list[dict[str, Any]]) -> None:
    """A weight's or a moment's flip: detected where its tensor's sum differs from every twin's, named where
    first_disagreement names that step, kind, tensor and replica; then flipped back."""
    from ms_exporter.core.analysis.replicas import first_disagreement

    kind, who, step = injection["location"], injection["replica"], injection["step"]
    target = replicas[who]
    mine = rows[who][kind][injection["tensor"]]
    others = [rows[i][kind][injection["tensor"]] for i in range(REPLICAS) if i != who]
    detected = all(mine != other for other in others)
    pages = {str(i): {**r.page(i), "steps": [r.page(i)["steps"][-1]]} for i, r in enumerate(replicas)}
    found = first_disagreement(pages)
    name = target.checks.names[kind][injection["tensor"]]
    named = found == {"step": step, "kind": kind, "tensor": name, "ranks": [str(who)]}
    injection.update(detected=bool(detected), named=named, changed_update=True, latency=0 if detected else None)
    _flip(target, injection)  # undone: training goes on as before
    injection["tensor"] = name


def table(result: dict[str, Any]) -> list[str]:
    by: dict[tuple[str, str], list[dict[str, Any]]] = collections.defaultdict(list)
    for injection in result["injections"]:
        by[(injection["location"], injection["class"])].append(injection)
    lines = [
        "| location | bit class | injections | detected | detected, of those that changed the update | "
        "latency (steps) | rank (and tensor) named |",
        "|---|---|---|---|---|---|---|",
    ]
    for location in LOCATIONS:
        for cls in CLASSES:
            items = by.get((location, cls), [])
            if not items:
                continue
            detected = sum(i["detected"] for i in items)
            changed = [i for i in items if i["changed_update"]]
            caught = sum(i["detected"] for i in changed)
            latency = sorted({i["latency"] for i in items if i["latency"] is not None})
            named = sum(i["named"] for i in items)
            lines.append(
                f"| {location} | {cls} | {len(items)} | {detected} ({100 * detected / len(items):.0f}%) | "
                f"{caught} of {len(changed)} ({100 * caught / len(changed) if changed else 100:.0f}%) | "
                f"{', '.join(map(str, latency)) or '-'} | {named} ({100 * named / len(items):.0f}%) |"
            )
    raised = [
        i for i in result["injections"] if i["location"] == "gradients" and i.get("scale", 0) >= 2.0**32
    ]  # NaN: no
    if raised:
        caught = sum(i["detected"] for i in raised)
        lines.append(
            f"| gradients | exponent, raising the element 2^32-fold or more (bits 28-30 from 0 to 1) | {len(raised)} | "
            f"{caught} ({100 * caught / len(raised):.0f}%) | | 0 | {caught} ({100 * caught / len(raised):.0f}%) |"
        )
    return lines


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grads = [i for i in result["injections"] if i["location"] == "gradients"]
    figure, axis = plt.subplots(figsize=(7, 3.2))
    for detected, label in ((True, "flagged"), (False, "not flagged")):
        points = [i["bit"] for i in grads if i["detected"] == detected]
        axis.hist(points, bins=range(0, 33), alpha=0.6, label=f"local gradients, {label}")
    axis.set_xlabel("bit flipped (float32: 31 sign, 23-30 exponent, 0-22 mantissa)")
    axis.set_ylabel("injections")
    axis.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(path, format="svg", metadata={"Date": None})
    plt.close(figure)


def section(result: dict[str, Any], command: str) -> str:
    injections = result["injections"]
    fp = result["false_positives"]
    return "\n".join(
        [
            BEGIN,
            f"`{command}` on {datetime.date.today().isoformat()}: {result['steps']:,} steps of three replicas "
            f"({len(injections)} injections, {result['clean_steps']:,} clean steps), {result['seconds'] / 60:.0f} "
            f"minutes on this machine, `divergence.local_grad_factor` {result['factor']:g}.",
            "",
            *table(result),
            "",
            f"False positives over the {result['clean_steps']:,} clean steps: {fp['checksums']} steps whose sums "
            f"differed between replicas, {fp['local_gradients']} steps with a local gradient norm flagged.",
            "",
            "![local gradient flips by bit: flagged or not](sdc.svg)",
            END,
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--every", type=int, default=8, help="one injection every this many steps")
    parser.add_argument("--seed", type=int, default=48)
    parser.add_argument("--factor", type=float, default=1000.0, help="divergence.local_grad_factor")
    parser.add_argument("--output", default="docs/sdc.md", help="the page whose measured section is rewritten")
    parser.add_argument("--json", help="also write the raw results here")
    parser.add_argument("--no-page", action="store_true", help="write the raw results only (the suite's short run)")
    args = parser.parse_args(argv)
    result = campaign(args.steps, args.every, args.seed, args.factor)
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    if args.no_page:
        return 0
    command = "make sdc" if args.steps == 10_000 else f"python -m benchmarks.sdc --steps {args.steps}"
    output = Path(args.output)
    write_section(section(result, command), output, BEGIN, END, heading="## Measured: the injection campaign")
    plot(result, output.parent / "sdc.svg")
    print("\n".join(table(result)))
    print(result["false_positives"], result["clean_steps"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
