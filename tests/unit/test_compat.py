"""core/compat.py: what the package needs from Python 3.10 and 3.11, the same on 3.9 (the package's floor)."""

from __future__ import annotations

import dataclasses
import importlib
import pkgutil
import sys

import pytest

import ms_exporter
from ms_exporter.core import compat
from ms_exporter.core.output_layout import OutputLayout
from ms_exporter.core.registry import BackendEntry, MissingExtra
from ms_exporter.core.sample import StepSample
from ms_exporter.monitor.publisher import StepRecord
from tests.support.pythons import DASHBOARD_SDK, OTLP, below

# The modules that import a dependency with a floor above the package's, at module level.
NEEDS = {
    "ms_exporter.generate.dashboard": DASHBOARD_SDK,
    "ms_exporter.sinks.otlp": OTLP,
    "ms_exporter.sinks.shared.otel_sdk": OTLP,
}


@pytest.mark.parametrize("zipper", [compat.zip_strict, lambda *its: compat._zip_checked(its)], ids=["here", "3.9"])
def test_zip_strict_pairs_equal_lengths_and_refuses_unequal_ones(zipper: object) -> None:
    assert callable(zipper)
    assert list(zipper("ab", [1, 2])) == [("a", 1), ("b", 2)]
    assert list(zipper("ab", [1, 2], (True, False))) == [("a", 1, True), ("b", 2, False)]
    assert list(zipper("", [])) == []
    for short, long in (("a", [1, 2]), ("ab", [1])):
        with pytest.raises(ValueError):
            list(zipper(short, long))
    # Lazily, as zip: pairs before the mismatch are handed out first.
    pairs = zipper(iter("abc"), iter([1, 2]))
    assert next(pairs) == ("a", 1) and next(pairs) == ("b", 2)
    with pytest.raises(ValueError):
        next(pairs)


@pytest.mark.skipif(sys.version_info < (3, 10), reason="dataclass(slots=True) came in Python 3.10")
@pytest.mark.parametrize("record", [StepSample, StepRecord, OutputLayout])
def test_the_step_paths_records_are_slotted_where_python_can(record: type) -> None:
    assert dataclasses.is_dataclass(record) and "__slots__" in vars(record)


def test_every_module_imports_on_this_python() -> None:
    # A newer name or a `X | Y` evaluated at import (an alias, a base class, a default) fails only when the module
    # is imported on the older Python; the unit suite alone does not import every module.
    modules = [m.name for m in pkgutil.walk_packages(ms_exporter.__path__, "ms_exporter.")]
    failed = {}
    for name in modules:
        need = NEEDS.get(name)
        if name == "ms_exporter.__main__" or (need is not None and below(need)):  # __main__ runs the command line
            continue
        try:
            importlib.import_module(name)
        except Exception as exc:
            failed[name] = repr(exc)
    assert failed == {}
    assert len(modules) > 100


def _not_installed(context: object) -> list[object]:
    raise ImportError("No module named 'somelib'", name="somelib")


def test_a_missing_extra_that_this_python_cannot_install_says_which_python_it_needs() -> None:
    floor = (sys.version_info[0], sys.version_info[1] + 1)
    here = ".".join(map(str, sys.version_info[:3]))
    with pytest.raises(MissingExtra) as unserved:
        BackendEntry("x", _not_installed, extra="x", python=floor).build(None)
    assert str(unserved.value).endswith(
        f"pip install 'ms-exporter[x]' on Python >= {floor[0]}.{floor[1]} (its packages are not served for {here})"
    )
    with pytest.raises(MissingExtra) as served:
        BackendEntry("x", _not_installed, extra="x").build(None)
    assert str(served.value).endswith(
        "needs somelib, which is not installed; install it with: pip install 'ms-exporter[x]'"
    )
