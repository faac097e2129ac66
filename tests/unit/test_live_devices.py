"""The live page's hardware columns (endpoint/live_history.py): per step, the highest of the rank's accelerators,
else its host's; the payload names the devices a column covers and draws DeviceHot's line over accelerators only."""

from __future__ import annotations

from ms_exporter.core import catalogue as c
from ms_exporter.core.sample import StepSample
from ms_exporter.core.store import MetricStore
from ms_exporter.core.thresholds import DEFAULTS
from ms_exporter.endpoint.live_history import COLUMNS, StepHistory

TEMPERATURE, UTILIZATION = c.DEVICE_TEMPERATURE.short, c.DEVICE_UTILIZATION.short


def sample(step: int) -> StepSample:
    return StepSample(
        step=step,
        epoch=0,
        steps=1,
        loss=0.5,
        duration=0.1,
        data_wait=0.01,
        samples=8,
        tokens=0,
        wall_time=1000.0 + step,
        monotonic=float(step),
    )


def store() -> MetricStore:
    found = MetricStore((("rank", "0"), ("project", "p")))
    for family in (c.DEVICE_TEMPERATURE, c.DEVICE_UTILIZATION):
        found.register(family)
    return found


def column(history: StepHistory, name: str) -> list[float | None]:
    payload = history.since(-1)
    return [row[COLUMNS.index(name)] for row in payload["rows"]]


def test_the_hottest_and_busiest_accelerator_each_step_not_the_host() -> None:
    metrics = store()
    history = StepHistory(metrics, {})
    history.on_step(sample(1))  # before the first reading: no value, a gap
    temperature, utilization = metrics.get(c.DEVICE_TEMPERATURE.name), metrics.get(c.DEVICE_UTILIZATION.name)
    assert temperature is not None and utilization is not None
    temperature.series(device="host").value = 99.0  # not an accelerator: left out where there are some
    temperature.series(device="gpu0").value = 70.0
    temperature.series(device="gpu1").value = 88.0
    utilization.series(device="host").value = 0.2
    utilization.series(device="gpu0").value = 0.9
    utilization.series(device="gpu1").value = 0.4
    history.on_step(sample(2))
    temperature.series(device="gpu1").value = 60.0
    history.on_step(sample(3))
    assert column(history, TEMPERATURE) == [None, 88.0, 70.0]
    assert column(history, UTILIZATION) == [None, 0.9, 0.9]
    payload = history.since(-1)
    assert payload["devices"] == {TEMPERATURE: "gpu0, gpu1", UTILIZATION: "gpu0, gpu1"}
    assert payload["bounds"][TEMPERATURE] == {"max": DEFAULTS.device_hot_celsius}


def test_a_cpu_only_rank_shows_its_host_and_no_hot_line() -> None:
    metrics = store()
    history = StepHistory(metrics, {})
    utilization = metrics.get(c.DEVICE_UTILIZATION.name)
    assert utilization is not None
    utilization.series(device="host").value = 0.25
    history.on_step(sample(1))
    assert column(history, UTILIZATION) == [0.25]
    assert column(history, TEMPERATURE) == [None]  # no CPU sensor: no temperature, never a 0
    payload = history.since(-1)
    assert payload["devices"] == {UTILIZATION: "host"}
    assert TEMPERATURE not in payload["bounds"]
    metrics.get(c.DEVICE_TEMPERATURE.name).series(device="host").value = 48.0  # type: ignore[union-attr]
    history.on_step(sample(2))
    assert column(history, TEMPERATURE) == [None, 48.0]
    assert TEMPERATURE not in history.since(-1)["bounds"]  # a host CPU's limits are its own
