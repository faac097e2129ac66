"""The closed sets a monitor_config's values come from: backends, protocols, metric groups, watched metrics ..."""

from __future__ import annotations

from typing import Literal

from ms_exporter.core import catalogue

BACKENDS = ("prometheus", "otlp", "local", "tensorboard", "wandb")
OTLP_PROTOCOLS = ("grpc", "http/protobuf")
PUSH_EVENTS = ("train_end", "interval")

# Names allowed in `metrics`: each switches on one group of series (docs/metrics.md lists them).
METRIC_GROUPS = (
    "loss",
    "lr",
    "step_time",
    "samples_per_second",
    "tokens_per_second",
    "memory_usage",
    "global_rank",
    "eval",
)

# warn_on_value keys, which way a bare number bounds each, and the `metrics` group that must be on for it to see
# values: from the catalogue, where each key's family is.
WATCHABLE: dict[str, Literal["max", "min"]] = {
    key: catalogue.WATCHABLE[key].direction for key in catalogue.WARN_ON_VALUE_KEYS
}
WATCH_GROUP = {key: str(catalogue.WATCHABLE[key].group) for key in catalogue.WARN_ON_VALUE_KEYS}

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

# Labels the exporter sets itself; a tag may not reuse them.
RESERVED_LABELS = frozenset(
    {
        "rank",
        "project",
        "world_size",
        "local_rank",
        "node",
        "device_target",
        "mindspore_version",
        "exporter_version",
        "kind",
        "group",
        "name",
        "metric",
        "hook",
        "component",
        "le",
        "job",
        "instance",
    }
)

# actions.early_stop.unit, actions.rollback.storage, web.client_auth_type
EARLY_STOP_UNITS = ("epoch", "step")
ROLLBACK_STORAGE = ("auto", "memory", "disk")
CLIENT_AUTH_TYPES = ("NoClientCert", "VerifyClientCertIfGiven", "RequireAndVerifyClientCert")

# The characters of a run_id (it names the run's state file in save_dir); goodput derives ids from the same set.
RUN_ID_CHARACTERS = "A-Za-z0-9_.:-"
