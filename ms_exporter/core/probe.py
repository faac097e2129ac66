"""The interface every probe implements; the callback calls it and absorbs whatever it raises."""

from __future__ import annotations

from typing import Any

from ms_exporter.core.sample import StepSample


class Probe:
    """One measured quantity. Probes write to the MetricStore and never import a sink."""

    name = "probe"

    def on_train_begin(self, cb_params: Any) -> None:
        """Resolve whatever is fixed for the run (optimizer, columns); may be slow."""

    def on_step(self, sample: StepSample) -> None:
        """Hot path: derive numbers from the sample and assign them to pre-bound series."""

    def on_train_end(self) -> None:
        """Release what on_train_begin took."""

    def on_good_state(self, step: int) -> None:
        """actions.rollback kept the state of `step` (after this step's on_step)."""

    def on_rollback(self, good_step: int) -> None:
        """actions.rollback restored the state kept at `good_step`: what this probe derived from the steps since
        belongs to a path training no longer is on."""
