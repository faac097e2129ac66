"""The closed sets a monitor_config's values come from: backends, protocols, metric groups, watched metrics ..."""

from __future__ import annotations

from typing import Literal

from ms_exporter.core import catalogue, registry

# `backend` and `metrics` values: the registries' (core/registry.py), so a user's registered sink or probe group
# is allowed as a built-in one is. These two are the built-in ones, for documentation and tests; the checks read
# the registries when a config is loaded.
BACKENDS = registry.selectable_backends()
METRIC_GROUPS = registry.metric_groups()
OTLP_PROTOCOLS = ("grpc", "http/protobuf")
PUSH_EVENTS = ("train_end", "interval")

# warn_on_value keys, which way a bare number bounds each, and the `metrics` group that must be on for it to see
# values: from the catalogue, where each key's family is.
WATCHABLE: dict[str, Literal["max", "min"]] = {
    key: catalogue.WATCHABLE[key].direction for key in catalogue.WARN_ON_VALUE_KEYS
}
WATCH_GROUP = {key: str(catalogue.WATCHABLE[key].group) for key in catalogue.WARN_ON_VALUE_KEYS}

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")

# Labels a tag may not reuse: every label the catalogue's families carry (the constant ones included), and the
# ones Prometheus itself sets or reads (le of a histogram bucket, job and instance of a target).
RESERVED_LABELS = frozenset(
    {*catalogue.CONSTANT_LABELS, *(label for family in catalogue.FAMILIES for label in family.labels)}
    | {"le", "job", "instance"}
)

# actions.early_stop.unit, actions.rollback.storage, web.client_auth_type
EARLY_STOP_UNITS = ("epoch", "step")
ROLLBACK_STORAGE = ("auto", "memory", "disk")
CLIENT_AUTH_TYPES = ("NoClientCert", "VerifyClientCertIfGiven", "RequireAndVerifyClientCert")

# series_profile: every series on every rank, or (large_job) the alerts' series on every rank and the per-layer and
# histogram detail on detail_ranks only (ms_exporter/sinks/shared/series_budget.py, docs/scaling.md "Very large jobs").
FULL_PROFILE, LARGE_JOB_PROFILE = "full", "large_job"
SERIES_PROFILES = (FULL_PROFILE, LARGE_JOB_PROFILE)

# The characters of a run_id (it names the run's state file in save_dir); goodput derives ids from the same set.
RUN_ID_CHARACTERS = "A-Za-z0-9_.:-"
