"""The `wandb` backend: a W&B run per writing rank, logged through the wandb library by a background thread."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from ms_exporter.config import WandbConfig
from ms_exporter.monitor.errors import Breaker
from ms_exporter.monitor.ranks import RankInfo
from ms_exporter.monitor.store import MetricStore
from ms_exporter.sinks.queued_writer import QueuedStepWriter

logger = logging.getLogger("ms_exporter")


class WandbWriter(QueuedStepWriter):
    """The step and evaluation scalars of QueuedStepWriter as one `run.log` per step at the global step.

    The run starts at the first train begin (wandb starts its own service process then), in `save_dir/wandb` (the
    `wandb` directory wandb makes there), named `<project>-rank<r>` and grouped by the run id or the project, with
    the rank, world size, node and `tags` as its config. Nothing of wandb's own is collected beyond what is logged
    (no system metrics, console capture, code or git state): the exporter's series are the record. A run that
    cannot start is counted as an error and the backend is off; training goes on.
    """

    name = "wandb"

    def __init__(self, store: MetricStore, save_dir: Path, settings: WandbConfig, project: str, group: str,
                 rank: RankInfo, tags: Mapping[str, Any], interval: float,
                 on_error: Callable[[str, BaseException], None], breaker: Breaker | None = None) -> None:
        import wandb  # the extra: build_sinks turns its absence into a ConfigError

        self._wandb = wandb
        self.save_dir = save_dir
        self._init: dict[str, Any] = {
            "mode": settings.mode, "dir": str(save_dir), "project": settings.project or project,
            "entity": settings.entity, "name": f"{project}-rank{rank.rank}", "group": group,
            "config": {"rank": rank.rank, "world_size": rank.world_size, "node": rank.node, **tags},
            "settings": wandb.Settings(console="off", silent=True, x_disable_stats=True, disable_git=True,
                                       save_code=False, x_save_requirements=False),
        }
        self._run: Any = None
        super().__init__(store, interval, on_error, breaker)

    @property
    def run_dir(self) -> Path | None:
        """Where this run's files are (`.../wandb/offline-run-<time>-<id>`), once it started."""
        return Path(self._run.dir).parent if self._run is not None else None

    def start(self, step: int) -> None:
        if self._run is None and not self._off:
            try:
                self.save_dir.mkdir(parents=True, exist_ok=True)
                self._run = self._wandb.init(**self._init)
            except Exception as exc:  # no service process, a bad entity online: the backend is off, training goes on
                self._off = True
                self._on_error(self.name, exc)
                logger.error("ms_exporter: the wandb run did not start (%s); training continues without it", exc)
            else:
                logger.info("ms_exporter: wandb run %s (%s) in %s", self._init["name"], self._init["mode"],
                            self.run_dir)
        super().start(step)

    def _ready(self) -> bool:
        return self._run is not None

    def _write_step(self, step: int, wall_time: float, scalars: dict[str, float]) -> None:
        self._run.log(scalars, step=step)

    def _write_eval(self, step: int, scalars: dict[str, float]) -> None:
        self._run.log(scalars, step=step)

    def _close_writer(self) -> None:
        self._run.finish()
