"""The alerting rules as records (alert.py), one module per area; `alerts` lists them in the rules file's order."""

from __future__ import annotations

from ms_exporter.core.thresholds import Thresholds
from ms_exporter.generate.alerts import data, devices, drift, gradients, hangs, job, loss, monitor, ranks, throughput
from ms_exporter.generate.alerts.alert import Alert
from ms_exporter.generate.timing import Timing


def alerts(t: Thresholds, w: Timing, job_regex: str) -> tuple[Alert, ...]:
    """Every alert, area by area; `job_regex` picks the Prometheus jobs whose `up` RankDown watches."""
    return (
        *loss.alerts(t, w),
        *gradients.alerts(t, w),
        *throughput.alerts(t, w),
        *hangs.alerts(w),
        *drift.alerts(t, w),
        *data.alerts(t, w),
        *ranks.alerts(t, w, job_regex),
        *devices.alerts(t, w),
        *job.alerts(t, w),
        *monitor.alerts(w),
    )
