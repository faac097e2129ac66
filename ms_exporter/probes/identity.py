"""Who this rank is: the info series and the job's world size, set once at construction."""

from __future__ import annotations

from collections.abc import Mapping

from ms_exporter._version import __version__
from ms_exporter.config import MonitorConfig
from ms_exporter.core import catalogue
from ms_exporter.core.part import PartContext
from ms_exporter.core.probe import Probe
from ms_exporter.core.ranks import RankInfo
from ms_exporter.core.registry import ProbeEntry
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


def build(context: PartContext) -> list[Probe]:
    """mindspore_train_info and the world size, written once: no probe follows the steps for them."""
    import mindspore

    config: MonitorConfig = context.config
    device_target = str(mindspore.get_context("device_target"))
    publish_identity(context.store, context.rank, device_target, mindspore.__version__, config.tags)
    return []


PART = ProbeEntry("identity", build, ("global_rank",), order=10)
