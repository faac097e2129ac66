"""core/compat.py: what the package needs from Python 3.10 and 3.11, the same on 3.9 (the package's floor)."""

from __future__ import annotations

import dataclasses
import sys

import pytest

from ms_exporter.core import compat
from ms_exporter.core.output_layout import OutputLayout
from ms_exporter.core.sample import StepSample
from ms_exporter.monitor.publisher import StepRecord


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
