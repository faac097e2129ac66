"""Where numbers go. Sinks read the MetricStore; probes never import them.

`build_sinks` is the one place that decides which sinks a configuration gets: adding a sink means a `Sink`
subclass in this package and one branch here.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from ms_exporter.config import ConfigError, MonitorConfig
from ms_exporter.core.errors import Breaker, OnError
from ms_exporter.core.ranks import RankInfo
from ms_exporter.core.sink import Sink
from ms_exporter.core.store import MetricStore

if TYPE_CHECKING:
    from ms_exporter.endpoint.live_history import StepHistory
    from ms_exporter.endpoint.pages import Stacks
    from ms_exporter.sinks.prometheus import PrometheusEndpoint

logger = logging.getLogger("ms_exporter")


def build_sinks(
    config: MonitorConfig,
    store: MetricStore,
    rank: RankInfo,
    on_error: OnError,
    breaker: Breaker,
    stacks: Stacks | None = None,
) -> list[Sink]:
    """The sinks `config` asks for, in the order of `backend`, then file_sd and the Pushgateway.

    A sink that cannot start (no address to bind, an unreachable OTLP setting) is counted and left out: training
    goes on without it. A missing optional package raises ConfigError: that is the user's install to fix.
    """
    sinks: list[Sink] = []
    try:
        _build_into(sinks, config, store, rank, on_error, breaker, stacks)
    except BaseException:
        for sink in sinks:  # the monitor is not constructed: release the port, the files and threads it took
            with contextlib.suppress(Exception):
                sink.close()
        raise
    return sinks


def _build_into(
    sinks: list[Sink],
    config: MonitorConfig,
    store: MetricStore,
    rank: RankInfo,
    on_error: OnError,
    breaker: Breaker,
    stacks: Stacks | None,
) -> None:
    port: int | None = None  # the port the endpoint really got
    for backend in config.backend:
        if backend == "prometheus":
            served = _prometheus(config, store, rank, on_error, stacks)
            if served is not None:
                port = served[0].port
                sinks.extend(served)
        elif backend == "local":
            from ms_exporter.sinks.jsonl import JsonlWriter

            sinks.append(
                JsonlWriter(
                    store,
                    config.save_dir,
                    rank.rank,
                    config.project,
                    config.interval,
                    config.max_file_mb,
                    config.max_files,
                    on_error,
                    breaker,
                )
            )
        elif backend == "otlp":
            sinks.extend(_otlp(config, store, rank, on_error))
        elif backend == "tensorboard" and (rank.rank == 0 or config.tensorboard.all_ranks):
            sinks.extend(_tensorboard(config, store, rank, on_error, breaker))
        elif backend == "wandb" and (rank.rank == 0 or config.wandb.all_ranks):
            sinks.append(_wandb(config, store, rank, on_error, breaker))
    if config.file_sd_dir and port is not None:
        sinks.extend(_file_sd(config.file_sd_dir, config, rank, port, on_error))
    if config.pushgateway.url:
        from ms_exporter.sinks.pushgateway import PushgatewaySink

        sinks.append(PushgatewaySink(store, config.pushgateway, on_error))


def _prometheus(
    config: MonitorConfig, store: MetricStore, rank: RankInfo, on_error: OnError, stacks: Stacks | None
) -> tuple[PrometheusEndpoint, StepHistory] | None:
    """The endpoint and the live page's ring it serves; None when no port on the address could be bound."""
    from ms_exporter.endpoint.live_history import StepHistory
    from ms_exporter.sinks.prometheus import PrometheusEndpoint

    history = StepHistory(store, config.all_bounds())
    port = config.port + rank.local_rank if config.port else 0
    try:
        endpoint = PrometheusEndpoint(store, config.bind_address, port, on_error, config.web, history, stacks)
    except OSError as exc:
        # Not even a free port on this address: training goes on without an endpoint.
        on_error("prometheus", exc)
        logger.error(
            "ms_exporter: cannot serve metrics on %s (%s); training continues without /metrics",
            config.bind_address,
            exc.strerror or exc,
        )
        return None
    logger.info("ms_exporter: rank %d serves metrics at %s", rank.rank, endpoint.url)
    if not _loopback(config.bind_address) and not config.web.tls_cert_file and not config.web.basic_auth_users:
        logger.warning(
            "ms_exporter: %s is reachable from other hosts without TLS or a password: anyone who can "
            "reach it reads the metrics, the live page and the hang dumps; set web.tls_cert_file and "
            "web.basic_auth_users (docs/configuration.md) or keep it behind a network policy",
            endpoint.url,
        )
    return endpoint, history


def _loopback(address: str) -> bool:
    if address == "localhost":
        return True
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:  # a host name: it may resolve anywhere
        return False


def _file_sd(directory: str, config: MonitorConfig, rank: RankInfo, port: int, on_error: OnError) -> list[Sink]:
    """The rank's file_sd target, with the port the endpoint really got."""
    from ms_exporter.sinks.file_sd import FileSdTarget

    target = FileSdTarget(directory, config.project, rank, config.bind_address, port)
    try:
        target.write()
    except OSError as exc:
        on_error("file_sd", exc)
        return []
    logger.info("ms_exporter: registered %s for Prometheus file_sd", target.path)
    return [target]


def _tensorboard(
    config: MonitorConfig, store: MetricStore, rank: RankInfo, on_error: OnError, breaker: Breaker
) -> list[Sink]:
    try:
        from ms_exporter.sinks.tensorboard import TensorBoardWriter

        return [
            TensorBoardWriter(
                store, Path(config.save_dir) / "tensorboard" / f"rank{rank.rank}", config.interval, on_error, breaker
            )
        ]
    except ImportError as exc:
        raise ConfigError(
            [
                f"monitor_config.backend: tensorboard needs tensorboardX ({exc.name} is missing); "
                "install it with: pip install 'ms-exporter[tensorboard]'"
            ]
        ) from exc
    except OSError as exc:  # a read-only or full save_dir, a link planted at the event file: train without it
        on_error("tensorboard", exc)  # counted and logged once (the first error of a component is logged)
        return []


def _wandb(config: MonitorConfig, store: MetricStore, rank: RankInfo, on_error: OnError, breaker: Breaker) -> Sink:
    try:
        from ms_exporter.sinks.wandb import WandbWriter

        return WandbWriter(
            store,
            Path(config.save_dir),
            config.wandb,
            config.project,
            config.run_id or config.project,
            rank,
            config.tags,
            config.interval,
            on_error,
            breaker,
        )
    except ImportError as exc:
        raise ConfigError(
            [
                f"monitor_config.backend: wandb needs the wandb library ({exc.name} is missing); "
                "install it with: pip install 'ms-exporter[wandb]'"
            ]
        ) from exc


def _otlp(config: MonitorConfig, store: MetricStore, rank: RankInfo, on_error: OnError) -> list[Sink]:
    try:
        from ms_exporter.sinks.otlp import OtlpExport
    except ImportError as exc:
        raise ConfigError(
            [
                f"monitor_config.backend: otlp needs the OpenTelemetry SDK ({exc.name} is missing); "
                "install it with: pip install 'ms-exporter[otlp]'"
            ]
        ) from exc
    try:
        return [OtlpExport(store, config.otlp, rank, config.project, on_error)]
    except Exception as exc:  # a bad endpoint or TLS setting: train without OTLP, say so once
        on_error("otlp", exc)
        return []
