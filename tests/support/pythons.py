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


class Need(NamedTuple):
    python: tuple[int, int]
    why: str


# The dashboard generator (`ms-exporter dashboard`, `kubernetes`) is built with it; pyproject marks it so.
DASHBOARD_SDK = Need(
    DASHBOARD_SDK_PYTHON,
    "the Grafana Foundation SDK (the dashboard generator) needs Python >= {}.{}".format(*DASHBOARD_SDK_PYTHON),
)
# The otlp extra's tested range (sinks/otel_sdk.py): its exporters are served for 3.10 on only.
OTLP = Need((3, 10), "the otlp extra (OpenTelemetry exporters >= 1.42) needs Python >= 3.10")
# The test extra's wandb: 0.31 brought `wandb leet inspect`, the reader the tests check the sink's files with.
WANDB = Need((3, 10), "wandb >= 0.31 (the W&B sink's tested range and its file reader) needs Python >= 3.10")


def below(need: Need) -> bool:
    return sys.version_info < need.python


def needs(need: Need) -> pytest.MarkDecorator:
    """A mark for a test that needs `need`: skipped, with the reason, below its Python."""
    return pytest.mark.skipif(below(need), reason=need.why)
