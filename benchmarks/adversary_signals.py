"""Adversary cases for signals and forks: a script's own SIGTERM handler beside the monitor's, SIGTERM twice during
its checkpoint save, two monitors with the training stuck in native code, and forked children that exit.

Each case trains the demo Transformer for real in a child process (`python -m benchmarks.adversary_signals SCENARIO
SCRATCH [ARG]`), which says on stdout how far it got ("ready", "saving", "stuck", ...) and, where the case needs
them, writes its observations to `SCRATCH/facts.json`; `run` sends the signals and reads the files it left.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.adversary import Case

ROOT = Path(__file__).resolve().parents[1]
SAVE_SECONDS = 4.0  # how long the preemption handler takes to write its checkpoint
READY_STEP = 10  # the step after which a child says "ready" for its signal
_STARTUP_SECONDS = 150.0  # MindSpore's import and the first graph compilation, on a loaded machine
_END_SECONDS = 90.0  # the longest a signalled child may take to end before it counts as not ending
_STUCK_SECONDS = 4.0  # a data wait this long after batches that were ready: the main thread waits in native code


# -- the children: real trainings ---------------------------------------------------------------------------------


def _monitor_config(scratch: Path, name: str) -> dict[str, Any]:
    # An hour between flushes: what the JSON Lines file holds after a signal, the signal's saves wrote.
    return {
        "backend": ["prometheus", "local"],
        "port": 0,
        "interval": 3600,
        "project": name,
        "save_dir": str(scratch / name),
        "file_sd_dir": str(scratch / "sd"),
    }


def _model() -> Any:
    import mindspore as ms
    from mindspore import nn
    from mindspore.train import Model

    from ms_exporter.demo import build_network

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    network = build_network(layers=1, d_model=32, heads=2)
    return Model(network, optimizer=nn.Momentum(network.trainable_params(), 0.01, 0.9))


def _pace(seconds: float) -> Any:
    """A callback that makes each step last at least `seconds` and says "ready" after READY_STEP."""
    from mindspore.train import Callback

    class Pace(Callback):
        def on_train_step_end(self, run_context: Any) -> None:
            if run_context.original_args().cur_step_num == READY_STEP:
                print("ready", flush=True)
            time.sleep(seconds)

    return Pace()


def _preemption(path: Path) -> Any:
    """A preemption handler as jobs write them: installed at train begin (as MindSpore's OnRequestExit is), it writes
    a checkpoint over SAVE_SECONDS and exits 0; a second SIGTERM during the save leaves the save to finish."""
    import mindspore as ms
    from mindspore.train import Callback

    class Preemption(Callback):
        def __init__(self) -> None:
            super().__init__()
            self.saving = False
            self.network: Any = None

        def on_train_begin(self, run_context: Any) -> None:
            self.network = run_context.original_args().train_network
            signal.signal(signal.SIGTERM, self.handle)

        def handle(self, signum: int, frame: Any) -> None:
            if self.saving:
                return  # the save under way goes on
            self.saving = True
            print("saving", flush=True)
            whole = path.parent / "whole.ckpt"  # save_checkpoint names its file *.ckpt
            ms.save_checkpoint(self.network, str(whole))
            data = whole.read_bytes()
            whole.unlink()
            path.with_suffix(".sha256").write_text(hashlib.sha256(data).hexdigest())
            partial = path.with_suffix(".partial")
            with partial.open("wb") as out:
                pieces = 40
                size = -(-len(data) // pieces)
                for piece in range(pieces):
                    out.write(data[piece * size : (piece + 1) * size])
                    out.flush()
                    time.sleep(SAVE_SECONDS / pieces)
            os.replace(partial, path)
            print("saved", flush=True)
            sys.exit(0)

    return Preemption()


def _child_preempt(scratch: Path, order: str) -> None:
    """`first`: the preemption callback is listed before the monitor (the monitor's handler ends up in front and
    chains to the script's); `last`: after it (the script's handler replaces the monitor's)."""
    from ms_exporter import TrainingMonitor
    from ms_exporter.demo import synthetic_dataset

    monitor = TrainingMonitor(_monitor_config(scratch, "preempt"))
    preemption = _preemption(scratch / "model.ckpt")
    callbacks = [preemption, monitor] if order == "first" else [monitor, preemption]
    _model().train(1, synthetic_dataset(size=16 * 400), callbacks=[*callbacks, _pace(0.05)], dataset_sink_mode=False)
    print("trained to the end", flush=True)


def _child_on_request_exit(scratch: Path) -> None:
    """MindSpore's own preemption callback, listed after the monitor: SIGTERM asks it to save at train end."""
    from mindspore.train import OnRequestExit

    from ms_exporter import TrainingMonitor
    from ms_exporter.demo import synthetic_dataset

    monitor = TrainingMonitor(_monitor_config(scratch, "request-exit"))
    on_exit = OnRequestExit(save_ckpt=True, save_mindir=False, directory=str(scratch / "ckpt"))
    _model().train(
        1, synthetic_dataset(size=16 * 120), callbacks=[monitor, on_exit, _pace(0.05)], dataset_sink_mode=False
    )
    print("trained to the end", flush=True)


class _Blocks:
    """The demo's tokens until row BLOCK_AT: that read never returns, and the main thread then waits for the batch in
    MindSpore's native pipeline, where no Python handler runs."""

    BLOCK_AT = 3 * 16

    def __init__(self) -> None:
        from ms_exporter.demo import PaddedTokens

        self._tokens = PaddedTokens(size=256)
        self._never = threading.Event()

    def __getitem__(self, index: int) -> Any:
        if index >= self.BLOCK_AT:
            self._never.wait()
        return self._tokens[index]

    def __len__(self) -> int:
        return len(self._tokens)


def _child_two_monitors(scratch: Path) -> None:
    """Two monitors train together; the first is closed; the second's training gets stuck in native code."""
    import mindspore.dataset as ds

    from ms_exporter import TrainingMonitor
    from ms_exporter.core.catalogue import DATA_WAIT_PHASE
    from ms_exporter.demo import BATCH, synthetic_dataset

    first = TrainingMonitor(_monitor_config(scratch, "first"))
    second = TrainingMonitor(_monitor_config(scratch, "second"))
    model = _model()
    model.train(1, synthetic_dataset(size=16 * 12), callbacks=[first, second], dataset_sink_mode=False)
    first.close()

    def say_when_stuck() -> None:  # from a thread of its own: the main thread runs no Python from now on
        while not (
            second.phases.phase == DATA_WAIT_PHASE and time.perf_counter() - second.phases.state[1] > _STUCK_SECONDS
        ):
            time.sleep(0.1)
        print("stuck", flush=True)

    threading.Thread(target=say_when_stuck, daemon=True).start()
    stuck = ds.GeneratorDataset(
        _Blocks(), ["input_ids", "attention_mask", "label"], shuffle=False, python_multiprocessing=False
    ).batch(BATCH, drop_remainder=True)
    model.train(1, stuck, callbacks=[second], dataset_sink_mode=False)


def _child_fork(scratch: Path) -> None:
    """Two children of the training exit while it trains: a helper forked before training that exits normally (its
    atexit handlers run), and one forked at a step end, with records waiting to be written, that closes the monitor
    it inherited. After each, the parent looks at its own target and lock."""
    from mindspore.train import Callback

    from ms_exporter import TrainingMonitor
    from ms_exporter.core.files.run_lock import LOCK_NAME
    from ms_exporter.demo import synthetic_dataset

    monitor = TrainingMonitor(_monitor_config(scratch, "fork"))
    target = scratch / "sd" / "ms-exporter-fork-rank0.json"
    lock = scratch / "fork" / LOCK_NAME.format(rank=0)
    facts: dict[str, Any] = {"target_at_start": target.exists(), "lock_at_start": lock.exists()}
    go_read, go_write = os.pipe()
    helper = os.fork()
    if helper == 0:  # the helper: waits for the parent's word, then ends as a script ends
        os.close(go_write)
        os.read(go_read, 1)
        sys.exit(0)
    os.close(go_read)

    class Forks(Callback):
        def on_train_step_end(self, run_context: Any) -> None:
            step = run_context.original_args().cur_step_num
            if step == 20:
                os.write(go_write, b"x")
                facts["helper_rc"] = _reap(helper)
                facts["target_after_helper"], facts["lock_after_helper"] = target.exists(), lock.exists()
            if step == 40:
                child = os.fork()
                if child == 0:  # closes what it inherited and leaves without running anything else of the parent's
                    monitor.close()
                    os._exit(0)
                facts["closer_rc"] = _reap(child)
                facts["target_after_closer"], facts["lock_after_closer"] = target.exists(), lock.exists()

    _model().train(1, synthetic_dataset(size=16 * 60), callbacks=[monitor, Forks()], dataset_sink_mode=False)
    facts["steps"] = 60
    (scratch / "facts.json").write_text(json.dumps(facts))
    monitor.close()


def _reap(pid: int) -> int | None:
    """A forked child's exit code, once it ended (within 60 s); None for one killed because it did not."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)  # a child stuck at its exit (in the parent's threads' locks)
    os.waitpid(pid, 0)
    return None


_CHILDREN: dict[str, Callable[..., None]] = {
    "preempt": _child_preempt,
    "on_request_exit": _child_on_request_exit,
    "two_monitors": _child_two_monitors,
    "fork": _child_fork,
}


# -- the parent: plays the scenario -------------------------------------------------------------------------------


class _Child:
    """A child training process whose stdout lines are read on a thread, so waiting for one has a deadline."""

    def __init__(self, scratch: Path, scenario: str, *args: str) -> None:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "GLOG_v": "3"}
        self.stderr_path = scratch / f"{scenario}.stderr"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.adversary_signals", scenario, str(scratch), *args],
            stdout=subprocess.PIPE,
            stderr=self.stderr_path.open("wb"),
            text=True,
            cwd=ROOT,
            env=env,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())
        self.lines.put(None)

    def wait_for(self, line: str, seconds: float) -> bool:
        """True once the child printed `line`; False when it ended or the deadline passed first."""
        if line in self.seen:
            return True
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            try:
                got = self.lines.get(timeout=left)
            except queue.Empty:
                return False
            if got is None:
                return False
            self.seen.append(got)
            if got == line:
                return True
        return False

    def end(self, seconds: float = _END_SECONDS) -> int | None:
        """The return code, or None when the child had to be killed."""
        try:
            return self.proc.wait(timeout=seconds)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(30)
            return None
        finally:
            self.wait_for("", 1)  # collect what it printed last

    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")[-3000:]


def _records(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def _checkpoint_complete(path: Path) -> bool:
    """The checkpoint is there, byte for byte what the handler meant to write, and MindSpore loads it."""
    digest = path.with_suffix(".sha256")
    if not path.exists() or not digest.exists():
        return False
    if hashlib.sha256(path.read_bytes()).hexdigest() != digest.read_text().strip():
        return False
    import mindspore as ms

    try:
        return bool(ms.load_checkpoint(str(path)))
    except (ValueError, RuntimeError, OSError):
        return False


def _play_preempt(scratch: Path, order: str) -> dict[str, Any]:
    child = _Child(scratch, "preempt", order)
    try:
        if not child.wait_for("ready", _STARTUP_SECONDS):
            return {"rc": child.end(5), "error": "never ready", "stderr": child.stderr()}
        child.proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        saving = child.wait_for("saving", 30)
        if saving:
            time.sleep(0.5)  # into the save: the second SIGTERM comes while the handler writes
            child.proc.send_signal(signal.SIGTERM)
        rc = child.end()
        seconds = time.monotonic() - sent
    finally:
        if child.proc.poll() is None:
            child.proc.kill()
    records = _records(scratch / "preempt" / "metrics-rank0.jsonl")
    return {
        "rc": rc,
        "saving": saving,
        "checkpoint": _checkpoint_complete(scratch / "model.ckpt"),
        "seconds": round(seconds, 1),
        "signal_events": sum(1 for r in records if r.get("event") == "signal"),
        "steps_unique": len({r["step"] for r in records if r["type"] == "step"})
        == sum(1 for r in records if r["type"] == "step"),
        "stderr": child.stderr() if rc != 0 else "",
    }


def preemption_run(scratch: Path) -> dict[str, Any]:
    """Both orders at once (each waits mostly for MindSpore's start), each in a directory of its own."""
    facts: dict[str, Any] = {}

    def play(order: str) -> None:
        (scratch / order).mkdir()
        facts[order] = _play_preempt(scratch / order, order)

    threads = [threading.Thread(target=play, args=(order,)) for order in ("first", "last")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return facts


def preemption_holds(facts: dict[str, Any]) -> bool:
    return all(
        "error" not in facts[order]
        and facts[order]["rc"] == 0
        and facts[order]["saving"]
        and facts[order]["checkpoint"]
        and facts[order]["signal_events"] >= 1
        and facts[order]["steps_unique"]
        for order in ("first", "last")
    )


def preemption_shown(facts: dict[str, Any]) -> str:
    def one(order: str) -> str:
        seen = facts[order]
        if "error" in seen:
            return f"listed {order}: {seen['error']}"
        return f"listed {order}: rc {seen['rc']}, checkpoint {'complete' if seen['checkpoint'] else 'MISSING'}"

    return "; ".join(one(order) for order in ("first", "last"))


def on_request_exit_run(scratch: Path) -> dict[str, Any]:
    child = _Child(scratch, "on_request_exit")
    try:
        if not child.wait_for("ready", _STARTUP_SECONDS):
            return {"rc": child.end(5), "error": "never ready", "stderr": child.stderr()}
        child.proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        rc = child.end()
        seconds = time.monotonic() - sent
    finally:
        if child.proc.poll() is None:
            child.proc.kill()
    records = _records(scratch / "request-exit" / "metrics-rank0.jsonl")
    steps = [r["step"] for r in records if r["type"] == "step"]
    return {
        "rc": rc,
        "trained_to_the_end": "trained to the end" in child.seen,
        "checkpoints": sorted(p.name for p in (scratch / "ckpt").rglob("*.ckpt")),
        "steps_in_order": steps == list(range(1, len(steps) + 1)),
        "last_step": steps[-1] if steps else None,
        "signal_events": sum(1 for r in records if r.get("event") == "signal"),
        "seconds": round(seconds, 1),
        "stderr": child.stderr() if rc != 0 else "",
    }


def on_request_exit_holds(facts: dict[str, Any]) -> bool:
    if "error" in facts:
        return False
    return (
        facts["rc"] == 0
        and facts.get("trained_to_the_end", False)
        and bool(facts["checkpoints"])
        and facts["steps_in_order"]
        and facts["last_step"] == 120
        and facts["signal_events"] >= 1
    )


def on_request_exit_shown(facts: dict[str, Any]) -> str:
    if "error" in facts:
        return f"{facts['error']} (rc {facts['rc']})"
    return (
        f"rc {facts['rc']}, trained to step {facts.get('last_step')}, "
        f"checkpoint {', '.join(facts.get('checkpoints', [])) or 'MISSING'}"
    )


def two_monitors_run(scratch: Path) -> dict[str, Any]:
    child = _Child(scratch, "two_monitors")
    try:
        if not child.wait_for("stuck", _STARTUP_SECONDS):
            return {"rc": child.end(5), "error": "never stuck", "stderr": child.stderr()}
        child.proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        rc = child.end(60)
        seconds = time.monotonic() - sent
    finally:
        if child.proc.poll() is None:
            child.proc.kill()
    records = _records(scratch / "second" / "metrics-rank0.jsonl")
    return {
        "rc": rc,
        "seconds": round(seconds, 1),
        "signal_saved": any(r.get("event") == "signal" and r.get("signal") == "SIGTERM" for r in records),
        "target_left": not (scratch / "sd" / "ms-exporter-second-rank0.json").exists(),
        "stderr": child.stderr() if rc != -signal.SIGTERM else "",
    }


def two_monitors_holds(facts: dict[str, Any]) -> bool:
    if "error" in facts:
        return False
    return facts["rc"] == -signal.SIGTERM and bool(facts["signal_saved"]) and bool(facts["target_left"])


def two_monitors_shown(facts: dict[str, Any]) -> str:
    if "error" in facts:
        return f"{facts['error']} (rc {facts['rc']})"
    if facts["rc"] is None:
        return f"still running {facts['seconds']:.0f} s after SIGTERM (killed)"
    return (
        f"rc {facts['rc']} {facts['seconds']:.1f} s after SIGTERM, saves {'made' if facts['signal_saved'] else 'LOST'}"
    )


def fork_run(scratch: Path) -> dict[str, Any]:
    child = _Child(scratch, "fork")
    rc = child.end(_STARTUP_SECONDS + 60)
    facts_path = scratch / "facts.json"
    facts: dict[str, Any] = json.loads(facts_path.read_text()) if facts_path.exists() else {}
    records = _records(scratch / "fork" / "metrics-rank0.jsonl")
    steps = [r["step"] for r in records if r["type"] == "step"]
    facts.update(
        rc=rc,
        step_records=len(steps),
        one_record_per_step=steps == list(range(1, facts.get("steps", -1) + 1)),
        stderr=child.stderr() if rc != 0 else "",
    )
    return facts


def fork_holds(facts: dict[str, Any]) -> bool:
    return (
        facts["rc"] == 0
        and facts.get("helper_rc") == 0
        and facts.get("closer_rc") == 0
        and all(facts.get(f"{what}_after_{child}") for what in ("target", "lock") for child in ("helper", "closer"))
        and facts["one_record_per_step"]
    )


def fork_shown(facts: dict[str, Any]) -> str:
    if "error" in facts:
        return f"{facts['error']} (rc {facts['rc']})"
    kept = [
        f"{what} {'kept' if facts.get(f'{what}_after_{child}') else 'REMOVED'} after the {child}"
        for child in ("helper", "closer")
        for what in ("target", "lock")
    ]
    return f"{', '.join(kept)}; {facts['step_records']} step records for {facts.get('steps')} steps"


CASES = (
    Case(
        "preemption_checkpoint",
        "a script's SIGTERM handler saves a checkpoint for 4 s (listed before, then after the monitor); SIGTERM twice",
        "the handler's save completes and the job exits 0 both ways; the monitor's saves are made too",
        preemption_run,
        preemption_holds,
        preemption_shown,
    ),
    Case(
        "on_request_exit_after_monitor",
        "MindSpore's OnRequestExit listed after the monitor; SIGTERM during Model.train",
        "the handler that owns SIGTERM decides: training ends at its end with OnRequestExit's checkpoint, rc 0",
        on_request_exit_run,
        on_request_exit_holds,
        on_request_exit_shown,
    ),
    Case(
        "two_monitors_stuck",
        "two monitors, the first closed, the training stuck in native code; SIGTERM",
        "the process's one watcher makes the second monitor's saves and ends it with SIGTERM",
        two_monitors_run,
        two_monitors_holds,
        two_monitors_shown,
    ),
    Case(
        "forked_children_exit",
        "a forked helper exits normally and a forked child closes the monitor it inherited, while the parent trains",
        "the parent keeps its file_sd target and run lock; its JSON Lines hold one record per step",
        fork_run,
        fork_holds,
        fork_shown,
    ),
)


def main(argv: list[str]) -> int:
    scenario, scratch, *args = argv
    _CHILDREN[scenario](Path(scratch), *args)
    return 0


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError):
        sys.exit(main(sys.argv[1:]))
