"""Step samples made by hand, for feeding probes directly."""

from __future__ import annotations

from ms_exporter.core.sample import StepSample


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
