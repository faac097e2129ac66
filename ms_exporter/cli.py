"""The `ms-exporter` command: check-config and demo."""

from __future__ import annotations

import argparse
import sys

import yaml

from ms_exporter._version import __version__
from ms_exporter.config import ConfigError, load_config


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ms-exporter", description="Prometheus monitoring for MindSpore training.")
    parser.add_argument("--version", action="version", version=f"ms-exporter {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    check = commands.add_parser("check-config", help="validate a monitor_config file and print the effective config")
    check.add_argument("file", help="YAML file with a monitor_config block (or a bare mapping)")

    demo = commands.add_parser("demo", help="train a small Transformer with the monitor on")
    demo.add_argument("--steps", type=int, default=None, help="train this many steps (default: about --seconds)")
    demo.add_argument("--seconds", type=float, default=120.0, help="train for about this long (default 120)")
    demo.add_argument("--port", type=int, default=None, help="metrics port (default: the config's port)")
    demo.add_argument("--config", default=None, help="a monitor_config YAML file")
    demo.add_argument("--mode", choices=("graph", "pynative"), default="graph", help="MindSpore execution mode")
    demo.add_argument("--save-dir", default=None, help="where the JSONL file goes (default: the config's save_dir)")

    args = parser.parse_args(argv)
    if args.command == "check-config":
        return _check_config(args.file)
    from ms_exporter.demo import run_demo

    return run_demo(steps=args.steps, seconds=args.seconds, port=args.port, config=args.config, mode=args.mode,
                    save_dir=args.save_dir)


def _check_config(path: str) -> int:
    try:
        config = load_config(path)
    except ConfigError as exc:
        print(f"{path}: {exc}", file=sys.stderr)
        return 1
    print(f"# {path} is valid; effective configuration (defaults and MS_EXPORTER_* variables applied):")
    print(yaml.safe_dump({"monitor_config": config.to_dict()}, sort_keys=False), end="")
    return 0
