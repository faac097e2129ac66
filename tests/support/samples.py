"""Step samples made by hand, for feeding probes directly, and a probe that keeps the ones a monitor publishes."""

from __future__ import annotations

from ms_exporter.core.probe import Probe
from ms_exporter.core.sample import StepSample


class RecordedSteps(Probe):
    """Keeps every published step's sample, for a test to read what the monitor measured of each step."""

    name = "recorded_steps"

    def __init__(self) -> None:
        self.samples: list[StepSample] = []

    def on_step(self, sample: StepSample) -> None:
        self.samples.append(sample)


def sample(
    step: int,
    loss: float | None = 1.0,
    *,
    steps: int = 1,
    duration: float = 0.1,
    samples: int = 8,
    tokens: int = 0,
    t: float = 0.0,
    wait: float | None = None,
) -> StepSample:
    return StepSample(step, 1, steps, loss, duration, wait, samples, tokens, 1e9 + t, t)
