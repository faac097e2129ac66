"""The optimizer in cb_params and its own step counter, which a run resumed from a checkpoint restores.

MindSpore's `Model.train(..., initial_epoch=k)` starts `cur_step_num` from 0 again, while the optimizer's
`global_step` comes back from the checkpoint: the difference says how far the run really is.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ms_exporter.core.cb_params import NETWORK, TRAIN_NETWORK, optimizer_of, step_of


def find_optimizer(cb_params: Any) -> Any:
    """cb_params' optimizer, else the train network's; None when there is neither."""
    # cb_params is a dict whose attribute access raises KeyError, not AttributeError: use get().
    optimizer = optimizer_of(cb_params)
    if optimizer is not None:
        return optimizer
    for holder in (TRAIN_NETWORK, NETWORK):
        optimizer = getattr(cb_params.get(holder), "optimizer", None)
        if optimizer is not None:
            return optimizer
    return None


def optimizer_step(optimizer: Any, fallback: int) -> int:
    """The optimizer's global_step, or `fallback` when it has none that reads as a number."""
    try:
        return int(np.asarray(optimizer.global_step.asnumpy()).reshape(-1)[0])
    except Exception:
        return fallback


def step_offset(cb_params: Any) -> int:
    """What to add to cur_step_num to get the optimizer's step (0 without an optimizer): read at train begin."""
    step = step_of(cb_params)
    optimizer = find_optimizer(cb_params)
    return 0 if optimizer is None else optimizer_step(optimizer, step) - step
