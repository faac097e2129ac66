"""Adversary cases for user strategies: BaseExceptions out of a strategy, a real Ctrl-C while one runs, import paths
that name a training script or a command, and a strategy whose keys change every step.

The training cases train the demo Transformer for real in a child process (`python -m benchmarks.adversary_strategies
train SCENARIO SCRATCH`); the monitor's YAML names the strategies below by import path. That child runs this module as
`__main__`, so the paths also play "the YAML names a class of the running script": the monitor takes the class from
the running module instead of importing (and running) it a second time. The child writes what it saw to
SCRATCH/facts.json.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.adversary import Case
from ms_exporter.probes.strategies import MAX_KEYS

ROOT = Path(__file__).resolve().parents[1]
HERE = "benchmarks.adversary_strategies"
_STARTUP_SECONDS = 180.0  # MindSpore's import and the first graph compilation, on a loaded 2-core machine
_INTERRUPT_SECONDS = 60.0  # from SIGINT to the child's end: the handler runs at the strategy's next bytecode
BASE_STEPS = 60
KEYS_STEPS = 120
NEW_KEYS_PER_STEP = 50


# -- strategies the children's YAML names ---------------------------------------------------------------------------


class ExitsAtTrainBegin:
    """sys.exit() in on_train_begin (the issue saw it end the run at train begin)."""

    def __init__(self, config: dict[str, Any]) -> None:
        pass

    def on_train_begin(self, cb_params: Any) -> None:
        sys.exit(3)

    def on_step_end(self, metrics: dict[str, Any], cb_params: Any) -> dict[str, Any]:
        return {"alive": 1}


class CancelledFromStep:
    """A leaked asyncio.CancelledError (a BaseException since Python 3.8) from step 20 on."""

    def __init__(self, config: dict[str, Any]) -> None:
        pass

    def on_step_end(self, metrics: dict[str, Any], cb_params: Any) -> dict[str, Any]:
        if metrics["step"] >= 20:
            raise asyncio.CancelledError("a task of the strategy's own was cancelled")
        return {"alive": 1}


class _Interrupting:
    def __float__(self) -> float:
        raise KeyboardInterrupt  # the strategy's own code, not a Ctrl-C: no signal was sent


class FloatInterruptsFromStep:
    """Returns a value whose __float__ raises KeyboardInterrupt from step 40 on."""

    def __init__(self, config: dict[str, Any]) -> None:
        pass

    def on_step_end(self, metrics: dict[str, Any], cb_params: Any) -> dict[str, Any]:
        return {"value": _Interrupting() if metrics["step"] >= 40 else 1.0}


class ExitsAtTrainEnd:
    """raise SystemExit in on_train_end (the issue saw close() raise it again)."""

    def __init__(self, config: dict[str, Any]) -> None:
        pass

    def on_step_end(self, metrics: dict[str, Any], cb_params: Any) -> dict[str, Any]:
        return {"alive": 1}

    def on_train_end(self, cb_params: Any) -> None:
        raise SystemExit(4)


class Spins:
    """At train begin (config `at: begin`) or at step 10: says so in the `marker` file, then computes in pure Python
    for up to two minutes (a slow strategy), which a Ctrl-C interrupts between two of its bytecodes."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.marker = Path(config["marker"])
        self.at = config.get("at", 10)

    def on_train_begin(self, cb_params: Any) -> None:
        if self.at == "begin":
            self._spin()

    def on_step_end(self, metrics: dict[str, Any], cb_params: Any) -> dict[str, Any]:
        if metrics["step"] == self.at:
            self._spin()
        return {"step": metrics["step"]}

    def _spin(self) -> None:
        self.marker.write_text(str(os.getpid()))
        until = time.monotonic() + 120
        while time.monotonic() < until:
            sum(range(1000))


class ChangingKeys:
    """A steady key, 50 new keys a step, a text value and an integer beyond a float's range."""

    def __init__(self, config: dict[str, Any]) -> None:
        pass

    def on_step_end(self, metrics: dict[str, Any], cb_params: Any) -> dict[str, Any]:
        step = metrics["step"]
        returned: dict[str, Any] = {"steady": step}
        returned.update({f"key_{step}_{index}": index for index in range(NEW_KEYS_PER_STEP)})
        returned.update({"text": "1.5", "huge": 10**400})
        return returned


class NanEvery:
    every_n_steps = float("nan")

    def __init__(self, config: dict[str, Any]) -> None:
        pass

    def on_step_end(self, metrics: dict[str, Any], cb_params: Any) -> None:
        return None


class ExitsInInit:
    def __init__(self, config: dict[str, Any]) -> None:
        sys.exit(2)

    def on_step_end(self, metrics: dict[str, Any], cb_params: Any) -> None:
        return None


class InterruptedInInit:
    def __init__(self, config: dict[str, Any]) -> None:
        raise KeyboardInterrupt

    def on_step_end(self, metrics: dict[str, Any], cb_params: Any) -> None:
        return None


# -- the child: a real training ---------------------------------------------------------------------------------------


def _page(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(url, timeout=30).read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def _labelled(page: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, label: str) -> dict[str, float]:
    return {dict(labels)[label]: value for (found, labels), value in page.items() if found == name and labels}


def _train(scenario: str, scratch: Path) -> int:
    import mindspore as ms

    from ms_exporter import TrainingMonitor

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    strategies, steps = _scenario(scenario, scratch)
    monitor = TrainingMonitor(
        {
            "port": 0,
            "backend": ["prometheus", "local"],
            "save_dir": str(scratch / "out"),
            "interval": 1,
            "warmup_steps": 0,
            "web": {"cache_seconds": 0},
            "strategies": strategies,
        }
    )
    facts: dict[str, Any] = {"steps": steps, "trained": 0}
    network, optimizer = _small_network()
    try:
        _train_counted(network, optimizer, monitor, steps, facts)
    except BaseException as exc:  # what reached the training: the finding is whether anything does
        facts["training_raised"] = type(exc).__name__
    try:
        _read_page(monitor, facts)
    except BaseException as exc:
        facts["scrape_failed"] = repr(exc)
    try:
        monitor.close()
    except BaseException as exc:
        facts["close_raised"] = type(exc).__name__
    (scratch / "facts.json").write_text(json.dumps(facts))
    return 130 if facts.get("training_raised") == "KeyboardInterrupt" else 0


def _scenario(scenario: str, scratch: Path) -> tuple[list[dict[str, Any]], int]:
    """The strategies a scenario's monitor names, and how many steps it trains."""
    scenarios: dict[str, tuple[list[dict[str, Any]], int]] = {
        "base": (
            [
                {"name": f"{HERE}.ExitsAtTrainBegin"},
                {"name": f"{HERE}.CancelledFromStep"},
                {"name": f"{HERE}.FloatInterruptsFromStep"},
                {"name": f"{HERE}.ExitsAtTrainEnd"},
            ],
            BASE_STEPS,
        ),
        "ctrl_c": ([{"name": f"{HERE}.Spins", "config": {"marker": str(scratch / "spinning")}}], BASE_STEPS),
        "ctrl_c_begin": (
            [{"name": f"{HERE}.Spins", "config": {"marker": str(scratch / "spinning"), "at": "begin"}}],
            BASE_STEPS,
        ),
        "keys": ([{"name": f"{HERE}.ChangingKeys"}], KEYS_STEPS),
    }
    return scenarios[scenario]


def _small_network() -> tuple[Any, Any]:
    """A one-layer demo network and its Momentum optimizer."""
    from mindspore import nn

    from ms_exporter.demo import build_network

    network = build_network(layers=1, d_model=32, heads=2)
    return network, nn.Momentum(network.trainable_params(), 0.01, 0.9)


def _train_counted(network: Any, optimizer: Any, monitor: Any, steps: int, facts: dict[str, Any]) -> None:
    """`steps` steps of training with the monitor; facts["trained"] follows the steps done."""
    from mindspore.train import Callback, Model

    from ms_exporter.demo import synthetic_dataset

    class Counter(Callback):
        def on_train_step_end(self, run_context: Any) -> None:
            facts["trained"] = int(run_context.original_args().cur_step_num)

    model = Model(network, optimizer=optimizer)
    dataset = synthetic_dataset(size=steps * 8, batch=8)
    model.train(1, dataset, callbacks=[monitor, Counter()], dataset_sink_mode=False)


def _read_page(monitor: Any, facts: dict[str, Any]) -> None:
    """Publishes, scrapes the monitor's page and keeps what the strategies left on it in `facts`."""
    monitor.publish()
    page = _page(monitor.url or "")
    facts["errors"] = _labelled(page, "mindspore_exporter_errors_total", "component")
    facts["disabled"] = _labelled(page, "mindspore_exporter_component_disabled", "component")
    facts["user"] = {
        name: value for (name, _), value in page.items() if name.startswith("mindspore_train_user_changing_keys_")
    }
    facts["dropped"] = _labelled(page, "mindspore_exporter_strategy_dropped_total", "reason")


def _child(scratch: Path, *args: str) -> subprocess.Popen[bytes]:
    log = open(scratch / "child.log", "wb")  # noqa: SIM115  (handed to the child)
    try:
        return subprocess.Popen(
            [sys.executable, "-m", HERE, *args],
            cwd=ROOT,
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(ROOT), "GLOG_v": "3"},
        )
    finally:
        log.close()


def _facts(scratch: Path) -> dict[str, Any]:
    with contextlib.suppress(OSError, ValueError):
        found: dict[str, Any] = json.loads((scratch / "facts.json").read_text())
        return found
    return {}


def _log_tail(scratch: Path) -> str:
    with contextlib.suppress(OSError):
        return (scratch / "child.log").read_text(errors="replace")[-2000:]
    return ""


def _wait(ready: Callable[[], bool], child: subprocess.Popen[bytes], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if ready():
            return True
        if child.poll() is not None:
            return ready()
        time.sleep(0.1)
    return False


def _end(child: subprocess.Popen[bytes], seconds: float) -> int | None:
    try:
        return child.wait(seconds)
    except subprocess.TimeoutExpired:
        child.kill()
        child.wait()
        return None


# -- the cases ------------------------------------------------------------------------------------------------------


def run_base_exceptions(scratch: Path) -> dict[str, Any]:
    child = _child(scratch, "train", "base", str(scratch))
    rc = _end(child, _STARTUP_SECONDS + 120)
    facts = _facts(scratch)
    errors = facts.get("errors", {})
    return {
        "rc": rc,
        "trained": facts.get("trained", 0),
        "steps": BASE_STEPS,
        "training_raised": facts.get("training_raised"),
        "close_raised": facts.get("close_raised"),
        "counted": {
            name: errors.get(f"strategy.{name}", 0)
            for name in (
                "exits_at_train_begin",
                "cancelled_from_step",
                "float_interrupts_from_step",
                "exits_at_train_end",
            )
        },
        "disabled": sorted(name for name, value in facts.get("disabled", {}).items() if value),
        "log": "" if rc == 0 else _log_tail(scratch),
    }


def holds_base_exceptions(facts: dict[str, Any]) -> bool:
    return (
        facts["rc"] == 0
        and facts["trained"] == facts["steps"]
        and facts["training_raised"] is None
        and facts["close_raised"] is None
        and all(count >= 1 for count in facts["counted"].values())
    )


def shown_base_exceptions(facts: dict[str, Any]) -> str:
    counted = sum(1 for count in facts["counted"].values() if count >= 1)
    raised = facts["training_raised"] or facts["close_raised"] or "nothing"
    return (
        f"rc {facts['rc']}, {facts['trained']}/{facts['steps']} steps, training saw {raised}; "
        f"{counted}/4 strategies counted"
    )


def _interrupted(scratch: Path, scenario: str) -> dict[str, Any]:
    """Train with a strategy that spins (at train begin, or at step 10), and press Ctrl-C (SIGINT) while it does."""
    scratch.mkdir(parents=True, exist_ok=True)
    child = _child(scratch, "train", scenario, str(scratch))
    marker = scratch / "spinning"
    spinning = _wait(marker.exists, child, _STARTUP_SECONDS)
    sent = time.monotonic()
    if spinning:
        child.send_signal(signal.SIGINT)
    rc = _end(child, _INTERRUPT_SECONDS if spinning else 5)
    facts = _facts(scratch)
    ended_as_asked = rc in (130, -signal.SIGTERM)  # see holds_ctrl_c
    return {
        "spinning": spinning,
        "rc": rc,
        "seconds": round(time.monotonic() - sent, 1),
        "training_raised": facts.get("training_raised"),
        "trained": facts.get("trained", 0),
        "close_raised": facts.get("close_raised"),
        "log": "" if ended_as_asked else _log_tail(scratch),
    }


def run_ctrl_c(scratch: Path) -> dict[str, Any]:
    return {
        "steps": BASE_STEPS,
        "begin": _interrupted(scratch / "begin", "ctrl_c_begin"),
        "step": _interrupted(scratch / "step", "ctrl_c"),
    }


def holds_ctrl_c(facts: dict[str, Any]) -> bool:
    """Before the first step, SIGINT reaches Python's handler (the relay, then KeyboardInterrupt): the training must
    see that KeyboardInterrupt and end with 130. Once steps run, MindSpore 2.10's own C-level SIGINT handler (set
    again at each graph run) answers a Ctrl-C with kill(SIGTERM) to its own process, as it does without the monitor:
    the process must end by that SIGTERM. Either way, no step after the Ctrl-C."""
    begin, step = facts["begin"], facts["step"]
    return (
        begin["spinning"]
        and begin["rc"] == 130
        and begin["training_raised"] == "KeyboardInterrupt"
        and begin["trained"] == 0
        and begin["close_raised"] is None
        and step["spinning"]
        and step["rc"] in (130, -signal.SIGTERM)
        and step["trained"] < facts["steps"]
    )


def shown_ctrl_c(facts: dict[str, Any]) -> str:
    begin, step = facts["begin"], facts["step"]
    return (
        f"at train begin: training saw {begin['training_raised']} {begin['seconds']:.0f} s after SIGINT, rc "
        f"{begin['rc']}; at step 10: rc {step['rc']} {step['seconds']:.0f} s after SIGINT (MindSpore's own "
        f"SIGINT -> SIGTERM), no step after it"
    )


def run_keys(scratch: Path) -> dict[str, Any]:
    child = _child(scratch, "train", "keys", str(scratch))
    rc = _end(child, _STARTUP_SECONDS + 120)
    facts = _facts(scratch)
    user = facts.get("user", {})
    columns = 0
    size = 0
    records = scratch / "out" / "metrics-rank0.jsonl"
    with contextlib.suppress(OSError):
        size = records.stat().st_size
        for line in records.read_text().splitlines():
            record = json.loads(line)
            if record.get("type") == "step":
                columns = max(columns, sum(1 for key in record if key.startswith("user_changing_keys_")))
    prefix = "mindspore_train_user_changing_keys_"
    return {
        "rc": rc,
        "trained": facts.get("trained", 0),
        "steps": KEYS_STEPS,
        "series": len(user),
        "columns": columns,
        "jsonl_bytes": size,
        "steady": user.get(prefix + "steady"),
        "text_exported": prefix + "text" in user,
        "huge_exported": prefix + "huge" in user,
        "disabled": bool(facts.get("disabled", {}).get("strategy.changing_keys")),
        "dropped": facts.get("dropped", {}),
        "log": "" if rc == 0 else _log_tail(scratch),
    }


def holds_keys(facts: dict[str, Any]) -> bool:
    return (
        facts["rc"] == 0
        and facts["trained"] == facts["steps"]
        and 1 <= facts["series"] <= MAX_KEYS
        and 1 <= facts["columns"] <= MAX_KEYS
        and facts["steady"] == facts["steps"]
        and not facts["text_exported"]
        and not facts["huge_exported"]
        and not facts["disabled"]
        and facts["dropped"].get("keys", 0) > 0
        and facts["dropped"].get("value", 0) > 0
    )


def shown_keys(facts: dict[str, Any]) -> str:
    return (
        f"{facts['series']} series, {facts['columns']} step columns, {facts['jsonl_bytes'] / 1e6:.1f} MB JSON Lines "
        f"after {facts['trained']} steps of {NEW_KEYS_PER_STEP} new keys; steady key at step {facts['steady']}, "
        f"text/huge exported: {facts['text_exported']}/{facts['huge_exported']}, switched off: {facts['disabled']}"
    )


# -- construction: what an import path may run ---------------------------------------------------------------------

_SCRIPT = """import argparse
parser = argparse.ArgumentParser(description="a training script")
parser.add_argument("--epochs", type=int, required=True)
ARGS = parser.parse_args()


class ScriptStrategy:
    def __init__(self, config):
        pass

    def on_step_end(self, metrics, cb_params):
        return {"epochs": ARGS.epochs}
"""

# A training script that names its own strategy class in its YAML: `python own_train.py` must run its top level once.
_OWN_SCRIPT = """import sys
from pathlib import Path
with open(Path(__file__).with_name("top_level_runs"), "a") as runs:
    runs.write("ran\\n")


class OwnStrategy:
    def __init__(self, config):
        pass

    def on_step_end(self, metrics, cb_params):
        return {"one": 1}


if __name__ == "__main__":
    from ms_exporter import TrainingMonitor
    from ms_exporter.probes.strategies import StrategyProbe

    monitor = TrainingMonitor(port=0, strategies=[{"name": "own_train.OwnStrategy"}])
    probes = [part for part in monitor.parts if isinstance(part, StrategyProbe)]
    monitor.close()
    print("strategy", type(probes[0].strategy).__name__ if probes else None)
"""

# Each construction, one after another in one child: what it raised, by type name.
_CONSTRUCT = """import json, sys
from ms_exporter import TrainingMonitor
for name, strategies in json.loads(sys.argv[1]).items():
    try:
        TrainingMonitor(port=0, strategies=strategies).close()
        print("raised", name, None)
    except BaseException as exc:
        print("raised", name, type(exc).__name__)
"""


def _python(scratch: Path, args: list[str], env: dict[str, str] | None = None) -> tuple[int, str]:
    done = subprocess.run(
        [sys.executable, *args],
        cwd=scratch,
        capture_output=True,
        text=True,
        timeout=_STARTUP_SECONDS,
        env={**os.environ, "PYTHONPATH": os.pathsep.join((str(scratch), str(ROOT))), "GLOG_v": "3", **(env or {})},
    )
    return done.returncode, done.stdout + done.stderr


def _usage_printed(output: str) -> bool:
    """Whether the script's own argparse output reached the terminal (a line of its own), not inside our message."""
    return any(line.startswith(("usage:", "__main__.py: error:")) for line in output.splitlines())


def run_construction(scratch: Path) -> dict[str, Any]:
    import yaml

    (scratch / "train_script.py").write_text(_SCRIPT)
    (scratch / "own_train.py").write_text(_OWN_SCRIPT)
    pwned = scratch / "pwned"
    popen = {"name": "subprocess.Popen", "config": {"touch": 0, str(pwned): 0}}
    facts: dict[str, Any] = {}

    def check_config(name: str, strategies: list[dict[str, Any]] | None, env: dict[str, str] | None = None) -> None:
        block: dict[str, Any] = {"port": 0}
        if strategies is not None:
            block["strategies"] = strategies
        (scratch / f"{name}.yaml").write_text(yaml.safe_dump({"monitor_config": block}))
        rc, output = _python(scratch, ["-m", "ms_exporter", "check-config", f"{name}.yaml"], env)
        facts[name] = {"rc": rc, "config_error": "invalid monitor_config" in output, "usage": _usage_printed(output)}

    check_config("script_yaml", [{"name": "train_script.ScriptStrategy"}])
    check_config("script_env", None, {"MS_EXPORTER_STRATEGIES": "[{name: train_script.ScriptStrategy}]"})
    check_config("popen_yaml", [popen])
    check_config("popen_env", None, {"MS_EXPORTER_STRATEGIES": json.dumps([popen])})
    constructions = {
        "nan_every": [{"name": f"{HERE}.NanEvery"}],
        "exit_in_init": [{"name": f"{HERE}.ExitsInInit"}],
        "interrupt_in_init": [{"name": f"{HERE}.InterruptedInInit"}],
        "popen_construct": [popen],
    }
    _, output = _python(scratch, ["-c", _CONSTRUCT, json.dumps(constructions)])
    raised = dict(line.split()[1:3] for line in output.splitlines() if line.startswith("raised "))
    for name in constructions:
        facts[name] = raised.get(name, output[-500:])
    rc, output = _python(scratch, ["own_train.py"])
    facts["own_script"] = {
        "rc": rc,
        "strategy": "strategy OwnStrategy" in output,
        "top_level_runs": len((scratch / "top_level_runs").read_text().splitlines())
        if (scratch / "top_level_runs").exists()
        else 0,
    }
    facts["command_ran"] = pwned.exists()
    return facts


def holds_construction(facts: dict[str, Any]) -> bool:
    checks = ("script_yaml", "script_env", "popen_yaml", "popen_env")
    return (
        all(facts[name]["rc"] == 1 and facts[name]["config_error"] and not facts[name]["usage"] for name in checks)
        and all(facts[name] == "ConfigError" for name in ("nan_every", "exit_in_init", "interrupt_in_init"))
        and facts["popen_construct"] == "ConfigError"
        and not facts["command_ran"]
        and facts["own_script"] == {"rc": 0, "strategy": True, "top_level_runs": 1}
    )


def shown_construction(facts: dict[str, Any]) -> str:
    refused = sum(1 for name in ("script_yaml", "script_env", "popen_yaml", "popen_env") if facts[name]["rc"] == 1)
    raised = {facts[name] for name in ("nan_every", "exit_in_init", "interrupt_in_init", "popen_construct")}
    return (
        f"check-config refused {refused}/4 (script, Popen; YAML, env); construction raised {'/'.join(sorted(raised))}; "
        f"command ran: {facts['command_ran']}; own script's top level ran {facts['own_script']['top_level_runs']}x"
    )


CASES: tuple[Case, ...] = (
    Case(
        "strategy_base_exceptions",
        "strategies raise SystemExit at train begin, CancelledError from step 20, a KeyboardInterrupt from __float__ "
        "from step 40, SystemExit at train end",
        "each is that strategy's failure (counted, switched off); all 60 steps train; close() raises nothing",
        run_base_exceptions,
        holds_base_exceptions,
        shown_base_exceptions,
    ),
    Case(
        "strategy_ctrl_c",
        "Ctrl-C (a real SIGINT) while a slow strategy computes, at train begin and at step 10",
        "the Ctrl-C stops the training: its KeyboardInterrupt reaches the training (rc 130), or MindSpore's own "
        "SIGINT handler ends the process (SIGTERM), as without the monitor",
        run_ctrl_c,
        holds_ctrl_c,
        shown_ctrl_c,
    ),
    Case(
        "strategy_import_paths",
        "YAML or MS_EXPORTER_STRATEGIES names a training script that parses argv at import, or subprocess.Popen with "
        "a command as its config; a class sets every_n_steps = nan, or exits in __init__",
        "check-config and construction raise ConfigError naming the entry, print no usage, run no command; a "
        "script naming its own class is not run twice",
        run_construction,
        holds_construction,
        shown_construction,
    ),
    Case(
        "strategy_changing_keys",
        f"a strategy returns {NEW_KEYS_PER_STEP} new keys a step, a text value and 10**400",
        f"at most {MAX_KEYS} series and step columns; text and 10**400 dropped and counted; the strategy stays on",
        run_keys,
        holds_keys,
        shown_keys,
    ),
)


def main(argv: list[str]) -> int:
    if len(argv) == 3 and argv[0] == "train":
        return _train(argv[1], Path(argv[2]))
    print(__doc__)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
