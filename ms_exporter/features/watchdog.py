"""The hang watchdog: a thread that never calls MindSpore and, when a phase outlasts its deadline, writes the stacks
of every thread to save_dir, logs one WARNING and raises `mindspore_train_hang_suspected`."""

from __future__ import annotations

import datetime
import logging
import math
import os
import shutil
import subprocess
import sys
import sysconfig
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from types import FrameType

from ms_exporter.core import catalogue
from ms_exporter.core.errors import OnPartError
from ms_exporter.core.files import safe_files
from ms_exporter.core.part import ThreadPart
from ms_exporter.core.periodic import PeriodicThread
from ms_exporter.core.phases import PhaseClock
from ms_exporter.core.store import MetricStore, Series

logger = logging.getLogger("ms_exporter")

CHECK_SECONDS = 0.5  # how often the watchdog looks; a dump comes at most this late after the deadline
NATIVE_TIMEOUT = 20.0  # seconds py-spy may take to read the native stacks


class HangWatchdog(ThreadPart):
    """Looks at the phase clock every CHECK_SECONDS. Past the deadline it dumps once per episode (a phase that began
    at one moment); when the phase moves on, the suspicion ends.

    | name | type | labels | unit |
    |---|---|---|---|
    | mindspore_train_hang_suspected | gauge | | 1 while the current phase is past its deadline, else 0 |
    | mindspore_train_hang_dumps_total | counter | | stack dumps written |

    The dump names the phase, its seconds and deadline, and the training thread's top frame in its first lines:
    `ms-exporter hangs SAVE_DIR...` reads them after the process died.
    """

    name = "watchdog"

    def __init__(
        self,
        phases: PhaseClock,
        deadline: Callable[[], float],
        store: MetricStore,
        save_dir: str,
        rank: int,
        on_error: OnPartError,
        native: bool = True,
        project: str = "default",
    ) -> None:
        self._project = project
        self._phases = phases
        self._deadline = deadline
        self._save_dir = Path(save_dir)
        self._rank = rank
        self._on_error = on_error
        self._native = native
        self._suspected_family = store.register(catalogue.HANG_SUSPECTED)
        self._suspected: Series | None = None
        self._dumps = store.register(catalogue.HANG_DUMPS).series()
        self._episode: tuple[str, float] | None = None  # the (phase, since) already dumped
        self.latest: str | None = None  # the newest dump, for GET /debug/stacks
        self.latest_path: Path | None = None
        self.training_thread: int | None = None  # set at train begin: whose top frame names where training is
        self._thread = PeriodicThread("ms_exporter-watchdog", CHECK_SECONDS, self.check, first_at_once=False)

    def start(self) -> None:
        self.training_thread = threading.get_ident()
        if self._suspected is None:
            self._suspected = self._suspected_family.series()
        self._thread.start()

    def stop(self) -> None:
        self._thread.stop()

    def check(self) -> None:
        """One look; never raises (a failure is counted under the `callback` component)."""
        try:
            self._check()
        except Exception as exc:
            self._on_error(exc)

    def _check(self) -> None:
        phase, since = self._phases.state
        if phase is None or phase == catalogue.ENDED:
            self._set_suspected(0.0)
            return
        seconds = time.perf_counter() - since
        deadline = self._deadline()
        if not seconds > deadline:  # NaN (no deadline) is never past
            if self._episode is not None and self._episode != (phase, since):
                self._set_suspected(0.0)
                self._episode = None
            return
        if self._episode == (phase, since):
            return
        self._episode = (phase, since)
        self._set_suspected(1.0)
        self._dump(phase, seconds, deadline)

    def _set_suspected(self, value: float) -> None:
        if self._suspected is not None:
            self._suspected.value = value

    def _dump(self, phase: str, seconds: float, deadline: float) -> None:
        now = datetime.datetime.now(datetime.timezone.utc)
        text = render_dump(
            self._rank,
            self._project,
            phase,
            seconds,
            deadline,
            now,
            self.training_thread,
            native_stacks(os.getpid()) if self._native else None,
        )
        self.latest = text
        self._dumps.value += 1
        path = self._save_dir / f"hang-rank{self._rank}-{now:%Y%m%dT%H%M%SZ}.txt"
        try:
            _write_atomically(path, text)
            self.latest_path = path
        except OSError as exc:
            self._on_error(exc)
            path = Path("(not written: " + (exc.strerror or str(exc)) + ")")
        logger.warning(
            "ms_exporter: rank %d has been in phase %s for %.0f s, past its hang deadline of %.0f s; "
            "the stacks of every thread are in %s",
            self._rank,
            phase,
            seconds,
            deadline,
            path,
        )


def _write_atomically(path: Path, text: str) -> None:
    """save_dir made 0750 if missing; an exclusive temporary of a random name renamed over the dump's name, so a
    link planted at either is never written through (safe_files)."""
    safe_files.make_dir(path.parent)
    safe_files.replace_file(path, text.encode("utf-8"))


def python_stacks(training_thread: int | None) -> tuple[str, str | None]:
    """Every thread's Python stack, the training thread first, and the training thread's top frame."""
    names = {thread.ident: thread.name for thread in threading.enumerate()}
    frames = sys._current_frames()  # the documented way to read other threads' frames (sys module)
    ordered = sorted(frames.items(), key=lambda item: (item[0] != training_thread, names.get(item[0], "")))
    parts, top = [], None
    for ident, frame in ordered:
        role = " (training thread: the one that runs the callback's hooks)" if ident == training_thread else ""
        parts.append(
            f'Thread {ident} "{names.get(ident, "?")}"{role}, most recent call last:\n'
            + "".join(traceback.format_stack(frame))
        )
        if ident == training_thread:
            top = _top_frame(frame)
    return "\n".join(parts), top


def _top_frame(frame: FrameType) -> str:
    """The innermost frame outside Python's standard library (a lock's or a queue's wait says nothing of where
    training is), else the innermost one."""
    stdlib = sysconfig.get_paths()["stdlib"]
    found: FrameType | None = frame
    while found is not None and found.f_code.co_filename.startswith(stdlib):
        found = found.f_back
    chosen = found or frame
    return f"{chosen.f_code.co_filename}:{chosen.f_lineno} in {chosen.f_code.co_name}"


def native_stacks(pid: int) -> str | None:
    """py-spy's view with native frames, when py-spy is installed and may read this process; None otherwise."""
    spy = shutil.which("py-spy")
    if spy is None:
        return None
    try:
        done = subprocess.run(
            [spy, "dump", "--native", "--pid", str(pid)],
            capture_output=True,
            text=True,
            timeout=NATIVE_TIMEOUT,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"(py-spy could not run: {exc})"
    if done.returncode != 0:
        return f"(py-spy could not read this process, exit {done.returncode}: {done.stderr.strip()[-300:]})"
    return done.stdout


def render_dump(
    rank: int,
    project: str,
    phase: str,
    seconds: float,
    deadline: float,
    now: datetime.datetime,
    training_thread: int | None,
    native: str | None,
) -> str:
    stacks, top = python_stacks(training_thread)
    if native is None:
        kind = "Python frames only (py-spy is not installed, or native stacks are off)"
    elif native.startswith("(py-spy"):
        kind = f"Python frames only {native}"
    else:
        kind = "Python frames, and native frames from py-spy below"
    lines = [
        f"ms_exporter hang dump: rank {rank} of project {project}, pid {os.getpid()}, "
        f"{now.isoformat(timespec='seconds')}",
        f"phase: {phase} for {seconds:.3f} s (deadline {deadline:.3f} s)"
        if math.isfinite(deadline)
        else f"phase: {phase} for {seconds:.3f} s",
        f"training thread top frame: {top or 'unknown'}",
        f"stacks: {kind}",
        "",
        stacks,
    ]
    if native is not None and not native.startswith("(py-spy"):
        lines += ["", "py-spy dump --native:", native]
    return "\n".join(lines) + "\n"
