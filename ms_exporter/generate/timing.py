"""How fast the rules evaluate and alert: the evaluation interval, the windows and the `for:` durations."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Timing:
    """Evaluation interval, windows and `for:` durations (docs/alerts.md#how-fast-an-alert-arrives gives each its
    reason). `TEST_TIMING` shrinks them so that integration tests fire in seconds."""

    evaluation: str = "10s"
    event_for: str = "0s"  # a counted event (a NaN loss): real the moment it is counted
    spike_for: str = "10s"  # an exploding gradient norm: two evaluations, so that one odd step does not page
    gone_for: str = "20s"  # a rank gone: several failed scrapes, not one slow one
    # Trends already measured over a window (loss scale: the overflow fraction of a minute; memory: the growth slope
    # of the last memory_window samples, 50 s by default): 30 s more of them is enough.
    trend_for: str = "30s"
    short_for: str = "1m"  # levels that are real once they last a minute (loss high, loss rising)
    long_for: str = "5m"  # warnings nobody need act on at once (gradient norm high, LR flat, LayerNorm drift)
    slow_for: str = "10m"  # throughput low and stragglers: a checkpoint or an evaluation pauses training briefly
    rate_window: str = "5m"
    events_window: str = "5m"  # how long a non-finite loss keeps its alert
    errors_window: str = "10m"
    overflow_window: str = "1m"
    # A rank that reported within this window, does not now and did not end normally is gone.
    reported_window: str = "1h"
    # ThroughputDrop: the last `drop_recent` against the best `drop_smooth` average of the `drop_baseline` before
    # it (the recent window left out, so the slow period never lowers its own baseline), for `drop_for`.
    drop_recent: str = "2m"
    drop_smooth: str = "5m"
    drop_baseline: str = "1h"
    drop_for: str = "1m"
    lr_flat_window: str = "30m"
    # GoodputLow: a whole hour's goodput below the threshold for this long (an hour that began with compilation
    # is low for a while at every start: the alert waits for the hour to be mostly training).
    goodput_for: str = "15m"
    # DeviceHot, DeviceThrottling: several readings (hardware.interval 10 s, a device exporter's scrape), longer than
    # a burst of load or one slowdown the clock recovers from at once.
    device_for: str = "2m"
    # DeviceLinkDown: three readings at the default hardware.interval, so one hccn_tool answer caught mid-renegotiation
    # does not page; a link down for longer fails the job's collectives.
    link_for: str = "30s"
    # RanksNotReporting: fewer ranks ever seen than the world size for this long. A job's ranks serve from the
    # monitor's construction, before compiling; pods of a large job may take minutes to be scheduled.
    unseen_for: str = "15m"


TEST_TIMING = Timing(
    evaluation="1s",
    event_for="0s",
    spike_for="1s",
    gone_for="2s",
    trend_for="2s",
    short_for="2s",
    long_for="3s",
    slow_for="3s",
    rate_window="10s",
    events_window="30s",
    errors_window="30s",
    overflow_window="20s",
    reported_window="10m",
    drop_recent="4s",
    drop_smooth="6s",
    drop_baseline="40s",
    drop_for="2s",
    lr_flat_window="20s",
    goodput_for="2s",
    device_for="2s",
    link_for="1s",
    unseen_for="5s",
)
