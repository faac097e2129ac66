"""The layout a newcomer navigates: docs/architecture.md's module map is the one written from the modules' own
docstrings, docs/index.md links every page of docs/, the docs' relative links land, the README stays a
short front door whose YAML block and code are valid, and test modules import helpers from tests/support/ only."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from ms_exporter.config import load_config
from ms_exporter.generate.module_map import render_map
from ms_exporter.generate.rules import heading_anchor

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README_MAX_LINES = 120
# The pages whose relative links must land: the front door, the contributor's guide and every page under docs/.
LINKED_PAGES = (
    "README.md",
    "CONTRIBUTING.md",
    "deploy/README.md",
    *sorted(str(page.relative_to(ROOT)) for page in DOCS.glob("*.md")),
)


def _section(text: str, heading: str) -> str:
    """The text under `heading` up to the next heading of its level."""
    section = text[text.index(heading + "\n") :]
    level = "\n" + heading.split(" ", 1)[0] + " "
    return section[: section.index(level, 1)] if level in section[1:] else section


def _blocks(text: str, language: str) -> list[str]:
    return re.findall(rf"^```{language}\n(.*?)^```", text, re.MULTILINE | re.DOTALL)


def _anchors(page: Path) -> set[str]:
    prose = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.MULTILINE | re.DOTALL)
    return {heading_anchor(line.lstrip("#")) for line in prose.splitlines() if line.startswith("#")}


def test_the_architecture_map_is_the_one_make_generate_writes_and_names_every_module() -> None:
    page = (DOCS / "architecture.md").read_text(encoding="utf-8")
    assert render_map() in page, "run `make generate`: docs/architecture.md's module map differs from the modules"
    named = set(re.findall(r"`([\w/]+\.py)`", render_map()))
    modules = {str(path.relative_to(ROOT / "ms_exporter")) for path in (ROOT / "ms_exporter").rglob("*.py")}
    missing = sorted(module for module in modules - named if Path(module).name != "__init__.py" or "/" not in module)
    assert missing == [], f"modules of ms_exporter/ the map does not name: {missing}"


def test_every_docs_page_is_linked_from_the_index() -> None:
    index = (DOCS / "index.md").read_text(encoding="utf-8")
    linked = set(re.findall(r"\]\(([\w.-]+\.md)(?:#[\w-]*)?\)", index))
    unlisted = sorted(page.name for page in DOCS.glob("*.md") if page.name != "index.md" and page.name not in linked)
    assert unlisted == [], f"pages of docs/ that docs/index.md does not link: {unlisted}"


@pytest.mark.parametrize("page", LINKED_PAGES)
def test_relative_links_land_on_a_file_and_a_heading(page: str) -> None:
    source = ROOT / page
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", source.read_text(encoding="utf-8")):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        landed = (source.parent / path).resolve() if path else source
        if not landed.exists():
            broken.append(f"{target}: no such file")
        elif anchor and landed.suffix == ".md" and anchor not in _anchors(landed):
            broken.append(f"{target}: no such heading")
    assert broken == [], f"{page}: {broken}"


@pytest.mark.parametrize("page", LINKED_PAGES)
def test_every_make_command_in_the_docs_is_a_makefile_target(page: str) -> None:
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(encoding="utf-8"), re.MULTILINE))
    named = set(re.findall(r"`make ([\w-]+)", (ROOT / page).read_text(encoding="utf-8")))
    assert sorted(named - targets) == [], f"{page} names make targets the Makefile does not have"


def test_the_readme_is_a_short_front_door() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= README_MAX_LINES, "the README grew: move the detail to a page of docs/"
    for shown in ("make demo", "make test", "](docs/index.md)", "](CONTRIBUTING.md)", "](docs/architecture.md)"):
        assert shown in text, f"the README no longer shows {shown!r}"


def test_the_readmes_yaml_block_is_a_valid_monitor_config(tmp_path: Path) -> None:
    blocks = [
        block
        for block in _blocks((ROOT / "README.md").read_text(encoding="utf-8"), "yaml")
        if block.startswith("monitor_config:")
    ]
    assert len(blocks) == 1
    path = tmp_path / "monitor.yaml"
    path.write_text(blocks[0], encoding="utf-8")
    config = load_config(path)
    assert (config.project, config.port, config.backend) == ("bert-large-wwm-pretrain", 19420, ("prometheus", "local"))


def test_the_readmes_integration_is_python_that_hands_the_monitor_to_model_train() -> None:
    (snippet,) = _blocks((ROOT / "README.md").read_text(encoding="utf-8"), "python")
    ast.parse(snippet)
    assert "from ms_exporter import TrainingMonitor" in snippet and "callbacks=[monitor]" in snippet


def test_test_modules_import_helpers_from_tests_support_never_from_each_other() -> None:
    """A helper another module needs lives in tests/support/, so a test module can change without breaking others."""
    crossing = re.compile(r"^\s*(?:from|import)\s+tests\.(?:unit|integration)\.test_\w*", re.MULTILINE)
    offenders = sorted(
        f"{path.relative_to(ROOT)}: {match.group().strip()}"
        for folder in ("tests", "benchmarks")
        for path in (ROOT / folder).rglob("*.py")
        for match in crossing.finditer(path.read_text(encoding="utf-8"))
    )
    assert offenders == [], f"import these from tests/support/ instead: {offenders}"
