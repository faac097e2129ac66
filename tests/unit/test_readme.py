"""The README followed as written from a fresh checkout: every command names files and programs that are there, in
the order it gives them, and the cheap ones run; the demo's closing tips run as printed."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from ms_exporter import cli, demo
from ms_exporter.demo import command_name, next_steps
from tests.support.pythons import DASHBOARD_SDK, needs

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")
MAKEFILE = (ROOT / "Makefile").read_text(encoding="utf-8")
DEBIAN_PACKAGES = re.search(r"^DEBIAN_PACKAGES := (.+)$", MAKEFILE, re.M).group(1).split()  # one line in the Makefile
MAKE_TARGETS = set(re.findall(r"^([a-z][a-z-]*):", MAKEFILE, re.M))
VENV_SCRIPT = ".venv/bin/ms-exporter"
CHEAP = {"rules", "dashboard", "check-config"}  # subcommands that read a file and print: run by the test


def shell_lines(text: str) -> list[str]:
    """The command lines of the text's ```bash blocks, continuation lines joined."""
    lines: list[str] = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if line.strip():
                lines.append(line.strip())
    return lines


def inline_invocations(text: str) -> list[str]:
    """`ms-exporter ...` spans in the prose with arguments after the subcommand: a command to type, not a name."""
    spans = re.findall(r"`((?:\.venv/bin/)?ms-exporter [^`]+)`", text)
    return [span for span in spans if len(shlex.split(span)) > 2]


def words(line: str) -> list[str]:
    """The line's words without its comment, a trailing `&` and what a `>` writes to."""
    found = shlex.split(line, comments=True)
    if found and found[-1] == "&":
        found.pop()
    return found[: found.index(">")] if ">" in found else found


def paths_named(argv: list[str]) -> list[str]:
    """Arguments that name a file of the checkout (relative paths; outputs after -o are written, not read)."""
    named = []
    for index, word in enumerate(argv[1:], start=1):
        value = word.split("=", 1)[1] if word.startswith("--") and "=" in word else word
        if argv[index - 1] in {"-o", "--output"} or value.startswith(("/", "http", "-")):
            continue
        if "/" not in value and not value.endswith((".yaml", ".yml", ".py", ".json")):
            continue
        named.append(value)
    return named


def script() -> Path:
    """The venv's ms-exporter the README means: the checkout's .venv, else the one beside this Python."""
    here = ROOT / VENV_SCRIPT
    return here if here.is_file() else Path(sys.executable).parent / "ms-exporter"


def test_every_command_in_the_readme_names_what_a_fresh_checkout_has_in_the_order_it_needs_it() -> None:
    problems = []
    debian_installed_at = None
    lines = shell_lines(README)
    for number, line in enumerate(lines):
        argv = words(line)
        if not argv:
            continue
        program = argv[0]
        if program == "make":
            problems += [f"{line}: no make target {t}" for t in argv[1:] if t not in MAKE_TARGETS]
            if "debian-packages" in argv[1:] and debian_installed_at is None:
                debian_installed_at = number
        elif program == "ms-exporter":
            problems.append(f"{line}: `ms-exporter` is not on a fresh checkout's PATH; {VENV_SCRIPT} is")
        elif program == VENV_SCRIPT:
            if argv[1] not in cli.COMMANDS:
                problems.append(f"{line}: no subcommand {argv[1]}")
        elif program in DEBIAN_PACKAGES:
            if debian_installed_at is None:
                problems.append(f"{line}: {program} is used before a line that installs it (make debian-packages)")
        elif program != "python3":
            problems.append(f"{line}: {program} is neither the venv's, a make target nor a Debian package")
        problems += [f"{line}: no {path} in the checkout" for path in paths_named(argv) if not (ROOT / path).exists()]
    for span in inline_invocations(README):
        argv = words(span)
        if argv[0] != VENV_SCRIPT:
            problems.append(f"`{span}`: `ms-exporter` is not on a fresh checkout's PATH; {VENV_SCRIPT} is")
        problems += [f"`{span}`: no {path} in the checkout" for path in paths_named(argv) if not (ROOT / path).exists()]
    assert problems == []
    assert debian_installed_at is not None, "the alert recipe needs Prometheus and Alertmanager: say how to install"


@pytest.mark.parametrize(
    "line",
    [
        pytest.param(line, marks=needs(DASHBOARD_SDK)) if words(line)[1] == "dashboard" else line
        for line in sorted(
            {
                line
                for line in shell_lines(README) + inline_invocations(README)
                if words(line)[0] == VENV_SCRIPT and words(line)[1] in CHEAP
            }
        )
    ],
)
def test_the_readmes_ms_exporter_commands_that_read_a_file_run_as_written(line: str) -> None:
    argv = words(line)
    done = subprocess.run(
        [str(script()), *argv[1:]], cwd=ROOT, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, f"{line}\n{done.stderr[-2000:]}"
    assert done.stdout.strip(), line


def test_the_readme_names_at_least_the_rules_dashboard_and_check_config_commands() -> None:
    ran = {words(line)[1] for line in shell_lines(README) + inline_invocations(README) if words(line)[0] == VENV_SCRIPT}
    assert ran >= CHEAP


def test_the_demos_closing_tips_run_as_printed_from_where_it_ran(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    jsonl = "monitor_output/demo-1/metrics-rank0.jsonl"
    for where in (ROOT, tmp_path):
        monkeypatch.chdir(where)
        command = command_name()
        program = shlex.split(command)[0]
        # as printed: a path from here to the script, its whole path, or a name this shell's PATH finds
        assert (where / program).is_file() or shutil.which(program) is not None, (where, command)
        printed = next_steps("http://127.0.0.1:19420/metrics", jsonl)
        tips = [line.strip() for line in printed[1:] if not line.strip().startswith("Prometheus")]
        assert all(tip.startswith(command + " ") for tip in tips), (command, tips)
        argv = [words(tip)[len(shlex.split(command)) :] for tip in tips]
        assert [a[:2] for a in argv] == [["report", jsonl], ["top", "127.0.0.1:19420"]]
        assert all(a[0] in cli.COMMANDS for a in argv)
    if Path(sys.executable).parent / "ms-exporter" == ROOT / VENV_SCRIPT:  # the checkout's venv: the README's spelling
        monkeypatch.chdir(ROOT)
        assert command_name() == VENV_SCRIPT


def test_a_stalled_demo_says_how_to_stop_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(demo, "STALL_SECONDS", 0.0)  # the real one sleeps a day
    inject = demo.injector("stall", 0.0)
    arguments = SimpleNamespace(cur_step_num=7)
    inject.on_train_step_begin(SimpleNamespace(original_args=lambda: arguments))
    printed = capsys.readouterr().out
    assert "injecting 'stall' at step 7" in printed
    assert "Ctrl-C" in printed and f"`kill {os.getpid()}`" in printed
