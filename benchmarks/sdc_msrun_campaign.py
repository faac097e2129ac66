"""make sdc's injection campaign on three msrun processes (docs/sdc.md): the drills' bit flips
(`divergence.inject_flips`) in real 3-rank data-parallel jobs of examples/distributed_train.py, judged from the ranks'
own /debug/checksums pages, as an operator's `ms-exporter checksums` reads them.

Each job flips one bit every `--every` steps from step WARMUP on, on one rank drawn at random: the jobs take turns
between stored tensors (weights and optimizer state in turn) and local gradients (JOB_LOCATIONS), a bit class in turn
(benchmarks/sdc.py's CLASSES), and an element drawn uniformly from the location's float values. A flip of a weight or
a moment is undone one step later (the same bit flipped again) and touches a parameter no earlier flip of its job
touched (its weight and both moments), so that each flip's disagreement between replicas is new: a corrupted weight
keeps its rank's copy apart from then on (the next update lands on other bits), and a corrupted moment moves its
weight apart at the next update. The jobs run with `skip_local_grad_outliers`, so that a flip that makes a local
gradient enormous is applied nowhere and training goes on.

- A flip of a weight or a moment is detected at the first step, from its own on, at which the flipped tensor's sums
  differ between the three pages (`replicas.disagreeing`, the rule the alert and `first_disagreement` apply); named
  when that names the flipped rank alone, in that tensor.
- A flip of a local gradient is detected when `replicas.local_gradient_outliers` (the cross-replica rule of
  `ms-exporter checksums`) names its rank at its step: the norm names the rank, not the tensor.
- False positives: at the steps that are neither a flip's nor the one after it, a tensor whose sums newly differ
  (apart from the parameters already flipped) or a local gradient norm named.
"""

from __future__ import annotations

import argparse
import datetime
import json
import random
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

from benchmarks.report import write_section
from benchmarks.sdc import CLASSES, LOCATIONS
from tests.support.distributed import msrun_command, msrun_environment
from tests.support.waiting import free_port

WORKERS = 3
WARMUP = 40  # steps before the first flip: compilation, and the local norms' 16 steps of history
STEPS_PER_EPOCH = 21  # examples/distributed_train.py's shard of 1,024 samples on three ranks
FACTOR = 1000.0  # divergence.local_grad_factor's default
LINGER = 30  # seconds each rank serves its page after training
BEGIN, END = "<!-- sdc-msrun-campaign:begin -->", "<!-- sdc-msrun-campaign:end -->"


def float_tensors() -> dict[str, dict[str, int]]:
    """kind -> {name: size} of the demo's float weights and optimizer state, in the order the monitor lists them."""
    from ms_exporter.core.cb_params import optimizer_state_of
    from ms_exporter.demo import build_model

    cell = build_model()._train_network
    weights = list(cell.weights)
    state = optimizer_state_of({"train_network": cell}, weights)
    return {
        kind: {p.name: int(p.size) for p in tensors if "Float" in str(p.dtype)}
        for kind, tensors in (("weights", weights), ("optimizer", state))
    }


def parameter_of(name: str) -> str:
    """The trained parameter a weight or a moment belongs to (`adam_m.head.weight` -> `head.weight`)."""
    return name.split(".", 1)[1] if name.startswith(("adam_m.", "adam_v.")) else name


def plan(
    rng: random.Random, sizes: dict[str, dict[str, int]], locations: tuple[str, ...], flips: int, every: int
) -> list[dict[str, Any]]:
    """One job's flips: `flips` of them every `every` steps from WARMUP, its locations and the bit classes in turn."""
    touched: set[str] = set()
    injections = []
    for index in range(flips):
        location = locations[index % len(locations)]
        kind = "weights" if location == "gradients" else location
        candidates = {
            name: size
            for name, size in sizes[kind].items()
            if location == "gradients" or parameter_of(name) not in touched
        }
        if not candidates:
            break  # every parameter flipped once in this job
        name = _uniform_element_tensor(rng, candidates)
        if location != "gradients":
            touched.add(parameter_of(name))
        cls = list(CLASSES)[(index // len(locations)) % len(CLASSES)]
        injections.append(
            {
                "step": WARMUP + index * every,
                "location": location,
                "class": cls,
                "tensor": name,
                "element": rng.randrange(candidates[name]),
                "bit": rng.randrange(*CLASSES[cls]),
                "rank": rng.randrange(WORKERS),
            }
        )
    return injections


def _uniform_element_tensor(rng: random.Random, sizes: dict[str, int]) -> str:
    """A tensor drawn with the chance of its share of the values: an element drawn uniformly lands in it."""
    return rng.choices(list(sizes), weights=list(sizes.values()))[0]


def drill(injections: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """divergence.inject_flips for the job: each flip, and for a weight or a moment the same flip a step later."""
    flips = []
    for injection in injections:
        flip = {key: injection[key] for key in ("rank", "step", "tensor", "element", "bit")}
        flip["kind"] = injection["location"]
        flips.append(flip)
        if injection["location"] != "gradients":
            flips.append({**flip, "step": injection["step"] + 1})
    return flips


def run_job(injections: list[dict[str, Any]], steps: int, scratch: Path) -> dict[int, dict[str, Any]]:
    """Trains one msrun job through `steps` steps with the job's flips; each rank's /debug/checksums page, by rank."""
    divergence = {
        "allow_injection": True,
        "skip_local_grad_outliers": True,
        "window_steps": steps + 100,
        "inject_flips": drill(injections),
    }
    base, master = free_port(WORKERS), free_port()
    env = msrun_environment(MS_EXPORTER_DIVERGENCE=json.dumps(divergence))
    epochs = -(-steps // STEPS_PER_EPOCH)
    log_dir = scratch / f"log-{time.monotonic_ns()}"
    arguments = ("--port", str(base), "--epochs", str(epochs), "--linger", str(LINGER))
    job = subprocess.Popen(
        msrun_command(env, WORKERS, master, log_dir, *arguments),
        env=env,
        cwd=scratch,  # the ranks' save_dir (monitor_output) is relative to it
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        return _pages_once_trained(base, epochs * STEPS_PER_EPOCH, job, log_dir)
    finally:
        try:
            job.wait(timeout=LINGER + 120)
        except subprocess.TimeoutExpired:
            job.kill()
            job.wait()


def _pages_once_trained(base: int, steps: int, job: subprocess.Popen[bytes], log_dir: Path) -> dict[int, Any]:
    """Every rank's page, read once every rank has trained `steps` steps (it lingers, serving, after that)."""
    deadline = time.monotonic() + 1800
    while time.monotonic() < deadline and job.poll() is None:
        try:
            trained = min(_steps_trained(base + rank) for rank in range(WORKERS))
        except OSError:
            trained = 0
        if trained >= steps:
            return {rank: _page(base + rank) for rank in range(WORKERS)}
        time.sleep(2)
    raise RuntimeError(f"the job did not train {steps} steps on every rank: see {log_dir}")


def _steps_trained(port: int) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        text = response.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "mindspore_train_steps_total":
                return sample.value
    return 0.0


def _page(port: int) -> Any:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/debug/checksums", timeout=60) as response:
        return json.loads(response.read())


def judge(injections: list[dict[str, Any]], pages: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Each injection with "detected", "latency" and "named"; the clean steps and the false positives among them."""
    from ms_exporter.core.analysis.replicas import local_gradient_outliers

    rows = {rank: {row["step"]: row for row in page["steps"]} for rank, page in pages.items()}
    names = pages[0]["tensors"]
    by_name = {str(rank): page for rank, page in pages.items()}
    outliers = {(o["step"], int(o["rank"])) for o in local_gradient_outliers(by_name, FACTOR)}
    judged = []
    for injection in injections:
        if injection["location"] == "gradients":
            found = (injection["step"], injection["rank"]) in outliers
            judged.append({**injection, "detected": found, "latency": 0 if found else None, "named": found})
        else:
            judged.append({**injection, **_judge_stored(injection, rows, names)})
    return {"injections": judged, **_false_positives(injections, rows, names, outliers)}


def _judge_stored(injection: dict[str, Any], rows: dict[int, Any], names: dict[str, list[str]]) -> dict[str, Any]:
    """A weight's or a moment's flip: the first step from its own at which its tensor's sums differ, and whom that
    names."""
    from ms_exporter.core.analysis.replicas import disagreeing

    kind, position = injection["location"], names[injection["location"]].index(injection["tensor"])
    for step in range(injection["step"], injection["step"] + 3):
        if not all(step in by_step for by_step in rows.values()):
            break
        odd = disagreeing({rank: (step, by_step[step][kind][position]) for rank, by_step in rows.items()})
        if odd:
            return {"detected": True, "latency": step - injection["step"], "named": odd == {injection["rank"]}}
    return {"detected": False, "latency": None, "named": False}


def _false_positives(
    injections: list[dict[str, Any]], rows: dict[int, Any], names: dict[str, list[str]], outliers: set[Any]
) -> dict[str, Any]:
    """The steps from WARMUP that are neither a flip's nor the one after it: how many, and at how many of them a
    tensor of a parameter not flipped so far began to differ, or a local gradient norm was named."""
    from ms_exporter.core.analysis.replicas import disagreeing

    near = {injection["step"] + offset for injection in injections for offset in (0, 1)}
    flipped_from = {parameter_of(i["tensor"]): i["step"] for i in injections if i["location"] != "gradients"}
    shared = sorted(set.intersection(*(set(by_step) for by_step in rows.values())))
    clean = [step for step in shared if step >= WARMUP and step not in near]
    checksums = 0
    for step in clean:
        for kind, listed in names.items():
            for position, name in enumerate(listed):
                if flipped_from.get(parameter_of(name), step + 1) <= step:
                    continue
                if disagreeing({rank: (step, by_step[step][kind][position]) for rank, by_step in rows.items()}):
                    checksums += 1
                    break
    local = sum(1 for step, _ in outliers if step in clean)
    return {"clean_steps": len(clean), "false_positives": {"checksums": checksums, "local_gradients": local}}


# A job flips stored tensors or local gradients, not both: a flipped moment can leave its rank's weight enormous or
# NaN (a negative second moment's square root) for good, and every later step of that rank is then an outlier, its
# step skipped on every replica: the corruption the check is there to stop, not a false positive, but no ground for
# judging a later gradient's flip either.
JOB_LOCATIONS = (("weights", "optimizer"), ("gradients",))


def campaign(jobs: int, flips: int, every: int, seed: int, scratch: Path) -> dict[str, Any]:
    """`jobs` jobs of up to `flips` flips each, stored tensors and local gradients in turn; the judged injections
    added up, and the false positives: of the checksums over every job's clean steps, of the local gradient norms
    over the gradient jobs' (a stored flip can corrupt its rank for good, JOB_LOCATIONS)."""
    rng = random.Random(seed)
    sizes = float_tensors()
    result: dict[str, Any] = {"injections": [], "jobs": jobs, "clean_steps": {}, "false_positives": {}}
    for job in range(jobs):
        locations = JOB_LOCATIONS[job % len(JOB_LOCATIONS)]
        injections = plan(rng, sizes, locations, flips, every)
        steps = injections[-1]["step"] + 2 * every
        judged = judge(injections, run_job(injections, steps, scratch))
        result["injections"] += [{**i, "job": job} for i in judged["injections"]]
        kinds = ("checksums", "local_gradients") if locations == ("gradients",) else ("checksums",)
        for kind in kinds:
            result["clean_steps"][kind] = result["clean_steps"].get(kind, 0) + judged["clean_steps"]
            result["false_positives"][kind] = result["false_positives"].get(kind, 0) + judged["false_positives"][kind]
        print(f"job {job}: {len(injections)} flips of {'/'.join(locations)} over {steps} steps", file=sys.stderr)
    return result


def table(result: dict[str, Any]) -> list[str]:
    """A row per location and bit class: injections, detected, latency, named."""
    lines = [
        "| location | bit class | injections | detected | latency (steps) | rank (and tensor) named |",
        "|---|---|---|---|---|---|",
    ]
    for location in LOCATIONS:
        for cls in CLASSES:
            chosen = [i for i in result["injections"] if i["location"] == location and i["class"] == cls]
            if not chosen:
                continue
            found = [i for i in chosen if i["detected"]]
            latency = max((i["latency"] for i in found), default=None)
            named = sum(1 for i in chosen if i["named"])
            lines.append(
                f"| {location} | {cls} | {len(chosen)} | {len(found)} ({len(found) / len(chosen):.0%}) | "
                f"{'-' if latency is None else latency} | {named} ({named / len(chosen):.0%}) |"
            )
    return lines


def section(result: dict[str, Any], command: str) -> str:
    fp, clean = result["false_positives"], result["clean_steps"]
    return "\n".join(
        [
            BEGIN,
            f"`{command}` on {datetime.date.today().isoformat()}: {result['jobs']} msrun jobs of three ranks, "
            f"{len(result['injections'])} flips. A local gradient's flip is named by its rank (the norm does not "
            "name a tensor).",
            "",
            *table(result),
            "",
            f"False positives: {fp.get('checksums', 0)} steps at which a tensor's sums began to differ, over the "
            f"{clean.get('checksums', 0):,} clean steps of the jobs; {fp.get('local_gradients', 0)} local gradient "
            f"norms named, over the {clean.get('local_gradients', 0):,} clean steps of the jobs that flip local "
            "gradients (in the others a flipped moment can leave its rank's weights non-finite for good, and every "
            "later step of that rank is an outlier that every replica skips).",
            END,
        ]
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, default=4)
    parser.add_argument(
        "--flips", type=int, default=28, help="flips a job (at most one a parameter in a job of stored flips)"
    )
    parser.add_argument("--every", type=int, default=6, help="steps between two flips")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--output", default="docs/sdc.md")
    parser.add_argument("--json", help="also write the judged injections here")
    parser.add_argument("--no-page", action="store_true", help="leave docs/sdc.md as it is")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="ms_exporter_sdc_campaign_") as scratch:
        result = campaign(args.jobs, args.flips, args.every, args.seed, Path(scratch))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
    command = f"python -m benchmarks.sdc_msrun_campaign --jobs {args.jobs} --flips {args.flips} --every {args.every}"
    text = section(result, command)
    if not args.no_page:
        write_section(text, Path(args.output), BEGIN, END, heading="### The campaign on three msrun processes")
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
