"""The repository's habits hold: a license that matches pyproject, a changelog for the version, local pre-commit
hooks, the documented make targets, and `python -m` modules in the Makefile that exist."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import yaml

from ms_exporter import __version__

if sys.version_info >= (3, 11):
    import tomllib
else:  # the same parser, before it joined the standard library (pytest brings it there)
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[2]


def _pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))


def test_the_license_file_is_the_license_pyproject_declares() -> None:
    assert _pyproject()["project"]["license"] == "Apache-2.0"
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert "END OF TERMS AND CONDITIONS" in text and "APPENDIX: How to apply the Apache License" in text
    # the nine sections of the terms, in order
    numbered = re.findall(r"^\s+(\d)\. [A-Z]", text, re.MULTILINE)
    assert numbered == [str(n) for n in range(1, 10)]


def test_the_changelog_has_the_current_version_and_an_unreleased_section() -> None:
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## \[([^\]]+)\]", text, re.MULTILINE)
    assert headings[0] == "Unreleased"
    assert __version__ in headings, f"CHANGELOG.md has no section for {__version__}"
    assert re.search(rf"^## \[{re.escape(__version__)}\] - \d{{4}}-\d{{2}}-\d{{2}}$", text, re.MULTILINE)
    assert f"git tag -a v{__version__}" in text


def test_the_version_has_one_home() -> None:
    assert _pyproject()["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "ms_exporter._version.__version__"}
    assert "version" in _pyproject()["project"]["dynamic"]


def test_pre_commit_runs_ruff_ruff_format_and_mypy_from_the_venv_without_fetching() -> None:
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text(encoding="utf-8"))
    assert [repo["repo"] for repo in config["repos"]] == ["local"]
    entries = {hook["id"]: hook["entry"] for hook in config["repos"][0]["hooks"]}
    assert entries["ruff"].startswith(".venv/bin/ruff check")
    assert entries["ruff-format"].startswith(".venv/bin/ruff format --check")
    assert entries["mypy"] == ".venv/bin/mypy"
    assert all(hook["language"] == "system" for hook in config["repos"][0]["hooks"])


def test_ruff_reports_a_noqa_that_suppresses_nothing() -> None:
    assert "RUF100" in _pyproject()["tool"]["ruff"]["lint"]["select"]


def test_fmt_and_test_integration_are_documented_make_targets() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    phony = re.search(r"^\.PHONY: (.*)$", makefile, re.MULTILINE)
    assert phony is not None
    for target in ("fmt", "test-integration"):
        assert target in phony.group(1).split()
        # a comment says what the target does, right above it
        assert re.search(rf"^# .*\n{re.escape(target)}:", makefile, re.MULTILINE), target
    fmt = makefile[makefile.index("\nfmt:") :].split("\n\n")[0]
    assert "ruff format ms_exporter tests examples benchmarks" in fmt
    assert "ruff check --fix ms_exporter tests examples benchmarks" in fmt
    lint = makefile[makefile.index("\nlint:") :].split("\n\n")[0]
    assert "ruff format --check ms_exporter tests examples benchmarks" in lint  # the tree stays formatted
    integration = makefile[makefile.index("\ntest-integration:") :].split("\n\n")[0]
    assert "pytest" in integration and integration.rstrip().endswith("tests/integration")


def test_every_module_the_makefile_runs_exists() -> None:
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    modules = re.findall(r"python -m ((?:tests|benchmarks)(?:\.\w+)+)", makefile)
    assert "tests.support.mindformers_venv" in modules
    missing = [m for m in modules if not (ROOT / (m.replace(".", "/") + ".py")).is_file()]
    assert missing == []


def test_python_3_9_is_the_floor_that_ruff_and_mypy_check_and_the_dashboard_sdk_is_installed_where_it_runs() -> None:
    from packaging.requirements import Requirement

    from ms_exporter.cli import DASHBOARD_SDK_PYTHON

    pyproject = _pyproject()
    assert pyproject["project"]["requires-python"] == ">=3.9"
    assert pyproject["tool"]["ruff"]["target-version"] == "py39"
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    floor_check = makefile[makefile.index("\ntest-py39:") :].split("\n\n")[0]
    assert "mypy --python-version 3.9" in floor_check and "PYTHON_39 := 3.9." in makefile
    sdk = next(Requirement(r) for r in pyproject["project"]["dependencies"] if r.startswith("grafana-foundation-sdk"))
    # Installed exactly where `ms-exporter dashboard` does not refuse to run.
    floor = "{}.{}".format(*DASHBOARD_SDK_PYTHON)
    below = f"{DASHBOARD_SDK_PYTHON[0]}.{DASHBOARD_SDK_PYTHON[1] - 1}"
    assert sdk.marker is not None
    assert sdk.marker.evaluate({"python_version": floor}) and not sdk.marker.evaluate({"python_version": below})
