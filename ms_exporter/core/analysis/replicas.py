"""Which ranks are replicas of each other (this rank's replica group, from MindSpore's parallel context), and which
of a group's ranks disagree.

MindSpore lays ranks out stage by stage: with `pipeline_stages` p of n ranks, ranks s*n/p to (s+1)*n/p - 1 form
stage s. Inside a stage an operator's strategy (dp, mp) spreads a parameter over the device matrix [dp, mp], whose
last dimension varies fastest: ranks k*mp to k*mp + mp - 1 of the stage hold the mp shards of replica k, and ranks
at the same position modulo mp hold the same shard. Those are replicas of each other:

    group = stage * mp + (rank within the stage) mod mp

In `data_parallel` mode every rank holds every parameter: one group. In `stand_alone` mode ranks train apart (no
collective keeps them equal): no group. mp comes from `divergence.model_parallel`, else from the batch dimension of
MindSpore's `dataset_strategy` (mp = stage size / its data-parallel split); where neither says, the group is unknown
and `divergence.replica_group` names it.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Hashable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

K = TypeVar("K", bound=Hashable)
# What the replica checks read and compare apart (features/replica_checks.py): the trained weights and the
# optimizer's own state.
KINDS = ("weights", "optimizer")


@dataclass(frozen=True)
class ParallelLayout:
    """What MindSpore's auto-parallel context says about the job's layout."""

    mode: str  # stand_alone, data_parallel, semi_auto_parallel, auto_parallel, hybrid_parallel
    world_size: int
    stages: int = 1
    data_parallel: int | None = None  # the batch split of dataset_strategy, when it is a tuple of strategies
    full_batch: bool = False  # every rank's dataset yields the whole global batch


def read_layout(world_size: int) -> ParallelLayout:
    """The layout from mindspore.get_auto_parallel_context; stand_alone when it cannot be read."""
    try:
        import mindspore as ms

        mode = str(ms.get_auto_parallel_context("parallel_mode"))
        stages = int(ms.get_auto_parallel_context("pipeline_stages") or 1)
        strategy: Any = ms.get_auto_parallel_context("dataset_strategy")
        full_batch = bool(ms.get_auto_parallel_context("full_batch"))
    except Exception:
        return ParallelLayout("stand_alone", world_size)
    data_parallel = None
    if isinstance(strategy, (tuple, list)) and strategy and isinstance(strategy[0], (tuple, list)) and strategy[0]:
        data_parallel = int(strategy[0][0])  # the first input's batch dimension is split this many ways
    return ParallelLayout(mode, world_size, max(1, stages), data_parallel, full_batch)


def ranks_per_batch(layout: ParallelLayout) -> tuple[int | None, str]:
    """(how many ranks compute the batches this rank's dataset yields, why); None where the context does not say.

    In data parallel each rank computes its own batch alone. In semi-auto and auto parallel the ranks that shard one
    replica (tensor and pipeline parallel) compute one batch together: with `full_batch` every rank reads the whole
    global batch, which all ranks compute; else the batch is split dataset_strategy's data-parallel ways."""
    if layout.world_size <= 1 or layout.mode in ("stand_alone", "data_parallel"):
        return 1, f"{layout.mode}: each rank computes its own batches"
    if layout.full_batch:
        return layout.world_size, f"{layout.mode} with full_batch: all {layout.world_size} ranks compute each batch"
    if layout.data_parallel and layout.world_size % layout.data_parallel == 0:
        share = layout.world_size // layout.data_parallel
        return (
            share,
            f"{layout.mode}, dataset_strategy splits the batch {layout.data_parallel} ways: {share} ranks "
            "compute each batch",
        )
    return None, f"{layout.mode}: MindSpore's context does not say how many ranks share a batch"


def replica_group(rank: int, layout: ParallelLayout, model_parallel: int | None = None) -> tuple[str | None, str]:
    """(this rank's replica group, why); the group is None where the job has no replicas or the layout is unknown."""
    if layout.world_size <= 1:
        return None, "a job of one rank has no replicas"
    if layout.mode == "stand_alone":
        return None, "parallel_mode is stand_alone: the ranks train apart, nothing keeps their weights equal"
    if layout.mode == "data_parallel":
        return "0", "data_parallel: every rank is a replica of every other"
    split = stage_split(layout, model_parallel)
    if isinstance(split, str):
        return None, split
    stage_size, model_parallel = split
    if stage_size == model_parallel:
        return None, "one replica per stage (data-parallel size 1): no other rank holds the same shards"
    stage, within = divmod(rank, stage_size)
    group = stage * model_parallel + within % model_parallel
    return str(group), (
        f"{layout.mode}, {layout.stages} stage(s) of {stage_size} ranks, {model_parallel}-way "
        f"model parallel: group {group} (stage {stage}, shard {within % model_parallel})"
    )


def stage_split(layout: ParallelLayout, model_parallel: int | None = None) -> tuple[int, int] | str:
    """(ranks per pipeline stage, ranks that shard one replica within a stage), or why the layout does not say."""
    if layout.world_size % layout.stages:
        return f"{layout.world_size} ranks do not split into {layout.stages} pipeline stages"
    stage_size = layout.world_size // layout.stages
    if model_parallel is None and layout.data_parallel:
        if stage_size % layout.data_parallel:
            return (
                f"dataset_strategy splits the batch {layout.data_parallel} ways, not a divisor of the "
                f"{stage_size} ranks of a stage"
            )
        model_parallel = stage_size // layout.data_parallel
    if model_parallel is None:
        return (
            f"{layout.mode}: MindSpore's context does not say how many ranks shard one replica; set "
            "divergence.model_parallel (MindSpore Transformers' parallel_config.model_parallel) or "
            "divergence.replica_group"
        )
    if stage_size % model_parallel:
        return f"model_parallel {model_parallel} does not divide the {stage_size} ranks of a stage"
    return stage_size, model_parallel


def parallel_groups(rank: int, layout: ParallelLayout, model_parallel: int | None = None) -> dict[str, str]:
    """The groups of two or more ranks this rank shares work with, as the layout says (kind -> group), named by
    fail-slow as a whole when every rank of one slows (docs/failslow.md#groups):

    - "stage": its pipeline stage, where there are two or more;
    - "replica": the ranks that hold one copy of the model together (its model-parallel shards in every stage),
      numbered by the copy's data-parallel index; where a copy is one rank (data parallel) there is no such group.
      Not divergence's `replica_group`, which gathers the ranks holding the same shard, one from each copy.

    Nothing where the layout is unknown (stand_alone, or no model-parallel size)."""
    if layout.world_size <= 1 or layout.mode == "stand_alone":
        return {}
    if layout.mode == "data_parallel":
        return {}  # one stage, and each rank a copy of its own
    split = stage_split(layout, model_parallel)
    if isinstance(split, str):
        return {}
    stage_size, model_parallel = split
    stage, within = divmod(rank, stage_size)
    groups = {}
    if layout.stages > 1:
        groups["stage"] = str(stage)
    if model_parallel * layout.stages > 1 and stage_size > model_parallel:
        groups["replica"] = str(within // model_parallel)
    return groups


def disagreeing(fingerprints: Mapping[K, tuple[float, float]]) -> set[K]:
    """Of one replica group's ranks (key -> (fingerprint step, fingerprint)), the ones
    MindSporeTrainingReplicaDivergence names (ms_exporter/generate/alerts/job.py writes the same rule in PromQL).

    Ranks are compared only when every one of them reports the same step. Named: a rank whose fingerprint fewer
    ranks share than share the most common one; where no fingerprint is held by more than half of the group and
    they differ (two ranks that disagree), every rank, since none can be told apart as the odd one.
    """
    if len(fingerprints) < 2 or len({step for step, _ in fingerprints.values()}) != 1:
        return set()
    counts = Counter(value for _, value in fingerprints.values())
    most = max(counts.values())
    if len(counts) > 1 and most * 2 <= len(fingerprints):
        return set(fingerprints)
    return {key for key, (_, value) in fingerprints.items() if counts[value] < most}


def first_disagreement(pages: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """Of replicas' /debug/checksums pages (rank -> page), the earliest step all of them kept at which their sums of
    one tensor differ: {"step", "kind", "tensor", "ranks"} (the ranks that `disagreeing` names), None where they agree
    at every step they share."""
    by_step: dict[int, dict[str, dict[str, list[int]]]] = defaultdict(dict)
    for rank, page in pages.items():
        for row in page.get("steps", ()):
            by_step[int(row["step"])][rank] = row
    for step in sorted(s for s, rows in by_step.items() if len(rows) == len(pages)):
        rows = by_step[step]
        for kind in KINDS:
            names = next(iter(pages.values())).get("tensors", {}).get(kind, [])
            for position, name in enumerate(names):
                seen = {rank: (step, int(row[kind][position])) for rank, row in rows.items()}
                odd = disagreeing(seen)
                if odd:
                    return {"step": step, "kind": kind, "tensor": name, "ranks": sorted(odd)}
    return None


def local_gradient_outliers(pages: dict[str, dict[str, Any]], factor: float) -> list[dict[str, Any]]:
    """Of replicas' /debug/checksums pages (rank -> page), each kept step at which one rank's local gradient norm is
    not finite or more than `factor` times the median of the others' at that step: {"step", "rank", "norm",
    "replicas"}, earliest first."""
    norms: dict[int, dict[str, float]] = defaultdict(dict)
    for rank, page in pages.items():
        for row in page.get("steps", ()):
            if row.get("local_grad_norm") is not None:
                norms[int(row["step"])][rank] = float(row["local_grad_norm"])
    found = []
    for step in sorted(norms):
        for rank, norm in sorted(norms[step].items()):
            others = [value for other, value in norms[step].items() if other != rank and math.isfinite(value)]
            if not others:
                continue
            median = statistics.median(others)
            if not math.isfinite(norm) or (median > 0 and norm > factor * median):
                found.append({"step": step, "rank": rank, "norm": norm, "replicas": median})
    return found
