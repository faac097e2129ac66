"""The dependencies whose own floor is above the package's (Python 3.9), and the tests that need them: each skips,
saying why, below that floor only (above it a missing package is a broken install, and its tests fail).

A test module whose every test needs one starts, after its first imports:

    if below(OTLP):
        pytest.skip(OTLP.why, allow_module_level=True)

(an `if`, not a call: ruff still reads the imports after it as the module's imports).
"""

from __future__ import annotations

import sys
from typing import NamedTuple

import pytest

from ms_exporter.cli import DASHBOARD_SDK_PYTHON
from ms_exporter.core.registry import BACKENDS


class Need(NamedTuple):
    python: tuple[int, int]
    why: str


def _need(python: tuple[int, int], what: str) -> Need:
    return Need(python, f"{what} needs Python >= {python[0]}.{python[1]}")


# The dashboard generator (`ms-exporter dashboard`, `kubernetes`) is built with it; pyproject marks it so.
DASHBOARD_SDK = _need(DASHBOARD_SDK_PYTHON, "the Grafana Foundation SDK (the dashboard generator)")
# The otlp extra's tested range (sinks/shared/otel_sdk.py): its exporters are served for 3.10 on only.
OTLP = _need(BACKENDS["otlp"].python, "the otlp extra (OpenTelemetry exporters >= 1.42)")
# The test extra's wandb: 0.31 brought `wandb leet inspect`, the reader the tests check the sink's files with.
WANDB = _need(BACKENDS["wandb"].python, "wandb >= 0.31 (the W&B sink's tested range and its file reader)")


def below(need: Need) -> bool:
    return sys.version_info < need.python


def needs(need: Need) -> pytest.MarkDecorator:
    """A mark for a test that needs `need`: skipped, with the reason, below its Python."""
    return pytest.mark.skipif(below(need), reason=need.why)
