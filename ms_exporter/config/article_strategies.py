"""The strategy-container article's built-in strategy classes, as its code builds them: `LossMonitorStrategy(config)`.

Each is a name for our settings, exactly as its `strategies:` entry in YAML is (article_keys.STRATEGIES): an object
holds its `config`, checked when it is built, and `settings` says what it switches on. `TransformersMonitorCallback`
reads them so; they measure nothing themselves (our probes do), so they have no `on_step_end`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ms_exporter.config import article_keys
from ms_exporter.config.checks import ConfigError
from ms_exporter.config.schema import MonitorConfig
from ms_exporter.config.walker import _build, _Problems, shown_value


class ArticleStrategy:
    """One of the article's built-in strategies: `config` is its `config:` mapping in the YAML form."""

    def __init__(self, config: Mapping[str, Any] | None = None) -> None:
        name = type(self).__name__
        if config is not None and not isinstance(config, Mapping):
            raise ConfigError([f"{name}(config): must be a mapping, got {shown_value(config)}"])
        self.config = dict(config or {})
        raw: dict[str, Any] = {"strategies": [self.entry()]}
        reading = article_keys.translate(raw)
        if reading.problems:
            raise ConfigError([problem.replace("monitor_config.strategies[0]", name) for problem in reading.problems])
        # Its values are checked now, as the YAML entry's are when the file is read, naming the key as written.
        problems = _Problems()
        for ours, theirs in reading.origins.items():
            problems.set_origin(ours, theirs.replace("monitor_config.strategies[0]", name))
        _build(MonitorConfig, dict(raw), "", problems)
        if problems.found:
            raise ConfigError(problems.found)
        self.settings = raw  # monitor_config keys, nested as in the YAML form

    def entry(self) -> dict[str, Any]:
        """The same strategy as a `strategies:` entry of the YAML form."""
        return {"name": type(self).__name__, "config": dict(self.config)}

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.config!r})"


class LossMonitorStrategy(ArticleStrategy):
    """`window_size`: the smoothed loss's window (`loss_window`)."""


class GradNormStrategy(ArticleStrategy):
    """`monitor_layers`, `threshold`: `grad_norm.layers`, `grad_norm.threshold`."""


class EarlyStoppingStrategy(ArticleStrategy):
    """`patience`, `min_delta`: `actions.early_stop` on, counting steps as the article's does."""


class HardwareHealthStrategy(ArticleStrategy):
    """No keys: `hardware.enable: true`."""


class DataQualityStrategy(ArticleStrategy):
    """`label_column`, `token_column`, `vocab_size`, `baseline_steps`, `drop_ratio`, `streak`: `data_quality`."""


CLASSES: tuple[type[ArticleStrategy], ...] = (
    LossMonitorStrategy,
    GradNormStrategy,
    EarlyStoppingStrategy,
    HardwareHealthStrategy,
    DataQualityStrategy,
)


def settings_of(strategies: list[ArticleStrategy]) -> tuple[dict[str, Any], list[str]]:
    """Our settings for these objects, read through the same table as their YAML entries: a nested mapping of
    monitor_config keys, and the problems (a key the strategy does not have, one setting given two values)."""
    raw: dict[str, Any] = {"strategies": [strategy.entry() for strategy in strategies]}
    return raw, article_keys.translate(raw).problems
