"""For MindSpore Transformers' run_mindformer.py, which cannot be told to import a module: its `--register_path` is
this directory (`python -m ms_exporter.mindformers` prints it), and the YAML entry names this file's class:
`{type: TrainingMonitor, auto_register: ms_exporter_callback.TrainingMonitor, ...}` (docs/mindformers.md), or with
2.x's PyNative Trainer `{type: PyNativeTrainingMonitor, auto_register: ms_exporter_callback.PyNativeTrainingMonitor}`.
MindSpore Transformers loads this file by path and registers what it names under that class's own name; loading it
also registers the others as ms_exporter/mindformers.py does (TrainingMonitor under the monitor_config article's name
too, MindSporeTransformersMonitor), so any of those `type:` names with the same `auto_register` entry finds its
class."""

import importlib.util

from mindformers.tools.register import MindFormerModuleType, MindFormerRegister

from ms_exporter.config.mindformers_keys import CALLBACK_NAMES
from ms_exporter.monitor.callback import TrainingMonitor
from ms_exporter.monitor.mindformers_trainer import PyNativeTrainingMonitor

for _name in CALLBACK_NAMES:
    MindFormerRegister.register_cls(TrainingMonitor, MindFormerModuleType.CALLBACK, alias=_name)
if importlib.util.find_spec("mindformers.pynative") is not None:  # 2.x
    MindFormerRegister.register_cls(PyNativeTrainingMonitor, MindFormerModuleType.CALLBACK)

__all__ = ["PyNativeTrainingMonitor", "TrainingMonitor"]
