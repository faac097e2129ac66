"""For MindSpore Transformers' run_mindformer.py, which cannot be told to import a module: its `--register_path` is
this directory (`python -m ms_exporter.mindformers` prints it), and the YAML entry names this file's class:
`{type: TrainingMonitor, auto_register: ms_exporter_callback.TrainingMonitor, ...}` (docs/mindformers.md).
MindSpore Transformers loads this file by path and registers what it names."""

from ms_exporter.monitor.callback import TrainingMonitor

__all__ = ["TrainingMonitor"]
