"""MindSpore Transformers' callback registry: `{type: TrainingMonitor, ...}` in a run YAML's `callbacks:` list.

Importing this module registers TrainingMonitor (also under the monitor_config article's name for it,
MindSporeTransformersMonitor) when MindSpore Transformers is installed and does nothing when it is
not (docs/mindformers.md). With 2.x it also registers PyNativeTrainingMonitor, the callback of 2.x's PyNative
Trainer, whose callbacks are not MindSpore's (monitor/mindformers_trainer.py): both Trainers build `callbacks:`
through the one registry, so each has its own name. MindSpore Transformers resolves a YAML `type:` through its
registry only, so a launcher of one's own imports this module once before building its Trainer. MindSpore
Transformers' run_mindformer.py imports nothing of ours: there the YAML entry says `auto_register:
ms_exporter_callback.TrainingMonitor` (or `.PyNativeTrainingMonitor`) and `--register_path` is REGISTER_PATH, which
`python -m ms_exporter.mindformers` prints.
"""

from __future__ import annotations

import importlib.util
import logging
from pathlib import Path

from ms_exporter.config.mindformers_keys import CALLBACK_NAMES

CALLBACK_NAME = CALLBACK_NAMES[0]
# The directory holding ms_exporter_callback.py, the file run_mindformer.py's auto_register loads by path.
REGISTER_PATH = Path(__file__).resolve().parent / "mindformers_register"

_log = logging.getLogger("ms_exporter")


def available() -> bool:
    """Whether MindSpore Transformers can be imported here (without importing it)."""
    return importlib.util.find_spec("mindformers") is not None


def register() -> bool:
    """Put TrainingMonitor in MindSpore Transformers' callback registry under CALLBACK_NAMES, and with 2.x
    PyNativeTrainingMonitor under its name; False (and nothing done) without MindSpore Transformers.

    Callbacks carry no legacy/new-model name prefix in that registry, so one entry serves both model families."""
    if not available():
        return False
    from mindformers.tools.register import MindFormerModuleType, MindFormerRegister

    from ms_exporter.monitor.callback import TrainingMonitor

    # Registering again replaces the entry with the same class: importing twice is harmless.
    for name in CALLBACK_NAMES:
        MindFormerRegister.register_cls(TrainingMonitor, MindFormerModuleType.CALLBACK, alias=name)
    names = list(CALLBACK_NAMES)
    if importlib.util.find_spec("mindformers.pynative") is not None:  # 2.x
        from ms_exporter.monitor.mindformers_trainer import PyNativeTrainingMonitor

        # Under its class's own name, as `auto_register: ms_exporter_callback.PyNativeTrainingMonitor` registers it.
        MindFormerRegister.register_cls(PyNativeTrainingMonitor, MindFormerModuleType.CALLBACK)
        names.append(PyNativeTrainingMonitor.__name__)
    _log.debug("registered %s in MindSpore Transformers' callback registry", ", ".join(names))
    return True


if __name__ == "__main__":
    print(REGISTER_PATH)
else:
    register()
