"""The `ms-exporter` command: one table of subcommands, each with its arguments and the function that runs it."""

from __future__ import annotations

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
