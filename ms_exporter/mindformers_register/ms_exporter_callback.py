"""For MindSpore Transformers' run_mindformer.py, which cannot be told to import a module: its `--register_path` is
this directory (`python -m ms_exporter.mindformers` prints it), and the YAML entry names this file's class:
`{type: TrainingMonitor, auto_register: ms_exporter_callback.TrainingMonitor, ...}` (docs/mindformers.md).
MindSpore Transformers loads this file by path and registers what it names under that class's own name; loading it
also registers the class under the third source article's name, so `type: MindSporeTransformersMonitor` with the
same `auto_register` entry finds it too."""

from mindformers.tools.register import MindFormerModuleType, MindFormerRegister

from ms_exporter.config.mindformers_keys import CALLBACK_NAMES
from ms_exporter.monitor.callback import TrainingMonitor

for _name in CALLBACK_NAMES:
    MindFormerRegister.register_cls(TrainingMonitor, MindFormerModuleType.CALLBACK, alias=_name)

__all__ = ["TrainingMonitor"]
