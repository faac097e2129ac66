"""Which rank this process is: MindSpore's communication API when initialised, else the launch environment."""

from __future__ import annotations

import os
import socket
from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class RankInfo:
    rank: int
    local_rank: int
    world_size: int
    node: str


def detect_rank(environ: Mapping[str, str] | None = None) -> RankInfo:
    """Precedence: mindspore.communication (if init() ran), then RANK_ID/RANK, RANK_SIZE/WORLD_SIZE/MS_WORKER_NUM,
    LOCAL_RANK/DEVICE_ID, then rank 0 of 1."""
    env = os.environ if environ is None else environ
    node = socket.gethostname()  # the machine; msrun's MS_NODE_ID names a worker process, not a host
    from_comm = _from_communication()
    if from_comm is not None:
        rank, local_rank, world_size = from_comm
        return RankInfo(rank, local_rank, world_size, node)
    rank = _first_int(env, ("RANK_ID", "RANK"), 0)
    world_size = _first_int(env, ("RANK_SIZE", "WORLD_SIZE", "MS_WORKER_NUM"), 1)
    local_rank = _first_int(env, ("LOCAL_RANK", "DEVICE_ID"), rank)
    return RankInfo(rank, local_rank, max(world_size, rank + 1), node)


def _from_communication() -> tuple[int, int, int] | None:
    try:
        from mindspore.communication import GlobalComm, get_group_size, get_local_rank, get_rank

        if not GlobalComm.INITED:
            return None
        rank, size = int(get_rank()), int(get_group_size())
        try:
            local = int(get_local_rank())
        except Exception:  # not every backend offers a local rank (CPU msrun does not)
            local = int(os.environ.get("LOCAL_RANK", os.environ.get("DEVICE_ID", rank)))
        return rank, local, size
    except Exception:
        return None


def _first_int(env: Mapping[str, str], names: tuple[str, ...], default: int) -> int:
    for name in names:
        text = env.get(name, "").strip()
        if text.isdigit():
            return int(text)
    return default
