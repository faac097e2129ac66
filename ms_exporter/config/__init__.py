"""YAML, dict, environment and keyword configuration -> one frozen MonitorConfig; every problem in one ConfigError.

Each field declares its constraint beside it: `setting(default, check=int_in(1, 100))`, or `section(Kind)` for a
nested section. One walker (`_build`) applies the declared checks to every field of every section, then a class's
`_cross_check` applies the rules that tie its fields together. A check returns the clean value or raises `_Bad`
with what is wrong and what is allowed; the walker adds the key and the source that set it.

This module only gathers the names the rest of the package imports. They live in, lowest first:
`checks.py` (setting, section, the checks, ConfigError), `vocabulary.py` (the closed sets of names), `safe_yaml.py`
(bounded file and YAML reading), `sections.py` (grad_norm, otlp, web, actions ...), `schema.py` (MonitorConfig and
its top-level keys), `walker.py` (`_build`), `environment.py` (MS_EXPORTER_<KEY>) and `loading.py` (load_config,
read_config: the sources merged in order). MindSpore Transformers' keys: `mindformers_keys.py`.
"""

from __future__ import annotations

from ms_exporter.config.checks import (
    MAX_FLOPS,
    MAX_STEPS,
    ConfigError,
    _Bad,
    at_least,
    between,
    choice,
    greater_than,
    int_in,
    names,
    optional,
    regexes,
    text,
    url,
)
from ms_exporter.config.loading import load_config, read_config
from ms_exporter.config.schema import DEFAULT_PORT, KEYS, SECTIONS, Bound, MonitorConfig
from ms_exporter.config.sections import (
    ACTION_SECTIONS,
    ActionsConfig,
    DataQualityConfig,
    DivergenceConfig,
    EarlyStopConfig,
    FailSlowConfig,
    FlopsConfig,
    FlopsModelConfig,
    GoodputConfig,
    GradNormConfig,
    HangConfig,
    HardwareConfig,
    LayerNormConfig,
    LrBackoffConfig,
    OtlpConfig,
    PushgatewayConfig,
    RollbackConfig,
    SnapshotConfig,
    TensorBoardConfig,
    UpdateRatioConfig,
    WandbConfig,
    WebConfig,
)
from ms_exporter.config.vocabulary import (
    BACKENDS,
    LOG_LEVELS,
    METRIC_GROUPS,
    OTLP_PROTOCOLS,
    PUSH_EVENTS,
    RESERVED_LABELS,
    RUN_ID_CHARACTERS,
    WATCH_GROUP,
    WATCHABLE,
)
from ms_exporter.core.redaction import hide_url_passwords

__all__ = [
    "ACTION_SECTIONS",
    "BACKENDS",
    "DEFAULT_PORT",
    "KEYS",
    "LOG_LEVELS",
    "MAX_FLOPS",
    "MAX_STEPS",
    "METRIC_GROUPS",
    "OTLP_PROTOCOLS",
    "PUSH_EVENTS",
    "RESERVED_LABELS",
    "RUN_ID_CHARACTERS",
    "SECTIONS",
    "WATCHABLE",
    "WATCH_GROUP",
    "ActionsConfig",
    "Bound",
    "ConfigError",
    "DataQualityConfig",
    "DivergenceConfig",
    "EarlyStopConfig",
    "FlopsConfig",
    "FlopsModelConfig",
    "FailSlowConfig",
    "GoodputConfig",
    "GradNormConfig",
    "HangConfig",
    "LayerNormConfig",
    "UpdateRatioConfig",
    "LrBackoffConfig",
    "MonitorConfig",
    "OtlpConfig",
    "PushgatewayConfig",
    "RollbackConfig",
    "SnapshotConfig",
    "TensorBoardConfig",
    "HardwareConfig",
    "WandbConfig",
    "WebConfig",
    "_Bad",
    "at_least",
    "between",
    "choice",
    "greater_than",
    "hide_url_passwords",
    "int_in",
    "load_config",
    "names",
    "optional",
    "read_config",
    "regexes",
    "text",
    "url",
]
