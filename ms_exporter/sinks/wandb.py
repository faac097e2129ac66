"""The `wandb` backend: a W&B run per writing rank, logged through the wandb library by a background thread."""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ms_exporter.config import WandbConfig
from ms_exporter.core.errors import Breaker, OnError
from ms_exporter.core.files import safe_files
from ms_exporter.core.part import PartContext
from ms_exporter.core.ranks import RankInfo
from ms_exporter.core.registry import BackendEntry
from ms_exporter.core.sink import Sink
from ms_exporter.core.store import MetricStore
from ms_exporter.sinks.shared.queued_writer import QueuedStepWriter, writer_could_not_start

logger = logging.getLogger("ms_exporter")

# Below this many free bytes under the run directory a batch is not handed to wandb: wandb's service would drop
# it without a word (it only logs each failed record to a file on that same full disk), so it is counted here.
RESERVE_BYTES = 1 << 20


class WandbWriter(QueuedStepWriter):
    """The step and evaluation scalars of QueuedStepWriter as one `run.log` per step at the global step.

    The run starts at the first train begin (wandb starts its own service process then), in `save_dir/wandb` (the
    `wandb` directory wandb makes there), named `<project>-rank<r>` and grouped by the run id or the project, with
    the rank, world size, node and `tags` as its config. Nothing of wandb's own is collected beyond what is logged
    (no system metrics, console capture, code or git state): the exporter's series are the record. A run that
    cannot start is counted as an error and the backend is off; training goes on.

    wandb falls back to the system temporary directory when its `dir` is not writable. Here the run never goes
    elsewhere: `save_dir/wandb` is made (0750) and a file created and removed in it before `wandb.init`; when that
    fails (a read-only save_dir), or the run still landed outside it, the failure is counted, logged once and the
    backend is off. A full disk is invisible to `run.log` (wandb's service drops the records and logs that to the
    full disk); so a batch that finds less than RESERVE_BYTES free under the run's directory is not handed over but
    counted in `mindspore_exporter_dropped_samples_total{sink="wandb"}` as an OSError(ENOSPC), like any failed
    write (three in a row switch the backend off).
    """

    name = "wandb"

    def __init__(
        self,
        store: MetricStore,
        save_dir: Path,
        settings: WandbConfig,
        project: str,
        group: str,
        rank: RankInfo,
        tags: Mapping[str, Any],
        interval: float,
        on_error: OnError,
        breaker: Breaker | None = None,
    ) -> None:
        import wandb  # the extra: build_sinks turns its absence into a ConfigError

        self._wandb = wandb
        self.save_dir = save_dir
        self._init: dict[str, Any] = {
            "mode": settings.mode,
            "dir": str(save_dir),
            "project": settings.project or project,
            "entity": settings.entity,
            "name": f"{project}-rank{rank.rank}",
            "group": group,
            "config": {"rank": rank.rank, "world_size": rank.world_size, "node": rank.node, **tags},
            "settings": wandb.Settings(
                console="off",
                silent=True,
                x_disable_stats=True,
                disable_git=True,
                save_code=False,
                x_save_requirements=False,
            ),
        }
        self._run: Any = None
        super().__init__(store, interval, on_error, breaker)

    @property
    def run_dir(self) -> Path | None:
        """Where this run's files are (`.../wandb/offline-run-<time>-<id>`), once it started."""
        return Path(self._run.dir).parent if self._run is not None else None

    def on_train_begin(self, cb_params: Any) -> None:
        if self._run is None and not self._off:
            try:
                self._check_writable()
                self._run = self._wandb.init(**self._init)
                self._check_inside()
            except Exception as exc:  # no service process, a bad entity online: the backend is off, training goes on
                self._off = True
                self._on_error(self.name, exc)
                logger.error("ms_exporter: the wandb run did not start (%s); training continues without it", exc)
                self._ask_for_json_lines()
            else:
                logger.info(
                    "ms_exporter: wandb run %s (%s) in %s", self._init["name"], self._init["mode"], self.run_dir
                )
        super().on_train_begin(cb_params)

    def _check_writable(self) -> None:
        """save_dir/wandb exists, is no link, and takes a new file: else wandb would write to /tmp instead."""
        root = safe_files.make_dir(self.save_dir / "wandb")
        fd, probe = safe_files.new_temporary(root / "writable")
        os.close(fd)
        probe.unlink()

    def _check_inside(self) -> None:
        run_dir = self.run_dir
        if run_dir is not None and not run_dir.resolve().is_relative_to(self.save_dir.resolve()):
            run, self._run = self._run, None
            run.finish()
            raise OSError(
                errno.EROFS,
                f"wandb put the run in {run_dir}, outside save_dir {self.save_dir}; the "
                "backend is switched off rather than write elsewhere",
                str(self.save_dir),
            )

    def _ready(self) -> bool:
        return self._run is not None

    def _write_step(self, step: int, wall_time: float, scalars: dict[str, float]) -> None:
        self._run.log(scalars, step=step)

    def _before_pass(self) -> None:
        run_dir = self.run_dir
        if run_dir is None:
            return
        usage = os.statvfs(run_dir)
        free = usage.f_bavail * usage.f_frsize
        if free < RESERVE_BYTES:
            raise OSError(
                errno.ENOSPC,
                f"{free} bytes free under the wandb run (less than {RESERVE_BYTES}): "
                "wandb would lose these records without a word",
                str(run_dir),
            )

    def _write_eval(self, step: int, scalars: dict[str, float]) -> None:
        self._run.log(scalars, step=step)

    def _close_writer(self) -> None:
        self._run.finish()


def build(context: PartContext) -> list[Sink]:
    """A W&B run on rank 0 (every rank with wandb.all_ranks). A wandb that breaks on import or setup (not a missing
    one: that is the extra's ConfigError) is counted and logged once, and the run falls back to JSON Lines."""
    config, rank = context.config, context.rank
    if rank.rank != 0 and not config.wandb.all_ranks:
        return []
    try:
        writer = WandbWriter(
            context.store,
            Path(config.save_dir),
            config.wandb,
            config.project,
            config.run_id or config.project,
            rank,
            config.tags,
            config.interval,
            context.on_error,
            context.breaker,
        )
    except ImportError:
        raise
    except Exception as exc:
        return writer_could_not_start(context, "wandb", exc)
    writer.fall_back = context.fall_back
    return [writer]


PART = BackendEntry("wandb", build, extra="wandb", python=(3, 10), order=50)
