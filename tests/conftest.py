"""What every test gets: a clean MS_EXPORTER_* environment, and a checkout the suite leaves as it found it."""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.browser import ARTIFACTS_VARIABLE

ROOT = Path(__file__).resolve().parents[1]
# Folders of the checkout the suite does not watch: version control, the environments `make test` builds (under -j2,
# beside a running suite) and the caches that the tools keep on purpose (bytecode, ruff, mypy, pytest's own when its
# cache plugin is on).
_ENVIRONMENTS = {".venv", ".venv-mindformers", ".mindformers2", ".venv-py39", ".venv-py312"}
_NOT_WATCHED = {".git", *_ENVIRONMENTS, "__pycache__", ".mypy_cache", ".ruff_cache", ".pytest_cache"}
# The demo's file_sd directory is a shared place every ms_exporter job on the machine registers in
# (deploy/prometheus/prometheus.yml reads it), not something a test owns.
_SHARED_IN_TMP = {"ms-exporter-targets"}
_BEFORE = pytest.StashKey[tuple[set[str], set[str]]]()
# Hypothesis keeps its example database and caches in .hypothesis/ of the working directory the suite started in,
# and fixes that place when a module that uses it is collected: it is pointed elsewhere here, before collection (child
# processes inherit the variable). The folder is removed when the session's Python exits.
_HYPOTHESIS_HOME = tempfile.TemporaryDirectory(prefix="pytest-hypothesis-")
os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", _HYPOTHESIS_HOME.name)
try:
    from hypothesis.configuration import set_hypothesis_home_dir
except ImportError:  # an install without the test extra: no hypothesis tests either
    pass
else:
    set_hypothesis_home_dir(os.environ["HYPOTHESIS_STORAGE_DIRECTORY"])


def _checkout_paths() -> set[str]:
    found = set()
    for directory, folders, files in os.walk(ROOT):
        folders[:] = [name for name in folders if name not in _NOT_WATCHED]
        base = Path(directory).relative_to(ROOT)
        found.update(str(base / name) for name in (*folders, *files))
    return found


def _ours_in_tmp() -> set[str]:
    try:
        names = os.listdir(tempfile.gettempdir())
    except OSError:
        return set()
    return {name for name in names if name.startswith(("ms_exporter", "ms-exporter")) and name not in _SHARED_IN_TMP}


def leftovers(before: tuple[set[str], set[str]]) -> tuple[list[str], list[str]]:
    """What appeared since `before` (a `snapshot()`): in the checkout (paths relative to it; a new folder is named
    alone, not with its contents), and ms_exporter entries in the temporary directory (whole paths)."""
    checkout, tmp = before
    new = sorted(_checkout_paths() - checkout)
    tops = [path for path in new if not any(path.startswith(other + os.sep) for other in new)]
    return tops, [os.path.join(tempfile.gettempdir(), name) for name in sorted(_ours_in_tmp() - tmp)]


def snapshot() -> tuple[set[str], set[str]]:
    return _checkout_paths(), _ours_in_tmp()


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_BEFORE] = snapshot()


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """A session that leaves files in the checkout fails, naming them: `make test` must leave a clone as
    `git status --ignored` found it (run state, hang dumps, screenshots and databases go to temporary directories).
    New ms_exporter entries in /tmp are named too, as a warning only: /tmp is shared with every process on the
    machine (another session's scratch folders are there while it runs), the checkout is this session's own."""
    before = session.config.stash.get(_BEFORE, None)
    if before is None:
        return
    in_checkout, in_tmp = leftovers(before)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    write = reporter.write_line if reporter is not None else print
    if in_tmp:
        write("warning: these appeared in the temporary directory during the tests:\n  " + "\n  ".join(in_tmp))
    if in_checkout:
        names = "\n  ".join(in_checkout)
        write(f"the tests left these in the checkout ({ROOT}); write them under tmp_path:\n  {names}")
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(scope="session", autouse=True)
def _session_outside_the_checkout(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The session's working directory and tests/support/browser.py's screenshots in pytest's base temporary
    directory (pytest keeps the last three sessions' there), not in the checkout: module- and session-scoped fixtures
    start before any test's own working directory (below), and the jobs they start write ./monitor_output where
    they are started."""
    earlier = os.environ.get(ARTIFACTS_VARIABLE)
    os.environ.setdefault(ARTIFACTS_VARIABLE, str(tmp_path_factory.getbasetemp() / "test-artifacts"))
    started_in = os.getcwd()
    os.chdir(tmp_path_factory.mktemp("session-cwd"))
    yield
    os.chdir(started_in)
    if earlier is None:
        os.environ.pop(ARTIFACTS_VARIABLE, None)


@pytest.fixture(autouse=True)
def _clean_exporter_env(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory) -> None:
    """Tests must not pick up MS_EXPORTER_* settings from the machine they run on, and each runs in a working
    directory of its own: a monitor built without save_dir writes ./monitor_output there, not into the checkout
    (tests reach the checkout's files through their own ROOT, never through the working directory)."""
    for key in list(os.environ):
        if key.startswith("MS_EXPORTER_"):
            monkeypatch.delenv(key)
    logging.getLogger("ms_exporter").propagate = True
    monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))
