"""The interface every probe implements: a part (core/part.py) that measures one quantity."""

from __future__ import annotations

from ms_exporter.core.part import Part


class Probe(Part):
    """One measured quantity. Probes write to the MetricStore and never import a sink.

    Besides the part's hooks (on_train_begin resolves whatever is fixed for the run, and may be slow; on_step is
    the hot path: derive numbers from the sample and assign them to pre-bound series), a probe hears the rollback
    action's two events."""

    name = "probe"

    def on_good_state(self, step: int) -> None:
        """actions.rollback kept the state of `step` (after this step's on_step)."""

    def on_rollback(self, good_step: int) -> None:
        """actions.rollback restored the state kept at `good_step`: what this probe derived from the steps since
        belongs to a path training no longer is on."""
