"""The `tensorboard` backend: TensorBoard event files through tensorboardX, written by a background thread."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from ms_exporter.monitor.errors import Breaker
from ms_exporter.monitor.store import MetricStore
from ms_exporter.sinks.queued_writer import QueuedStepWriter


class TensorBoardWriter(QueuedStepWriter):
    """The step and evaluation scalars of QueuedStepWriter as TensorBoard scalars, at the step's global step and
    wall time; tensorboardX writes the event file.

    Event files go to `save_dir/tensorboard/rank<r>`: `tensorboard --logdir save_dir/tensorboard` shows one run
    per rank.
    """

    name = "tensorboard"

    def __init__(self, store: MetricStore, log_dir: Path, interval: float,
                 on_error: Callable[[str, BaseException], None], breaker: Breaker | None = None) -> None:
        from tensorboardX import SummaryWriter  # the extra: build_sinks turns its absence into a ConfigError

        self.log_dir = log_dir
        self._writer = SummaryWriter(logdir=str(log_dir), flush_secs=max(1, round(interval)))
        super().__init__(store, interval, on_error, breaker)

    def _write_step(self, step: int, wall_time: float, scalars: dict[str, float]) -> None:
        for key, value in scalars.items():
            self._writer.add_scalar(key, value, global_step=step, walltime=wall_time)

    def _write_eval(self, step: int, scalars: dict[str, float]) -> None:
        for key, value in scalars.items():
            self._writer.add_scalar(key, value, global_step=step)

    def _flush_writer(self) -> None:
        self._writer.flush()

    def _close_writer(self) -> None:
        self._writer.close()
