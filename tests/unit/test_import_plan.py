"""The import plan: every import inside ms_exporter/ (module level, inside functions and under TYPE_CHECKING
alike) goes to its own folder or to a lower layer, and no set of modules imports itself round; the same of
benchmarks/, whose entry points nothing imports and whose shared helpers come from benchmarks/report.py and
tests/support (never the other way).

The layers, lowest first, are docs/architecture.md's "Layers" table; this test holds the table and the code to
each other."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "ms_exporter"
BENCHMARKS = ROOT / "benchmarks"
# The benchmarks that are commands only (`make bench`, `make bench-compare`): no module imports them.
BENCHMARK_ENTRY_POINTS = {"benchmarks.run", "benchmarks.compare"}

# Lowest first. A module may import its own folder and any folder of a lower layer, nothing else.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("_version", "core"),
    ("config",),
    ("cells",),
    ("endpoint",),
    ("probes",),
    ("features",),
    ("sinks",),
    ("actions",),
    ("monitor",),
    ("generate", "tools"),
    ("mindformers", "mindformers_register", "demo"),
    ("__init__",),
    ("cli",),
    ("__main__",),
)
LAYER_OF = {part: index for index, parts in enumerate(LAYERS) for part in parts}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__" and len(parts) > 1:
        parts.pop()
    return ".".join(parts)


def _modules(folder: Path = PACKAGE) -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(folder.rglob("*.py"))}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules that `name` imports, a `from package import submodule` read as the submodule."""
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base)
    return {target for target in found if target in known and target != name}


def _graph(folder: Path = PACKAGE) -> dict[str, set[str]]:
    modules = _modules(folder)
    known = set(modules)
    return {name: _imports(name, path, known) for name, path in modules.items()}


def _top_level_imports(folder: Path) -> set[tuple[str, str]]:
    """(module, first name of what it imports) for every import in `folder`: which packages it reaches into."""
    found = set()
    for name, path in _modules(folder).items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found.update((name, alias.name.split(".")[0]) for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                found.add((name, node.module.split(".")[0]))
    return found


def _place(module: str) -> str:
    """The folder (or top-level module) a module belongs to: ms_exporter.core.store -> core."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_folder_and_top_level_module_has_a_layer() -> None:
    places = {_place(module) for module in _modules()}
    assert places - set(LAYER_OF) == set(), "give each new folder a layer here and in docs/architecture.md"
    assert set(LAYER_OF) - places == set(), "a layer names a folder that is gone"


def test_no_import_runs_back_up_a_layer() -> None:
    upward = []
    for module, targets in _graph().items():
        for target in targets:
            here, there = _place(module), _place(target)
            if here != there and LAYER_OF[there] >= LAYER_OF[here]:
                upward.append(f"{module} -> {target}")
    assert upward == []


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components: each component of two or more modules is a circle."""
    circles = []
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph[node]:
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                circles.append(sorted(component))

    for node in graph:
        if node not in index:
            visit(node)
    return circles


def test_no_circle_of_imports() -> None:
    assert _circles(_graph()) == []


def test_the_circle_finder_finds_a_circle() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_circle_of_imports_in_the_benchmarks_and_no_benchmark_imports_an_entry_point() -> None:
    graph = _graph(BENCHMARKS)
    assert _circles(graph) == []
    assert set(graph) >= BENCHMARK_ENTRY_POINTS
    back = sorted(
        f"{module} -> {target}" for module, targets in graph.items() for target in targets & BENCHMARK_ENTRY_POINTS
    )
    assert back == [], "an entry point is a command; what others need of it belongs in benchmarks/report.py"


def test_the_package_and_the_test_helpers_never_import_the_benchmarks() -> None:
    # One way only: benchmarks use ms_exporter and tests/support; neither uses a benchmark.
    reach = _top_level_imports(PACKAGE) | _top_level_imports(ROOT / "tests" / "support")
    assert sorted(module for module, target in reach if target == "benchmarks") == []
    assert sorted(module for module, target in _top_level_imports(PACKAGE) if target == "tests") == []


def test_the_architecture_page_lists_the_same_layers() -> None:
    page = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    section = page[page.index("## Layers") :]
    rows = re.findall(r"^\| (\d+) \| ([^|]+) \|", section, re.MULTILINE)
    documented = {int(number): tuple(re.findall(r"`([\w]+)(?:/|\.py)?`", cells)) for number, cells in rows}
    assert documented == {number: parts for number, parts in enumerate(LAYERS)}


def test_the_test_sees_an_upward_import() -> None:
    # The reader itself: a base module that imported the callback would be found.
    graph = _graph()
    assert "ms_exporter.core.store" in graph["ms_exporter.core.phases"]
    assert LAYER_OF[_place("ms_exporter.monitor.callback")] > LAYER_OF[_place("ms_exporter.core.phases")]


def test_core_and_config_do_not_import_mindspore_at_module_level() -> None:
    # The operator commands (check-config, rules, top ...) import these on a machine without MindSpore.
    heavy = []
    for folder in ("core", "config"):
        for path in (PACKAGE / folder).rglob("*.py"):
            for node in ast.parse(path.read_text(encoding="utf-8")).body:
                names = [alias.name for alias in node.names] if isinstance(node, ast.Import) else []
                if isinstance(node, ast.ImportFrom) and node.module:
                    names = [node.module]
                heavy += [f"{path.relative_to(ROOT)}: {name}" for name in names if name.split(".")[0] == "mindspore"]
    assert heavy == []
