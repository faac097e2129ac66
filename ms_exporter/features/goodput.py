"""The goodput ledger of a run: this process's time ledger, the run state that carries it across restarts, and
the series that export both (docs/goodput.md).

| name | type | labels | unit |
|---|---|---|---|
| mindspore_train_time_seconds_total | counter | bucket | seconds (core/analysis/ledger.py) |
| mindspore_train_run_time_seconds_total | counter | bucket | seconds, every process of the run, as of the last save |
| mindspore_train_restarts_total | counter | | processes of the run before this one |
| mindspore_train_run_info | gauge | run_id | 1 |

and the checkpoint interval advisor's (features/checkpoint_advice.py).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from ms_exporter.config import MonitorConfig
from ms_exporter.config.run_identity import run_id_of
from ms_exporter.core import catalogue as c
from ms_exporter.core.analysis.ledger import TimeLedger, process_started
from ms_exporter.core.cb_params import step_of
from ms_exporter.core.device.optimizer_step import step_offset
from ms_exporter.core.errors import OnPartError
from ms_exporter.core.files import run_lock
from ms_exporter.core.part import Part
from ms_exporter.core.periodic import PeriodicThread
from ms_exporter.core.phases import PhaseClock
from ms_exporter.core.store import MetricStore
from ms_exporter.features.checkpoint_advice import CheckpointAdvisor
from ms_exporter.features.run_state import RunState, RunStateTaken

logger = logging.getLogger("ms_exporter")


class Goodput(Part):
    """Built by TrainingMonitor when goodput.enable; `on_step_end` is on the training thread's step path."""

    name = "goodput"

    def __init__(
        self,
        config: MonitorConfig,
        store: MetricStore,
        phases: PhaseClock,
        rank: int,
        deadlines: Mapping[str | None, float] | None,
        on_error: OnPartError,
    ) -> None:
        """Starts no thread (start() does), so a monitor whose construction fails later leaves nothing running;
        close() lets go of the files and the lock also when start() was never called."""
        self._on_error = on_error
        self.ledger = TimeLedger(store, process_started(), deadlines)
        phases.ledger = self.ledger
        given = config.run_id is not None
        self.run_id = run_id_of(config)
        self.state: RunState | None = None
        # Another process on this save_dir and rank owns the run state: this one's ledger stays in its memory.
        self.claim = run_lock.claim(config.save_dir, rank)
        if not self.claim.owner:
            logger.warning(
                "ms_exporter: the goodput ledger of run %s rank %d in %s is kept by another process (%s): "
                "this process's ledger stays in memory, covers this process only and is not carried "
                "over to a restart",
                self.run_id,
                rank,
                config.save_dir,
                self.claim.holder,
            )
        else:
            try:
                self.state = RunState(config.save_dir, self.run_id, rank, given)
            except RunStateTaken as exc:
                logger.warning("ms_exporter: %s; this monitor's goodput ledger covers this process only", exc)
            except Exception as exc:  # a full disk, an unusable file that cannot be moved: only carrying over is lost
                on_error(exc)
                logger.warning(
                    "ms_exporter: cannot keep the run state in %s (%s): the goodput ledger covers this process only",
                    config.save_dir,
                    exc,
                )
        state = self.state
        self._redo_until = state.redo_until if state is not None else 0
        self._mark = state.mark if state is not None else _ignore_step
        self._offset = 0
        self._finished = False
        self._started = False
        self._closed = False
        self._save_lock = threading.Lock()  # the saver thread and the training thread's end of training
        self._run_seconds = list(state.earlier) if state is not None else [0.0] * len(c.TIME_BUCKETS)
        run_family = store.register(c.RUN_TIME_SECONDS)
        for index, bucket in enumerate(c.TIME_BUCKETS):
            run_family.bind(functools.partial(self._run_seconds.__getitem__, index), bucket=bucket)
        store.register(c.RESTARTS).series().value = float(state.restarts if state is not None else 0)
        store.register(c.RUN_INFO).series(run_id=self.run_id).value = 1.0
        started = time.time() - (time.perf_counter() - self.ledger.started)
        self.advisor = CheckpointAdvisor(
            store,
            self.ledger,
            state.restarts if state is not None else 0,
            state.previous_saved if state is not None else None,
            started,
        )
        self._saver = PeriodicThread("ms_exporter-goodput", config.goodput.save_seconds, self.save, first_at_once=True)
        if state is not None and state.restarts:
            logger.info(
                "ms_exporter: run %s restarts (%d before); steps up to %d are counted as redo",
                self.run_id,
                state.restarts,
                state.redo_until,
            )

    def start(self) -> None:
        """Start saving the run state every goodput.save_seconds (the first save at once). The monitor calls it
        once its construction succeeded; train_begin calls it too. Idempotent; nothing after close()."""
        if not self._closed:
            self._started = True
            self._saver.start()

    def on_train_begin(self, cb_params: Any) -> None:
        """A training call begins: the step it resumes from decides which of its steps are done again."""
        self._finished = False
        self.start()
        self._offset = step_offset(cb_params)
        self.step_ended(step_of(cb_params))

    def on_step_end(self, step: int, outputs: Any) -> None:
        self.step_ended(step)

    def step_ended(self, step: int) -> None:
        """`step` (cb_params.cur_step_num) ended; the steps that follow are redo while they are not past the
        highest step an earlier process reached."""
        progress = step + self._offset
        self._mark(progress)
        self.ledger.redoing = progress < self._redo_until

    def on_train_end(self, step: int, completed: bool) -> None:
        """A run that completed is finished; one that raised is not (a restart redoes its steps)."""
        if completed:
            self._finished = True
            self.save()

    def on_signal(self, signal_name: str, step: int) -> None:
        self.save()

    def save(self) -> None:
        """Write the run state (the saver thread, the end of training, a signal); never raises. Without a run
        state the run's totals are this process's own (as of this call)."""
        try:
            with self._save_lock:
                seconds = self.ledger.seconds()
                if self.state is not None:
                    self.state.save(seconds, self._finished)
                # Exported only once saved: a restart then starts from at least what Prometheus last read.
                earlier = self.state.earlier if self.state is not None else [0.0] * len(seconds)
                for index, before in enumerate(earlier):
                    self._run_seconds[index] = before + seconds[index]
                self.advisor.refresh(self._run_seconds)
        except Exception as exc:
            self._on_error(exc)

    def close(self) -> None:
        """Stop the saver, save once more (when started: a monitor whose construction failed writes nothing),
        and let go of the files and the lock. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._saver.stop()
        self.ledger.stop()
        if self._started:
            self.save()
        if self.state is not None:
            self.state.close()
        self.claim.release()


def _ignore_step(step: int) -> None:
    pass
