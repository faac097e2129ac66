"""Which sinks a rank builds for a config, without starting them."""

from __future__ import annotations

from pathlib import Path

from ms_exporter.config import load_config
from ms_exporter.core.errors import Breaker, ErrorSink
from ms_exporter.core.part import PartContext
from ms_exporter.core.phases import PhaseClock
from ms_exporter.core.ranks import RankInfo
from ms_exporter.core.store import MetricStore
from ms_exporter.sinks import build_sinks


def sinks_of(rank: int, tmp_path: Path, backend: str = "tensorboard", **options: object) -> list[str]:
    """The names of the sinks rank `rank` of 4 builds for `backend` (closed unstarted)."""
    config = load_config({"backend": backend, "save_dir": str(tmp_path), **options})
    store = MetricStore()
    errors = ErrorSink(store, ("callback",))
    rank_info = RankInfo(rank, rank, 4, "node")
    built = build_sinks(PartContext(config, store, rank_info, PhaseClock(store), errors.absorb, Breaker(errors, store)))
    for sink in built:
        sink.close()
    return [sink.name for sink in built]
