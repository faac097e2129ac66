"""`ms-exporter checksums`: the step and the tensor at which a replica group's ranks first held other bits, from
each rank's `/debug/checksums` page (the replica checks' window of per-tensor bit sums; docs/sdc.md).

The pages of one replica group are compared at every step all of them kept, earliest first; the first tensor whose
sums differ is named with its kind (weights, optimizer) and the ranks that differ from the majority of the group
(the rule of MindSporeTrainingSilentDataCorruption and MindSporeTrainingReplicaDivergence). The local gradient
norms the pages carry are compared too: a rank whose norm at a step is not finite or more than `--local-grad-factor`
times the median of the others' is named with the step (docs/sdc.md#local-gradients).
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable, Iterable
from typing import Any

from ms_exporter.core.analysis.replicas import first_disagreement, local_gradient_outliers
from ms_exporter.tools.scrape import Access, FetchError, beside, fetch
from ms_exporter.tools.targets import expand_targets, parse_target_argument

PAGE_PATH = "/debug/checksums"
LOCAL_GRAD_FACTOR = 1000.0  # divergence.local_grad_factor's default
SHOWN = 5  # local gradient outliers listed; the rest counted


def collect(
    targets: Iterable[str], access: Access, scheme: str = "http", fetcher: Callable[[str, Access], str] = fetch
) -> tuple[dict[str, dict[str, dict[str, Any]]], list[str]]:
    """The pages by replica group and rank, and a line for each target that gave none."""
    groups: dict[str, dict[str, dict[str, Any]]] = {}
    problems = []
    for target in expand_targets([parse_target_argument(text, scheme) for text in targets], scheme):
        url = beside(target.url, PAGE_PATH)
        if target.problem is not None:
            problems.append(f"{target.url}: {target.problem}")
            continue
        try:
            page = json.loads(fetcher(url, access))
            rank, group = str(page["rank"]), str(page["replica_group"])
        except FetchError as exc:  # 404: no replica group there, or no step yet
            problems.append(f"{url}: {exc}")
            continue
        except (ValueError, KeyError, TypeError) as exc:
            problems.append(f"{url}: not a replica checks page ({exc})")
            continue
        groups.setdefault(group, {})[rank] = page
    return groups, problems


def verdict(group: str, pages: dict[str, dict[str, Any]], factor: float = LOCAL_GRAD_FACTOR) -> tuple[bool, list[str]]:
    """(whether the group's ranks differ or one's local gradient norm stands out, the lines that say where)."""
    ranks = ", ".join(sorted(pages, key=lambda r: int(r) if r.isdigit() else 1 << 30))
    kept = set.intersection(*({int(row["step"]) for row in page.get("steps", ())} for page in pages.values()))
    shared = f"steps {min(kept)} to {max(kept)} kept by all" if kept else "no step kept by all"
    lines = [f"replica group {group}: ranks {ranks}; {shared}"]
    if len(pages) < 2:
        return False, [*lines, "  one rank: nothing to compare with"]
    found = first_disagreement(pages)
    if found is None:
        lines.append("  equal at every step kept by all")
    else:
        who = ", ".join(found["ranks"])
        lines.append(
            f"  first differs at step {found['step']}: {found['kind']} tensor {found['tensor']} on rank(s) {who}"
        )
    outliers = local_gradient_outliers(pages, factor)
    for outlier in outliers[:SHOWN]:
        lines.append(
            f"  local gradient norm at step {outlier['step']} on rank {outlier['rank']}: {outlier['norm']:.6g} "
            f"(the others' median {outlier['replicas']:.6g})"
        )
    if len(outliers) > SHOWN:
        lines.append(f"  ... and {len(outliers) - SHOWN} more local gradient norm outliers")
    return found is not None or bool(outliers), lines


def run_checksums(args: argparse.Namespace, error: Callable[[str], Any]) -> int:
    """Exit 1 when a replica group's ranks differ at a step they all kept, else 0."""
    if not args.timeout > 0:
        error(f"--timeout must be a number of seconds > 0, not {args.timeout:g}")
    if not args.local_grad_factor >= 2:
        error(f"--local-grad-factor must be a number of at least 2, not {args.local_grad_factor:g}")
    try:
        groups, problems = collect(args.targets, Access(timeout=args.timeout), args.scheme, fetch)
    except ValueError as exc:
        error(str(exc))
        return 2
    for problem in problems:
        print(f"no page: {problem}")
    differ = False
    for group, pages in sorted(groups.items()):
        found, lines = verdict(group, pages, args.local_grad_factor)
        differ |= found
        print("\n".join(lines))
    return 1 if differ else 0
