"""The `ms-exporter` command: check-config, rules, dashboard, kubernetes, top, hangs, checksums, report, triage,
peak-flops and demo."""

from __future__ import annotations

import argparse
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass

import yaml

from ms_exporter._version import __version__
from ms_exporter.config import ConfigError, MonitorConfig, load_config, read_config
from ms_exporter.core.analysis.flops import from_shape
from ms_exporter.tools.peak_flops import DTYPES
from ms_exporter.tools.triage import DEFAULT_SLOW_BELOW, DEFAULT_WINDOW

# `make demo`'s run: about 3 minutes (193 s measured) at ~22 ms a step on 2 idle cores. A planned length (not a
# time limit) lets the LR schedule decay over the run and the dashboard's ETA be right; here, not in demo.py, so
# that the command line parses without numpy (an operator-only install).
DEMO_STEPS = 8000
# The Grafana Foundation SDK, which builds the dashboard (`dashboard`, `kubernetes`), supports Python 3.11 on, and
# pyproject.toml installs it there only; everything else runs on 3.9.
DASHBOARD_SDK_PYTHON = (3, 11)


@dataclass(frozen=True)
class _Command:
    """A subcommand: its one-line help, what adds its arguments and what runs it (with its own parser, whose
    error() reports a bad argument found after parsing)."""

    help: str
    arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace, argparse.ArgumentParser], int]
    description: str | None = None
    training_side: bool = False  # needs MindSpore and numpy, which an operator-only install lacks
    dashboard: bool = False  # builds the Grafana dashboard: needs the Grafana Foundation SDK


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ms-exporter", description="Prometheus monitoring for MindSpore training.")
    parser.add_argument("--version", action="version", version=f"ms-exporter {__version__}")
    subparsers = parser.add_subparsers(dest="command", required=True)
    parsers = {}
    for name, command in COMMANDS.items():
        parsers[name] = subparsers.add_parser(name, help=command.help, description=command.description)
        command.arguments(parsers[name])
    args = parser.parse_args(argv)
    command = COMMANDS[args.command]
    if command.training_side:
        from ms_exporter import MissingDependencyError, _require_training_side

        try:
            _require_training_side(f"ms-exporter {args.command}")
        except MissingDependencyError as exc:  # an operator-only install: say what to add, not a traceback
            print(exc, file=sys.stderr)
            return 1
    if command.dashboard:
        problem = _dashboard_sdk_problem(f"ms-exporter {args.command}")
        if problem:  # Python 3.9 or 3.10: say why, not a traceback
            print(problem, file=sys.stderr)
            return 1
    return command.run(args, parsers[args.command])


def _dashboard_sdk_problem(user: str) -> str | None:
    """Why `user` cannot build the dashboard here, or None when it can."""
    if sys.version_info < DASHBOARD_SDK_PYTHON:
        need = ".".join(map(str, DASHBOARD_SDK_PYTHON))
        here = ".".join(map(str, sys.version_info[:3]))
        return (
            f"{user} needs Python >= {need}: the dashboard is built with the Grafana Foundation SDK "
            f"(grafana-foundation-sdk), which supports Python {need} and later, and this is Python {here}. "
            f"Run it under Python >= {need}; the repository's deploy/ holds what it writes with the default thresholds."
        )
    if importlib.util.find_spec("grafana_foundation_sdk") is None:
        return (
            f"{user} needs the Grafana Foundation SDK, which is not installed here: pip install ms-exporter again "
            "(it depends on grafana-foundation-sdk on Python >= 3.11)"
        )
    return None


# -- check-config ----------------------------------------------------------------------------------------------------


def _check_config_arguments(check: argparse.ArgumentParser) -> None:
    check.add_argument("file", help="YAML file with a monitor_config block (or a bare mapping)")


def _check_config(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    path = args.file
    try:
        config, notes = read_config(path)
    except ConfigError as exc:
        print(f"{path}: {exc}", file=sys.stderr)
        return 1
    print(f"# {path} is valid; effective configuration (defaults and MS_EXPORTER_* variables applied):")
    for note in notes:
        print(f"# {note}")
    print(yaml.safe_dump({"monitor_config": config.redacted()}, sort_keys=False), end="")
    shape = config.flops.model.shape()
    length = config.flops.model.seq_length
    if shape is not None:  # so that a description can be checked against the model it means (docs/mfu.md)
        at = (
            f"; {from_shape(shape).per_token_at(length):.4g} training FLOPs per token of a full {length}-token sequence"
            if length
            else ""
        )
        print(
            f"# flops.model: {shape.parameters():,} parameters, {shape.matmul_weights():,} of them multiplied "
            f"per token{at}"
        )
    return 0


# -- demo --------------------------------------------------------------------------------------------------------------


def _demo_arguments(demo: argparse.ArgumentParser) -> None:
    demo.add_argument(
        "--steps",
        type=int,
        default=DEMO_STEPS,
        help=f"the run's length in steps, which its LR schedule and ETA follow (default {DEMO_STEPS}, "
        "about 3 minutes on 2 idle cores)",
    )
    demo.add_argument("--seconds", type=float, default=None, help="stop early after this many seconds")
    demo.add_argument("--port", type=int, default=None, help="metrics port (default: the config's port)")
    demo.add_argument("--config", default=None, help="a monitor_config YAML file")
    demo.add_argument("--mode", choices=("graph", "pynative"), default="graph", help="MindSpore execution mode")
    demo.add_argument("--save-dir", default=None, help="where the JSONL file goes (default: the config's save_dir)")
    demo.add_argument(
        "--inject",
        choices=("nan", "stall", "slow", "leak", "crash"),
        default=None,
        help="after a healthy start, turn faulty: a NaN loss, a stall, slow steps, a memory leak or a SIGKILL "
        "(each leads to an alert: README.md, 'Alerts and dashboards')",
    )
    demo.add_argument(
        "--inject-after",
        type=float,
        default=60.0,
        help="seconds of healthy training before --inject (default 60: Prometheus has scraped the run by then)",
    )


def _demo(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from ms_exporter.demo import run_demo

    return run_demo(
        steps=args.steps,
        seconds=args.seconds,
        port=args.port,
        config=args.config,
        mode=args.mode,
        save_dir=args.save_dir,
        inject=args.inject,
        inject_after=args.inject_after,
    )


# -- rules, dashboard, kubernetes ---------------------------------------------------------------------------------


def _rules_arguments(rules: argparse.ArgumentParser) -> None:
    rules.add_argument("--config", default=None, help="take thresholds from this monitor_config file")
    rules.add_argument(
        "--timing",
        choices=("default", "test"),
        default="default",
        help="'test' shrinks every window and for: to seconds (integration tests, demos)",
    )
    rules.add_argument("--job-regex", default=".*mindspore.*", help="Prometheus job(s) whose `up` RankDown watches")
    rules.add_argument(
        "--runbook-url",
        dest="runbook_url",
        default=None,
        metavar="URL",
        help="the page that serves docs/alerts.md (a repository host renders one with a heading anchor "
        "per alert); each alert's runbook_url links to its section (default: the config's "
        "runbook_url, else the relative docs/alerts.md)",
    )
    rules.add_argument("-o", "--output", default=None, help="write here instead of standard output")


def _dashboard_arguments(dashboard: argparse.ArgumentParser) -> None:
    dashboard.add_argument("-o", "--output", default=None, help="write here instead of standard output")
    dashboard.add_argument(
        "--config", default=None, help="draw the threshold lines of this monitor_config file (default: the defaults)"
    )


def _kubernetes_arguments(kubernetes: argparse.ArgumentParser) -> None:
    kubernetes.add_argument("--config", default=None, help="take alert thresholds from this monitor_config file")
    kubernetes.add_argument(
        "--runbook-url",
        dest="runbook_url",
        default=None,
        metavar="URL",
        help="the page that serves docs/alerts.md, as for `ms-exporter rules`",
    )
    kubernetes.add_argument(
        "-o",
        "--output-dir",
        default="deploy/kubernetes/base",
        help="directory for prometheusrule.yaml and grafana-dashboard.yaml (default: deploy/kubernetes/base)",
    )


def _rules(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from ms_exporter.config.alert_thresholds import thresholds_of
    from ms_exporter.generate.rules import TEST_TIMING, Timing, render_rules, render_yaml

    config = _config_or_none(args.config)
    if config is None:
        return 1
    text = render_yaml(
        render_rules(
            thresholds_of(config),
            TEST_TIMING if args.timing == "test" else Timing(),
            job_regex=args.job_regex,
            runbook_base=_runbook(args, config),
        )
    )
    _write(text, args.output)
    return 0


def _runbook(args: argparse.Namespace, config: MonitorConfig) -> str:
    """--runbook-url, else the config's runbook_url, else the repository-relative docs/alerts.md."""
    from ms_exporter.generate.rules import RUNBOOK

    return args.runbook_url or config.runbook_url or RUNBOOK


def _dashboard(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from ms_exporter.config.alert_thresholds import thresholds_of
    from ms_exporter.generate.dashboard import render_dashboard, render_json

    config = _config_or_none(args.config)
    if config is None:
        return 1
    _write(render_json(render_dashboard(thresholds_of(config))), args.output)
    return 0


def _kubernetes(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    import os

    from ms_exporter.config.alert_thresholds import thresholds_of
    from ms_exporter.generate.dashboard import render_dashboard, render_json
    from ms_exporter.generate.kubernetes import render_dashboard_configmap, render_manifest, render_prometheus_rule
    from ms_exporter.generate.rules import Timing, render_rules

    config = _config_or_none(args.config)
    if config is None:
        return 1
    thresholds = thresholds_of(config)
    rules = render_rules(thresholds, Timing(), runbook_base=_runbook(args, config))
    generator = "ms-exporter kubernetes"
    os.makedirs(args.output_dir, exist_ok=True)
    _write(
        render_manifest(render_prometheus_rule(rules), generator), os.path.join(args.output_dir, "prometheusrule.yaml")
    )
    _write(
        render_manifest(render_dashboard_configmap(render_json(render_dashboard(thresholds))), generator),
        os.path.join(args.output_dir, "grafana-dashboard.yaml"),
    )
    print(f"wrote prometheusrule.yaml and grafana-dashboard.yaml in {args.output_dir}")
    return 0


# -- top, hangs -------------------------------------------------------------------------------------------------------


def _top_arguments(top: argparse.ArgumentParser) -> None:
    top.add_argument(
        "targets",
        nargs="+",
        metavar="TARGET",
        help="http[s]://host:port[/path] (path default /metrics), host:port, or a directory of "
        "Prometheus file_sd *.json files (re-read every poll) or one such file",
    )
    top.add_argument(
        "--once",
        action="store_true",
        help="print the table once as plain text and exit (status 1 when a target is down)",
    )
    top.add_argument("--interval", type=float, default=2.0, help="seconds between polls (default 2)")
    top.add_argument("--timeout", type=float, default=2.0, help="seconds to wait for each endpoint (default 2)")
    top.add_argument(
        "--stale-seconds", type=float, default=60.0, help="a rank without a step for longer is flagged (default 60)"
    )
    top.add_argument(
        "--scheme",
        choices=("http", "https"),
        default="http",
        help="for host:port and file_sd targets (default http; file_sd __scheme__ labels win)",
    )
    top.add_argument("--user", default=None, help="basic auth user (the endpoint's web.basic_auth_users)")
    top.add_argument(
        "--password",
        default=None,
        help="basic auth password; better: the MS_EXPORTER_TOP_PASSWORD environment variable",
    )
    top.add_argument("--cafile", default=None, help="CA certificate(s) that sign the endpoints' TLS certificates")
    top.add_argument("--insecure", action="store_true", help="do not verify the endpoints' TLS certificates")
    top.add_argument("--cert", default=None, help="client certificate, for web.client_auth_type")
    top.add_argument("--key", default=None, help="the client certificate's private key")


def _top(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from ms_exporter.tools.top import run_top

    return run_top(args, parser.error)


def _hangs_arguments(hangs: argparse.ArgumentParser) -> None:
    _endpoint_arguments(
        hangs,
        "http[s]://host:port[/path], host:port, a directory of Prometheus file_sd *.json files, "
        "or a rank's save_dir (the hang-rank*.txt dumps it left)",
    )


def _endpoint_arguments(parser: argparse.ArgumentParser, targets: str) -> None:
    """The targets, timeout and scheme of the commands that read each rank's endpoint once (hangs, checksums)."""
    parser.add_argument("targets", nargs="+", metavar="TARGET", help=targets)
    parser.add_argument("--timeout", type=float, default=5.0, help="seconds to wait for each endpoint (default 5)")
    parser.add_argument(
        "--scheme", choices=("http", "https"), default="http", help="for host:port and file_sd targets (default http)"
    )


def _hangs(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from ms_exporter.tools.hangs import run_hangs

    return run_hangs(args, parser.error)


def _checksums_arguments(checksums: argparse.ArgumentParser) -> None:
    _endpoint_arguments(
        checksums,
        "the ranks of a replica group: http[s]://host:port[/path], host:port, or a directory of Prometheus "
        "file_sd *.json files",
    )
    checksums.add_argument(
        "--local-grad-factor",
        type=float,
        default=1000.0,
        help="a local gradient norm more than this many times the others' median at a step is named (default 1000)",
    )


def _checksums(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from ms_exporter.tools.checksums import run_checksums

    return run_checksums(args, parser.error)


# -- report ----------------------------------------------------------------------------------------------------------


def _report_arguments(report: argparse.ArgumentParser) -> None:
    report.add_argument(
        "files",
        nargs="+",
        help="metrics-rank<r>.jsonl files (backend: local); rotated pieces of "
        "one file (.jsonl.1, .2 ...) are read as one run",
    )
    report.add_argument("-o", "--output", default="report.html", help="the HTML file to write (default report.html)")
    report.add_argument(
        "--hang-min-seconds",
        type=float,
        default=None,
        metavar="S",
        help="a pause between steps counts as a stall past max(S, hang.factor x the recent step "
        "cycle), as the monitor's hang deadline (default: hang.min_seconds' default, 120)",
    )


def _report(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from ms_exporter.config import HangConfig
    from ms_exporter.tools.report import ReportError, holds, summary, write_report

    try:
        hang = HangConfig() if args.hang_min_seconds is None else HangConfig(min_seconds=args.hang_min_seconds)
        runs = write_report(args.files, args.output, hang)
    except (ReportError, OSError) as exc:
        print(f"ms-exporter report: {exc}", file=sys.stderr)
        return 1
    for line in holds(runs):
        print(line)
    for run in runs:
        facts = summary(run, hang)
        stalled = "".join(f", stalled {stall['seconds']:.0f} s at step {stall['step']}" for stall in facts["stalls"])
        lost = (
            f", {facts['dropped_records']} records lost (not written: the writer fell behind or the disk was full)"
            if facts["dropped_records"]
            else ""
        )
        unreadable = f"; {facts['skipped']}" if facts["skipped"] else ""
        time = facts["time"]
        goodput = (
            f", {100 * time['productive'] / sum(time.values()):.1f}% of {sum(time.values()):.0f} s productive"
            f" ({facts['restarts']} restarts)"
            if time and sum(time.values()) > 0
            else ""
        )
        mfu = f", MFU p50 {100 * facts['mfu_p50']:.1f}%" if facts["mfu_p50"] is not None else ""
        early = facts["early_stop"]
        stopped = ""
        if early is not None:
            stopped = f", stopped on purpose by early stop at step {early['step']} ({early['reason']})"
        print(
            f"{run.label}: {facts['steps']} steps, final loss {facts['final_loss']}, min loss {facts['min_loss']}"
            f"{mfu}{goodput}{stopped}{stalled}{lost}{unreadable}"
        )
    print(f"wrote {args.output}")
    return 0


# -- triage ----------------------------------------------------------------------------------------------------------


def _triage_arguments(triage: argparse.ArgumentParser) -> None:
    triage.add_argument(
        "dirs",
        nargs="+",
        metavar="DIR",
        help="directories searched for runs: the JSON Lines files of backend: local and the event files of "
        "backend: tensorboard (save_dir/tensorboard/<run>/rank<r>), in any save_dir below; symlinks are not followed",
    )
    triage.add_argument("--html", default=None, metavar="PATH", help="also write the table as one HTML page here")
    triage.add_argument(
        "--loss-above",
        type=float,
        default=None,
        metavar="X",
        help="a run whose final loss (the mean of its last --window steps) is above X failed (default: not judged)",
    )
    triage.add_argument(
        "--window",
        type=int,
        default=DEFAULT_WINDOW,
        metavar="N",
        help=f"the last steps the final loss and the loss's swing are taken over (default {DEFAULT_WINDOW})",
    )
    triage.add_argument(
        "--slow-below",
        type=float,
        default=DEFAULT_SLOW_BELOW,
        metavar="F",
        help="a run whose median tokens/s (samples/s without tokens) is under F x the other runs' median is slow "
        f"(default {DEFAULT_SLOW_BELOW:g}; 0: never)",
    )


def _triage(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    from ms_exporter.tools.triage import run_triage

    return run_triage(args, parser.error)


# -- peak-flops ------------------------------------------------------------------------------------------------------


def _peak_flops_arguments(peak: argparse.ArgumentParser) -> None:
    peak.add_argument("--size", type=int, default=1024, help="square matrices of this size (default 1024)")
    peak.add_argument(
        "--dtype", choices=DTYPES, default="float32", help="the precision training uses (default float32)"
    )
    peak.add_argument("--device", default=None, help="MindSpore device_target (default: MindSpore's own choice)")


def _peak_flops(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    import mindspore

    from ms_exporter.tools.peak_flops import measure_matmul_flops

    if args.device:
        mindspore.set_device(args.device)
    flops = measure_matmul_flops(args.size, args.dtype)
    device = mindspore.get_context("device_target")
    print(
        f"# best of 5 rounds of {args.size}x{args.size} {args.dtype} matmuls on {device}: "
        f"{flops / 1e9:,.1f} GFLOP/s\nflops:\n  peak_flops_per_device: {flops:.4g}"
    )
    return 0


# -- shared ----------------------------------------------------------------------------------------------------------


def _config_or_none(path: str | None) -> MonitorConfig | None:
    """The config for a generator, or None after printing what is wrong with it."""
    try:
        return load_config(path)
    except ConfigError as exc:
        print(f"{path}: {exc}", file=sys.stderr)
        return None


def _write(text: str, path: str | None) -> None:
    if path:
        with open(path, "w", encoding="utf-8") as out:
            out.write(text)
    else:
        print(text, end="")


# Subcommand name -> what it is; the order is `ms-exporter --help`'s.
COMMANDS: dict[str, _Command] = {
    "check-config": _Command(
        "validate a monitor_config file and print the effective config", _check_config_arguments, _check_config
    ),
    "demo": _Command("train a small Transformer with the monitor on", _demo_arguments, _demo, training_side=True),
    "rules": _Command("print the Prometheus recording and alerting rules", _rules_arguments, _rules),
    "dashboard": _Command("print the Grafana dashboard JSON", _dashboard_arguments, _dashboard, dashboard=True),
    "kubernetes": _Command(
        "write the generated Kubernetes manifests (PrometheusRule, Grafana dashboard ConfigMap)",
        _kubernetes_arguments,
        _kubernetes,
        dashboard=True,
    ),
    "top": _Command(
        "a live table of every rank's /metrics (step, loss, speed, alerts)",
        _top_arguments,
        _top,
        description="Polls each rank's endpoint and shows one row per rank; the rank the job waits for "
        "is marked '>' (docs/top.md).",
    ),
    "hangs": _Command(
        "where each rank is stuck and which rank the others wait for (docs/hangs.md)",
        _hangs_arguments,
        _hangs,
        description="Reads each rank's phase, time in it, hang deadline and top frame, live from its "
        "endpoint or from the hang dumps in its save_dir, and names the rank(s) the job "
        "waits for. Exit status 1 when a rank is past its deadline.",
    ),
    "checksums": _Command(
        "the step and the tensor at which replicas first held other bits (docs/sdc.md)",
        _checksums_arguments,
        _checksums,
        description="Reads each rank's /debug/checksums (the replica checks' window of per-tensor bit sums) and "
        "names, per replica group, the first step they all kept at which one tensor differs, and the ranks that "
        "differ. Exit status 1 when one does.",
    ),
    "report": _Command("render finished runs' JSON Lines into one static HTML report", _report_arguments, _report),
    "triage": _Command(
        "flag the failed, unstable, stalled and slow runs among many (docs/triage.md)",
        _triage_arguments,
        _triage,
        description="Reads every run under the directories (JSON Lines and TensorBoard event files) and flags "
        "the runs that failed, are unstable, stalled or slow against the others, with the reason, as a table "
        "(and an HTML page with --html). Exit status 0 whether or not a run is flagged.",
    ),
    "peak-flops": _Command(
        "measure a MindSpore matrix multiply's FLOPs per second here",
        _peak_flops_arguments,
        _peak_flops,
        training_side=True,
        description="Prints the best FLOPs per second of MindSpore's matmul on this machine's "
        "device: a practical flops.peak_flops_per_device where no datasheet figure "
        "applies, such as a CPU (docs/mfu.md).",
    ),
}
