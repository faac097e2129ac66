"""What an import path names: `package.module.Name` or `package.module:Name` (a user's strategy in YAML)."""

from __future__ import annotations

import importlib
from typing import Any


def load_object(path: str) -> Any:
    """The object `path` names; ImportError or AttributeError (or whatever the module raises) when there is none."""
    module_name, _, attribute = path.partition(":") if ":" in path else path.rpartition(".")
    if not module_name or not attribute:
        raise ValueError(f"{path!r} is not an import path (package.module.Class)")
    return getattr(importlib.import_module(module_name), attribute)
