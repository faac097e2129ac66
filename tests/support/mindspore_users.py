"""The unit test modules that can reach MindSpore: the ones test_mindformers.py runs under MindSpore 2.7.2.

Read from the source each time, so the list cannot drift: a module is in it when an import statement anywhere in it
(a function's own included) names `mindspore`, or names a module of `tests.support` or `ms_exporter` whose import
statements, anywhere in them and followed the same way, reach `mindspore` (MindSpore is imported where it is used,
often inside a function: a test that builds a TrainingMonitor reaches it through `ms_exporter`'s `__getattr__`).
What reaches no MindSpore API (docs, catalogue and rule renderings, the operator commands over files) is the same
under any MindSpore version and runs under the main environment's alone.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
UNIT = REPO / "tests" / "unit"
_OURS = ("ms_exporter", "tests")


def unit_modules_reaching_mindspore() -> list[Path]:
    """tests/unit/test_*.py whose imports, followed through this repository's modules, reach `mindspore`."""
    return [path for path in sorted(UNIT.glob("test_*.py")) if _reaches(f"tests.unit.{path.stem}")]


def _file_of(module: str) -> Path | None:
    base = REPO.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imported(module: str, path: Path) -> set[str]:
    """Every module an import statement in `path` names (`from a import b` names `a` and `a.b`: b may be a module)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            parts = package.split(".")[: len(package.split(".")) - node.level + 1] if node.level else []
            source = ".".join([*parts, *([node.module] if node.module else [])])
            names.add(source)
            names.update(f"{source}.{alias.name}" for alias in node.names)
    return names


def _reaches(start: str) -> bool:
    """Whether the import statements of `start`, followed through this repository's modules, name `mindspore`."""
    seen, pending = {start}, [start]
    while pending:
        module = pending.pop()
        for name in _imports_of(module):
            top = name.split(".")[0]
            if top == "mindspore":
                return True
            if top in _OURS and name not in seen:
                seen.add(name)
                pending.append(name)
    return False


@functools.cache
def _imports_of(module: str) -> frozenset[str]:
    path = _file_of(module)
    return frozenset(_imported(module, path)) if path is not None else frozenset()
