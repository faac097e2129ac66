"""MindSpore Transformers 2.0.0's callback machinery, for real, without the dependency the registry does not serve.

2.0.0 pins MindSpore ~=2.10.0 (the main venv's) and needs `hyper-parallel`, which the package index does not serve.
`python -m tests.support.mindformers2` (`make mindformers2`) installs the package with `--no-deps` into
./.mindformers2, apart from .venv's site-packages, with the one other requirement what is loaded below imports
(`regex`, for the registry's loader of classes by path); the test that needs it puts the folder on PYTHONPATH.

The package cannot be imported as a whole here: `mindformers/__init__.py` imports every model, and the models import
`hyper_parallel` at module level (so does `mindformers/pynative/trainer/trainer.py`). `load()` therefore stands in
for a few package `__init__` files only, as empty packages that name what those files would export, and runs 2.0.0's
own modules for everything the PyNative Trainer's callbacks go through: the callback base class and CallbackHandler,
TrainerState, MonitorGroup and MonitorCallback, TrainConfig (the run YAML's parser) and MindFormerRegister with its
loader of classes by path (`auto_register`, REGISTER_PATH). docs/mindformers.md says what this covers and what not.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
TARGET = REPO / ".mindformers2"
MINDFORMERS = "mindformers==2.0.0"
# The registry's loader of classes by path (tools/hub/dynamic_module_utils.py) imports regex at module level.
REQUIREMENTS = (MINDFORMERS, "regex==2026.12.2")
_STAMP = TARGET / ".installed"


class Unavailable(RuntimeError):
    """The install cannot be made here; the message says why."""


def _digest() -> str:
    return hashlib.sha256("\n".join(REQUIREMENTS).encode()).hexdigest()


def installed() -> bool:
    """Whether ./.mindformers2 holds what REQUIREMENTS name (made by `make mindformers2`)."""
    return _STAMP.exists() and _STAMP.read_text() == _digest()


def ensure() -> Path:
    """The install's folder, made first where needed. Unavailable where pip cannot make it."""
    if installed():
        return TARGET
    # --target replaces nothing it finds: start from an empty folder.
    if TARGET.exists():
        subprocess.run(["rm", "-rf", str(TARGET)], check=True)
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-compile"]
    done = subprocess.run(
        [*command, "--target", str(TARGET), *REQUIREMENTS], capture_output=True, text=True, timeout=900
    )
    if done.returncode != 0:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-6:])
        raise Unavailable(f"pip install --no-deps --target {TARGET.name} {' '.join(REQUIREMENTS)} failed:\n{tail}")
    _STAMP.write_text(_digest())
    return TARGET


def environment(base: dict[str, str] | None = None) -> dict[str, str]:
    """`base` (the process's environment by default) with the install first on PYTHONPATH."""
    env = dict(os.environ if base is None else base)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(TARGET), env.get("PYTHONPATH", "")) if p)
    return env


@dataclass(frozen=True)
class MindFormers2:
    """2.0.0's own classes, loaded by load()."""

    version: str
    TrainerCallback: type
    CallbackHandler: type
    MonitorCallback: type
    TrainerState: type
    MonitorGroup: type
    TrainConfig: Any
    MindFormerRegister: Any
    MindFormerModuleType: Any

    def build_callback(self, entry: Any) -> Any:
        """What the Trainer does with each item of the run YAML's `callbacks:` (trainer/utils.py, _build_callback,
        which cannot be imported: the module imports hyper_parallel)."""
        return self.MindFormerRegister.get_instance_from_cfg(entry.to_dict(), self.MindFormerModuleType.CALLBACK)


def _package(name: str, **exports: Any) -> types.ModuleType:
    """`name` as a package whose __init__.py is not run, holding `exports`; its submodules import from its folder."""
    folder = TARGET.joinpath(*name.split("."))
    spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
    spec.submodule_search_locations = [str(folder)]
    module = importlib.util.module_from_spec(spec)
    module.__path__ = [str(folder)]
    module.__dict__.update(exports)
    sys.modules[name] = module
    parent, _, child = name.rpartition(".")
    if parent:
        setattr(sys.modules[parent], child, module)
    return module


def _legacy_model_unknown() -> bool:
    raise RuntimeError("mindformers.core.context is not loaded: the PyNative Trainer replaces is_legacy_model")


def _pynative_is_legacy_model() -> bool:
    """trainer/trainer.py's patch_legacy_model_inference, which Trainer.__init__ puts in the registry."""
    return False


def load() -> MindFormers2:
    """Imports 2.0.0's callback machinery from ./.mindformers2 into this process (see the module's docstring)."""
    if not installed():
        raise Unavailable(f"{TARGET} is not installed: make mindformers2")
    if str(TARGET) not in sys.path:
        sys.path.insert(0, str(TARGET))
    version = importlib.metadata.version("mindformers")  # from the install's dist-info
    _package("mindformers", __version__=version)  # tools/hub/hub.py imports the version
    _package("mindformers.core")
    # register.py imports is_legacy_model from here; the PyNative Trainer replaces it at once (below).
    _package("mindformers.core.context", is_legacy_model=_legacy_model_unknown)
    tools = importlib.import_module("mindformers.tools")
    registry = importlib.import_module("mindformers.tools.register.register")
    # Trainer.__init__ -> patch_pynative_modules(): the registry is asked in the PyNative Trainer's terms.
    registry.is_legacy_model = _pynative_is_legacy_model
    importlib.import_module("mindformers.pynative")
    callback_package = _package("mindformers.pynative.callback")
    callback = importlib.import_module("mindformers.pynative.callback.callback")
    monitor_callback = importlib.import_module("mindformers.pynative.callback.monitor_callback")
    # What mindformers/pynative/callback/__init__.py exports of these modules.
    callback_package.TrainerCallback = callback.TrainerCallback
    callback_package.CallbackHandler = callback.CallbackHandler
    callback_package.MonitorCallback = monitor_callback.MonitorCallback
    trainer_package = _package("mindformers.pynative.trainer")
    train_state = importlib.import_module("mindformers.pynative.trainer.train_state")
    trainer_package.TrainerState = train_state.TrainerState
    monitor = importlib.import_module("mindformers.pynative.tools.monitor")
    config = importlib.import_module("mindformers.pynative.config")
    return MindFormers2(
        version=version,
        TrainerCallback=callback.TrainerCallback,
        CallbackHandler=callback.CallbackHandler,
        MonitorCallback=monitor_callback.MonitorCallback,
        TrainerState=train_state.TrainerState,
        MonitorGroup=monitor.MonitorGroup,
        TrainConfig=config.TrainConfig,
        MindFormerRegister=tools.MindFormerRegister,
        MindFormerModuleType=tools.MindFormerModuleType,
    )


if __name__ == "__main__":
    try:
        print(f"MindSpore Transformers 2.0.0 (no dependencies): {ensure()}")
    except Unavailable as exc:  # the test says the same when it skips; make goes on
        print(f"MindSpore Transformers 2.0.0 not installed: {exc}", file=sys.stderr)
