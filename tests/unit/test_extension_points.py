"""The paths CONTRIBUTING.md ("Where a change goes") and docs/development.md ("Your own probe or sink") send a
newcomer down, each exercised end to end: a part handed to TrainingMonitor gets every lifecycle hook in order (and
its failures are its own); a probe and a sink registered in the registries are built from the configuration, exactly
as built-in ones, and their series reach /metrics with the declared help and type."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from ms_exporter import TrainingMonitor
from ms_exporter.config import ConfigError, load_config
from ms_exporter.config.checks import int_in, setting
from ms_exporter.core import registry
from ms_exporter.core.catalogue import MetricFamily
from ms_exporter.core.part import PartContext
from ms_exporter.core.probe import Probe
from ms_exporter.core.sample import StepSample
from ms_exporter.core.sink import Sink
from tests.support.cb_params import context
from tests.support.scrape import scrape


class RecordingSink(Sink):
    name = "recording"
    needs_signals = True

    def __init__(self, fail_on_step: bool = False) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self._fail_on_step = fail_on_step

    def on_train_begin(self, cb_params: Any) -> None:
        self.calls.append(("on_train_begin", cb_params.cur_step_num))

    def on_step(self, sample: StepSample) -> None:
        self.calls.append(("on_step", sample.step, sample.loss))
        if self._fail_on_step:
            raise OSError("disk full")

    def on_eval(self, step: int, results: Mapping[str, Any]) -> None:
        self.calls.append(("on_eval", step, dict(results)))

    def on_train_end(self, step: int, completed: bool) -> None:
        self.calls.append(("on_train_end", step, completed))

    def on_signal(self, signal_name: str, step: int) -> None:
        self.calls.append(("on_signal", signal_name, step))

    def close(self) -> None:
        self.calls.append(("close",))


def test_a_handed_in_sink_gets_every_hook_in_order() -> None:
    sink = RecordingSink()
    monitor = TrainingMonitor(port=0, web={"cache_seconds": 0}, sinks=[sink])
    try:
        assert sink in monitor.parts
        monitor.on_train_begin(context(0, 0.0))
        for step in (1, 2, 3):
            monitor.on_train_step_begin(context(step, 0.0))
            monitor.on_train_step_end(context(step, float(step)))
        eval_context = context(3, 0.0)
        eval_context.original_args().eval_results = {"accuracy": 0.5}
        monitor.on_eval_end(eval_context)
        monitor.core._on_signal("SIGTERM", False)
        monitor.on_train_end(context(3, 0.0))
    finally:
        monitor.close()
    assert sink.calls == [
        ("on_train_begin", 0),
        ("on_step", 1, 1.0),
        ("on_step", 2, 2.0),
        ("on_step", 3, 3.0),
        ("on_eval", 3, {"accuracy": 0.5}),
        ("on_signal", "SIGTERM", 3),
        ("on_train_end", 3, True),
        ("close",),
    ]


def test_a_failing_sink_costs_only_itself() -> None:
    failing, healthy = RecordingSink(fail_on_step=True), RecordingSink()
    failing.name = "failing"
    monitor = TrainingMonitor(port=0, web={"cache_seconds": 0}, sinks=[failing, healthy])
    try:
        monitor.on_train_begin(context(0, 0.0))
        for step in (1, 2):
            monitor.on_train_step_end(context(step, 1.0))
        monitor.publish()
        page = scrape(monitor.url)
    finally:
        monitor.close()
    assert [call[0] for call in healthy.calls].count("on_step") == 2
    assert page.value("mindspore_exporter_errors_total", component="failing") == 2
    assert page.value("mindspore_exporter_errors_total", component="recording") == 0
    assert page.value("mindspore_train_global_step") == 2


def test_a_handed_in_part_that_is_neither_a_part_nor_builds_one_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="sinks=: each item must be a Sink"):
        TrainingMonitor(port=0, sinks=["not a sink"])


# -- a throwaway metric, probe and sink, registered as the built-in ones are -------------------------------------

EXAMPLE = MetricFamily("mindspore_train_example_ratio", "gauge", "An example family for this test.", "ratio", ("part",))


class ExampleProbe(Probe):
    """| mindspore_train_example_ratio | gauge | part | ratio |"""

    name = "example"

    def __init__(self, context: PartContext) -> None:
        self._series = context.store.register(EXAMPLE).series(part="a")

    def on_step(self, sample: StepSample) -> None:
        self._series.value = sample.step / 10


class ListSink(Sink):
    """Keeps every published step's number in a list."""

    name = "steps_list"
    made: list[ListSink] = []

    def __init__(self) -> None:
        self.steps: list[int] = []
        ListSink.made.append(self)

    def on_step(self, sample: StepSample) -> None:
        self.steps.append(sample.step)


@pytest.fixture
def registered() -> Iterator[None]:
    registry.register_probe(registry.ProbeEntry("example", lambda context: [ExampleProbe(context)], ("example",)))
    registry.register_backend(registry.BackendEntry("steps_list", lambda context: [ListSink()]))
    ListSink.made.clear()
    try:
        yield
    finally:
        registry.unregister("example")
        registry.unregister("steps_list")


def test_a_registered_probe_and_sink_are_built_from_the_config_and_served(registered: None) -> None:
    monitor = TrainingMonitor(port=0, web={"cache_seconds": 0}, backend=["prometheus", "steps_list"])
    try:
        monitor.on_train_begin(context(0, 0.0))
        for step in (1, 2, 3, 4):
            monitor.on_train_step_end(context(step, 1.0))
        monitor.publish()
        page = scrape(monitor.url)
    finally:
        monitor.close()
    assert page.value(EXAMPLE.name, part="a") == pytest.approx(0.4)
    assert f"# HELP {EXAMPLE.name} {EXAMPLE.help}\n# TYPE {EXAMPLE.name} gauge\n" in page.text
    assert [sink.steps for sink in ListSink.made] == [[1, 2, 3, 4]]
    # The registry names the components: errors of the new parts are counted under their names from the start.
    assert page.value("mindspore_exporter_errors_total", component="example") == 0
    assert page.value("mindspore_exporter_errors_total", component="steps_list") == 0


def test_a_registered_probe_is_switched_by_its_metrics_group(registered: None) -> None:
    monitor = TrainingMonitor(port=0, metrics=["loss"], backend=["steps_list"])
    try:
        assert "example" not in {part.name for part in monitor.parts}
        assert any(isinstance(part, ListSink) for part in monitor.parts)
    finally:
        monitor.close()
    with pytest.raises(ConfigError, match="steps_list"):  # gone from the registry: no longer an allowed backend
        registry.unregister("steps_list")
        TrainingMonitor(port=0, backend=["steps_list"])


def test_every_built_in_part_carries_its_registry_name(tmp_path: Path) -> None:
    # A part's `name` is its component label; the registry entry that builds it must agree.
    everything = {
        "backend": ["prometheus", "local", "tensorboard"],  # otlp and wandb would reach for a server
        "file_sd_dir": None,
        "flops": {"enable": True, "per_token": 1e9, "peak_flops_per_device": 1e12},
        "grad_norm": {"enable": True},
        "layernorm": {"enable": True},
        "weight_norm": True,
        "data_quality": {"enable": True},
        "update_ratio": {"enable": True},
        "activations": {"enable": True},
        "save_dir": str(tmp_path),
    }
    monitor = TrainingMonitor(port=0, **everything)
    try:
        names = {part.name for part in monitor.parts}
    finally:
        monitor.close()
    # The identity series are written once: no part follows steps. A user's strategies (none configured here) are
    # parts named strategy.<name>, one per strategy (tests/unit/test_strategies.py).
    probes = set(registry.PROBES) - {"identity", "strategies"}
    assert probes <= names, probes - names
    assert {"prometheus", "local", "tensorboard"} <= names


@dataclass(frozen=True)
class EveryNSettings:
    """monitor_config.every_n_list: which steps the sink keeps."""

    every: int = setting(1, check=int_in(1, 100), doc="keep every this many steps", allowed="integer 1-100")


class EveryNSink(ListSink):
    def __init__(self, settings: EveryNSettings) -> None:
        super().__init__()
        self.every = settings.every

    def on_step(self, sample: StepSample) -> None:
        if sample.step % self.every == 0:
            super().on_step(sample)


def test_a_registered_sink_reads_its_own_section_from_the_config_and_the_section_is_checked() -> None:
    entry = registry.BackendEntry(
        "every_n_list", lambda context: [EveryNSink(context.config.section("every_n_list"))], section=EveryNSettings
    )
    with pytest.raises(ConfigError, match="every_n_list"):  # not registered yet: an unknown key
        TrainingMonitor(port=0, backend=["prometheus"], every_n_list={"every": 2})
    registry.register_backend(entry)
    ListSink.made.clear()
    try:
        with pytest.raises(ConfigError, match=r"every_n_list\.every: must be an integer from 1 to 100, got 0"):
            TrainingMonitor(port=0, backend=["every_n_list"], every_n_list={"every": 0})
        monitor = TrainingMonitor(port=0, backend=["every_n_list"], every_n_list={"every": 2})
        try:
            monitor.on_train_begin(context(0, 0.0))
            for step in (1, 2, 3, 4):
                monitor.on_train_step_end(context(step, 1.0))
            monitor.publish()
        finally:
            monitor.close()
        assert [sink.steps for sink in ListSink.made] == [[2, 4]]
        assert load_config({}).section("every_n_list") == EveryNSettings()  # not given: its defaults
    finally:
        registry.unregister("every_n_list")


def test_a_registered_part_cannot_take_a_built_in_key_for_its_section() -> None:
    registry.register_backend(registry.BackendEntry("web", lambda context: [], section=EveryNSettings))
    try:
        with pytest.raises(ConfigError, match=r"monitor_config\.web: a registered part named 'web' declares a section"):
            load_config({"web": {"cache_seconds": 0}})
    finally:
        registry.unregister("web")
    assert load_config({"web": {"cache_seconds": 0}}).web.cache_seconds == 0
