"""The `ms-exporter` command: one table of subcommands, each with its arguments and the function that runs it."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ms_exporter import cli


def test_the_table_is_the_command_line() -> None:
    # The module docstring names every subcommand; --help lists them in the table's order.
    assert set(cli.COMMANDS) == {
        "check-config",
        "rules",
        "dashboard",
        "kubernetes",
        "top",
        "hangs",
        "checksums",
        "report",
        "triage",
        "peak-flops",
        "demo",
    }
    assert all(name in (cli.__doc__ or "") for name in cli.COMMANDS)
    # Only these need MindSpore: the others run in an operator-only install.
    assert {name for name, command in cli.COMMANDS.items() if command.training_side} == {"demo", "peak-flops"}


@pytest.mark.parametrize("name", list(cli.COMMANDS))
def test_each_subcommand_has_its_help(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main([name, "--help"])
    assert exited.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: ms-exporter {name} ")
    description = cli.COMMANDS[name].description
    assert description is None or description.split()[0] in out


def test_main_help_lists_the_subcommands_in_order(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    positions = [out.index(f"    {name} ") for name in cli.COMMANDS]
    assert positions == sorted(positions)


def test_a_bad_argument_found_after_parsing_is_the_subcommands_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    # top and hangs check their targets after parsing, through the parser handed to them.
    with pytest.raises(SystemExit) as exited:
        cli.main(["hangs", "/nonexistent-target-dir"])
    assert exited.value.code == 2
    assert "ms-exporter hangs: error: '/nonexistent-target-dir'" in capsys.readouterr().err


@pytest.mark.parametrize("name", [name for name, command in cli.COMMANDS.items() if command.dashboard])
def test_a_dashboard_command_below_the_sdks_python_says_which_python_it_needs(
    name: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    # The floor one minor above the running Python: on 3.9 and 3.10 the real case, on 3.11 on the same path.
    floor = (sys.version_info[0], sys.version_info[1] + 1)
    monkeypatch.setattr(cli, "DASHBOARD_SDK_PYTHON", floor)
    out = tmp_path / "out"
    assert cli.main([name, "-o" if name == "dashboard" else "--output-dir", str(out)]) == 1
    said = capsys.readouterr()
    need = f"{floor[0]}.{floor[1]}"
    assert said.err.startswith(f"ms-exporter {name} needs Python >= {need}: the dashboard is built with the Grafana")
    assert f"this is Python {sys.version_info[0]}.{sys.version_info[1]}." in said.err
    assert not out.exists() and said.out == ""


def test_only_the_dashboard_commands_need_the_dashboard_sdk() -> None:
    assert {name for name, command in cli.COMMANDS.items() if command.dashboard} == {"dashboard", "kubernetes"}
