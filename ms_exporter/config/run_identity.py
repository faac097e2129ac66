"""Which run a monitor's numbers belong to, the one rule every writer of save_dir follows (docs/configuration.md,
"What save_dir holds"): the goodput ledger and run state, the JSON Lines records' `run`, TensorBoard's run folder."""

from __future__ import annotations

import hashlib
import os
import re
from typing import Any

from ms_exporter.config.vocabulary import RUN_ID_CHARACTERS

_NOT_IN_RUN_ID = re.compile(rf"[^{RUN_ID_CHARACTERS}]+")


def _stem(project: str) -> str:
    return _NOT_IN_RUN_ID.sub("_", project).strip("_.:-")[:100] or "run"


def derived_run_id(project: str, save_dir: str) -> str:
    """The run id when none is given: the project (characters a file name may not hold become `_`) and 8 hex
    digits of the save_dir's absolute path, so that two jobs of one project that save apart are two runs."""
    where = hashlib.sha256(os.path.abspath(save_dir).encode("utf-8", "surrogateescape")).hexdigest()[:8]
    return f"{_stem(project)}-{where}"


def run_id_of(config: Any) -> str:
    """monitor_config.run_id, else the one derived from the project and save_dir."""
    return config.run_id if config.run_id is not None else derived_run_id(config.project, config.save_dir)


def run_folder_of(config: Any) -> str:
    """The folder name a run's files get inside save_dir's shared folders (tensorboard/<folder>/rank<r>): the run_id
    when one is given, else the project, so that TensorBoard lists each project as a run of its own."""
    return config.run_id if config.run_id is not None else _stem(config.project)
