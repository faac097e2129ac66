"""The interface every probe implements; the callback calls it and absorbs whatever it raises."""

from __future__ import annotations

from typing import Any

from ms_exporter.monitor.sample import StepSample


class Probe:
    """One measured quantity. Probes write to the MetricStore and never import a sink."""

    name = "probe"

    def on_train_begin(self, cb_params: Any) -> None:
        """Resolve whatever is fixed for the run (optimizer, columns); may be slow."""

    def on_step(self, sample: StepSample) -> None:
        """Hot path: derive numbers from the sample and assign them to pre-bound series."""

    def on_train_end(self) -> None:
        """Release what on_train_begin took."""
