"""The dashboard's JSON is written by the Grafana Foundation SDK alone, at the schema version the SDK targets."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from tests.support.pythons import DASHBOARD_SDK, below

if below(DASHBOARD_SDK):
    pytest.skip(DASHBOARD_SDK.why, allow_module_level=True)
from grafana_foundation_sdk.models import dashboard as sdk_model

from ms_exporter.generate import dashboard

ROOT = Path(__file__).resolve().parents[2]
# Keys of Grafana's dashboard JSON: a generator that spells them writes JSON by hand instead of through the SDK.
JSON_KEYS = {
    "gridPos",
    "fieldConfig",
    "panels",
    "targets",
    "templating",
    "schemaVersion",
    "legendFormat",
    "refId",
    "reduceOptions",
    "thresholdsStyle",
    "mappings",
    "type",
    "uid",
}


def test_the_generator_spells_no_dashboard_json_key() -> None:
    tree = ast.parse(Path(dashboard.__file__).read_text())
    # queries() reads the rendered JSON (the tests run every query): the one place that may name its keys.
    writers = [node for node in tree.body if not (isinstance(node, ast.FunctionDef) and node.name == "queries")]
    literals = {
        node.value
        for top in writers
        for node in ast.walk(top)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    }
    assert literals & JSON_KEYS == set()


def test_the_committed_dashboard_has_the_sdks_schema_version() -> None:
    committed = json.loads((ROOT / dashboard.DASHBOARD_FILE).read_text())
    assert committed["schemaVersion"] == sdk_model.Dashboard().schema_version
    # Every panel is numbered, once.
    ids = [panel["id"] for panel in committed["panels"]]
    assert len(ids) == len(set(ids)) and 0 not in ids
