"""What an import path names: `package.module.Name` or `package.module:Name` (a user's strategy in YAML)."""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
import io
import os
import sys
from types import ModuleType


def load_class(path: str, method: str) -> type:
    """The class `path` names, which must have a callable `method`; ValueError saying why for anything else.

    A YAML file or an environment variable names the class, so the path is held to what it may mean:
    - the module is imported, never run: the running script itself (`train.MyStrategy` while `python train.py`
      runs, or the module `python -m` runs) is not imported a second time, which would run its training again;
      its classes are taken from it as it stands. A module that exits or is interrupted while it is imported
      (a training script that parses its command line at import) is refused, its output kept for the message
      rather than printed;
    - the object is a class with `method` (a function such as os.system, or a class such as subprocess.Popen,
      is refused before anything is called), defined in the named module's own package (a class another package
      defines and the module merely imports is refused: the path names the package's code, not what it uses).
    Whatever importing raises, a BaseException included, becomes the ValueError: a configuration problem.
    """
    module_name, attribute = _split(path)
    module = _module(module_name)
    try:
        found = getattr(module, attribute)
    except BaseException as exc:  # a module's __getattr__ is the module's code
        raise ValueError(f"{module_name} has no {attribute!r} ({_said(exc)})") from None
    if not isinstance(found, type):
        raise ValueError(f"{type(found).__name__} {attribute!r} of {module_name} is not a class")
    try:
        has_method = callable(getattr(found, method, None))
        defined_in = str(found.__module__)
    except BaseException as exc:  # a metaclass's own __getattr__
        raise ValueError(f"{path} cannot be inspected ({_said(exc)})") from None
    if not has_method:
        raise ValueError(f"class {found.__name__} has no {method}()")
    if not _same_package(defined_in, module.__name__):
        raise ValueError(
            f"{found.__name__} is defined in {defined_in}, not in {module_name}'s package: name it where it is defined"
        )
    return found


def _split(path: str) -> tuple[str, str]:
    module_name, _, attribute = path.partition(":") if ":" in path else path.rpartition(".")
    if not module_name or not attribute:
        raise ValueError(f"{path!r} is not an import path (package.module.Class)")
    return module_name, attribute


def _module(name: str) -> ModuleType:
    main = sys.modules.get("__main__")
    if main is not None and name == getattr(getattr(main, "__spec__", None), "name", None):
        return main  # `python -m package.train`: the running module
    loaded = sys.modules.get(name)
    if loaded is not None:
        return loaded
    try:
        spec = importlib.util.find_spec(name)  # imports the parent packages, not the module
    except BaseException as exc:
        raise ValueError(f"cannot import {name} ({_said(exc)})") from None
    if spec is None:
        raise ValueError(f"cannot import {name} (ModuleNotFoundError: no module named {name!r})")
    if main is not None and _same_file(spec.origin, getattr(main, "__file__", None)):
        return main  # `python train.py` and `train.MyStrategy`: importing train would run the training again
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            module = importlib.import_module(name)
    except BaseException as exc:
        said = (err.getvalue() or out.getvalue()).strip().splitlines()
        tail = f"; it printed {said[-1][:200]!r}" if said else ""
        hint = (
            ": a module that ends the process or waits for input while it is imported is a script, not a module of "
            "classes (guard its main with `if __name__ == '__main__':`)"
            if not isinstance(exc, Exception)
            else ""
        )
        raise ValueError(f"cannot import {name} ({_said(exc)}{tail}){hint}") from None
    sys.stdout.write(out.getvalue())  # what the module printed at import, shown as it would have been
    sys.stderr.write(err.getvalue())
    return module


def _same_package(defined_in: str, module_name: str) -> bool:
    if module_name == "__main__":
        return defined_in == "__main__"
    return defined_in.split(".")[0] == module_name.split(".")[0]


def _same_file(one: str | None, other: str | None) -> bool:
    if not one or not other:
        return False
    try:
        return os.path.samefile(one, other)
    except OSError:
        return False


def _said(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__
