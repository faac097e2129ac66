"""Prometheus file-based service discovery: one target file per rank, written at start and removed at exit."""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import stat
from pathlib import Path
from typing import Any

from ms_exporter.core.files import safe_files
from ms_exporter.core.part import PartContext
from ms_exporter.core.ranks import RankInfo
from ms_exporter.core.registry import BackendEntry
from ms_exporter.core.sample import StepSample
from ms_exporter.core.sink import Sink

logger = logging.getLogger("ms_exporter")


def target_host(bind_address: str) -> str:
    """The host Prometheus should dial: the bound address, or this host's name when bound to every address."""
    if bind_address in ("0.0.0.0", "::", ""):
        return socket.getfqdn()
    if ":" in bind_address:
        return f"[{bind_address}]"
    return bind_address


class FileSdTarget(Sink):
    """`<dir>/ms-exporter-<project>-rank<r>.json` in Prometheus' file_sd format.

    The file carries the actual port (after a fallback from a taken one) and `__meta_ms_exporter_*` labels:
    meta labels, so that relabel_configs can use them without clashing with the `rank`/`project` labels every
    series already has (Prometheus would rename those to `exported_rank`). Written when the endpoint is up,
    removed at close and on SIGTERM/SIGINT: a stopped rank leaves discovery, not a dead target; written again at
    the next step when the process outlived the signal.
    """

    name = "file_sd"
    needs_signals = True

    def __init__(self, directory: str, project: str, rank: RankInfo, bind_address: str, port: int) -> None:
        safe_project = "".join(c if c.isalnum() or c in "-_." else "_" for c in project)
        self.path = Path(directory) / f"ms-exporter-{safe_project}-rank{rank.rank}.json"
        self._content = [
            {
                "targets": [f"{target_host(bind_address)}:{port}"],
                "labels": {
                    "__meta_ms_exporter_project": project,
                    "__meta_ms_exporter_rank": str(rank.rank),
                    "__meta_ms_exporter_local_rank": str(rank.local_rank),
                    "__meta_ms_exporter_world_size": str(rank.world_size),
                    "__meta_ms_exporter_node": rank.node,
                },
            }
        ]
        self._withdrawn = False  # removed by a signal the process outlived
        self._checked = False  # the directory's mode, looked at once

    def write(self) -> None:
        """Atomically: Prometheus re-reads the file on change and must never see half of it.

        The directory is shared by every user's jobs (`/tmp/ms-exporter-targets` in the docs): when the monitor
        creates it, it is sticky like /tmp (1777: anyone adds targets, none removes another's). The content goes
        to a fresh temporary of a random name created exclusively (mkstemp) and is renamed over the target: a
        link planted at any name is replaced, never written through."""
        safe_files.make_dir(self.path.parent, shared=True)
        if not self._checked:
            self._checked = True
            mode = self.path.parent.stat().st_mode
            if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:  # older versions made it 0777; or by hand
                logger.warning(
                    "ms_exporter: %s is writable by every user without the sticky bit: any of them can "
                    "remove or replace this rank's target; chmod 1777 it (as /tmp)",
                    self.path.parent,
                )
        # 0644: Prometheus reads it, as a user of its own.
        safe_files.replace_file(self.path, (json.dumps(self._content, indent=2) + "\n").encode("utf-8"), mode=0o644)

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def on_signal(self, signal_name: str, step: int) -> None:
        # Most signalled processes end now, some without exit handlers (SIGTERM's default action): leave
        # discovery first. One that goes on (SIGTERM ignored, or a handler that saves and carries on) gets its
        # target back with its next step.
        self.remove()
        self._withdrawn = True

    def on_train_begin(self, cb_params: Any) -> None:
        self._restore()

    def on_step(self, sample: StepSample) -> None:
        if self._withdrawn:
            self._restore()

    def _restore(self) -> None:
        if self._withdrawn:
            self._withdrawn = False
            self.write()

    def close(self) -> None:
        self.remove()


def build(context: PartContext) -> list[Sink]:
    """The rank's file_sd target (with file_sd_dir), with the port the endpoint really got; none without one."""
    config = context.config
    if not config.file_sd_dir or context.port is None:
        return []
    target = FileSdTarget(config.file_sd_dir, config.project, context.rank, config.bind_address, context.port)
    try:
        target.write()
    except OSError as exc:
        context.on_error("file_sd", exc)
        return []
    logger.info("ms_exporter: registered %s for Prometheus file_sd", target.path)
    return [target]


PART = BackendEntry("file_sd", build, selectable=False, order=70)
