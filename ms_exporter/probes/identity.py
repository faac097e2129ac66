"""Who this rank is: the info series and the job's world size, set once at construction."""

from __future__ import annotations

from collections.abc import Mapping

from ms_exporter._version import __version__
from ms_exporter.core import catalogue
from ms_exporter.core.ranks import RankInfo
from ms_exporter.core.store import MetricStore


def publish_identity(
    store: MetricStore, rank: RankInfo, device_target: str, mindspore_version: str, tags: Mapping[str, str]
) -> None:
    """| mindspore_train_info | gauge =1 | world_size, local_rank, node, device_target, versions, tags |
    | mindspore_train_world_size | gauge | | ranks |"""
    info = store.register(catalogue.INFO)
    info.series(
        world_size=str(rank.world_size),
        local_rank=str(rank.local_rank),
        node=rank.node,
        device_target=device_target,
        mindspore_version=mindspore_version,
        exporter_version=__version__,
        **dict(tags),
    ).value = 1
    store.register(catalogue.WORLD_SIZE).series().value = rank.world_size
