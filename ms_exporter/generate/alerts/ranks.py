"""Alerts on a rank gone (its endpoint down, or its target gone) or much slower than the rest of its job."""

from __future__ import annotations

from ms_exporter.core import catalogue as c
from ms_exporter.core.thresholds import Thresholds
from ms_exporter.core.verdicts import STRAGGLER
from ms_exporter.generate.alerts.alert import WHO, Alert, number
from ms_exporter.generate.alerts.devices import device_state
from ms_exporter.generate.alerts.verdicts import promql
from ms_exporter.generate.timing import Timing


def alerts(t: Thresholds, w: Timing, job_regex: str) -> tuple[Alert, ...]:
    # A rank that reported: any process of it served its always-present step counter within the window.
    reported = f"max by (job, instance, project, rank) (last_over_time({c.STEPS.name}[{w.reported_window}]))"
    # ...and one that ended normally: it served phase="ended" (it keeps serving until each scraper read it twice).
    ended = (
        f"on (job, instance, project, rank) "
        f'(last_over_time({c.PHASE.name}{{phase="{c.ENDED}"}}[{w.reported_window}]) == 1)'
    )
    factor = number(t.straggler_factor)
    return (
        # Only ranks that reported (any series in the last hour) and did not end normally: an unused port of a
        # static scrape config, a rank still importing MindSpore and a finished job page nothing.
        Alert(
            "MindSporeTrainingRankDown",
            expr=f'{reported} and on (job, instance) (up{{job=~"{job_regex}"}} == 0) unless {ended}',
            for_=w.gone_for,
            severity="critical",
            summary="A training rank's metrics endpoint is down",
            description=f"Endpoint {{{{ $labels.instance }}}} of {WHO} cannot be scraped; it reported until "
            f"recently and did not end normally.",
        ),
        # The same where the target itself went (file_sd, Kubernetes): the rank's series stopped and its endpoint
        # is no longer scraped at all.
        Alert(
            "MindSporeTrainingRankMissing",
            expr=f"{reported} unless on (project, rank) {c.STEPS.name} unless {ended}"
            f" unless on (project, rank) ({reported} and on (job, instance) up)",
            for_=w.gone_for,
            severity="critical",
            summary="A training rank stopped reporting",
            description=f"{WHO} reported within the last {w.reported_window} and no longer does, without ending "
            f"normally (its target left service discovery).",
        ),
        # A rank that never reported at all (its port blocked, its pod outside the ServiceMonitor's selector) is
        # neither down nor missing: the ranks that do report say how many there should be. Ranks seen in the
        # window count, whether still there or not (a dead one is RankDown's); a finished job's series go, and
        # with them its world size.
        Alert(
            "MindSporeTrainingRanksNotReporting",
            expr=f"max by (project) ({c.WORLD_SIZE.name}) - count by (project) (count by (project, rank) "
            f"(max_over_time({c.WORLD_SIZE.name}[{w.reported_window}]))) > 0",
            for_=w.unseen_for,
            severity="warning",
            summary="Some ranks of a job have never reported",
            description=f"{{{{ $value }}}} of the ranks of project {{{{ $labels.project }}}} have not been seen in "
            f"the last {w.reported_window} while its ranks say the job has more: their endpoints are not "
            "scraped (a blocked port, a pod outside the scrape selector), and dashboards and the hang and "
            "straggler verdicts are blind to them.",
        ),
        # Synchronous ranks (a collective in every step) all take the same time per step: the one the others
        # wait for has a short step and a long data wait, while theirs grows by the wait. So the step time
        # names the wrong rank; the data wait, where it is a real part of the step cycle, names the right one.
        # Ranks that do not synchronise run at their own pace: there the slow rank's whole cycle is longer.
        # The condition is core/verdicts.py's STRAGGLER, which `top` evaluates in Python. The description adds the
        # state of the rank's devices (a throttled or hot device is a cause these metrics cannot name on their own).
        Alert(
            "MindSporeTrainingStraggler",
            expr=promql(STRAGGLER, t),
            for_=w.slow_for,
            severity="warning",
            summary="A rank is much slower than the rest of its job",
            description=f"The job waits for {WHO}: {{{{ $value | humanizeDuration }}}} per step of data wait (or "
            f"of whole step cycle, where ranks do not synchronise), over {factor} times the median of the job. "
            f"Device state: {device_state()}.",
        ),
        # The rank's own detector flagged the step its own work rose (core/analysis/slowness.py), and against the job's
        # best rank it costs the job more than alert_below allows: a slowdown of every rank (shared storage) is
        # ThroughputDrop's, not a rank's. The value is the relative score.
        Alert(
            "MindSporeTrainingFailSlow",
            expr=f"{c.RANK_RELATIVE_SLOWNESS} < {number(t.failslow_relative)}"
            f" and on (project, rank) max by (project, rank) ({c.FAILSLOW.name} == 1)",
            for_=w.spike_for,
            severity="warning",
            summary="A rank slowed down and the job waits for it",
            description=f"{WHO} slowed down from step {_of_rank(c.FAILSLOW_ONSET_STEP.name)}: its own work per "
            f"step (data wait, host hooks) rose by {_of_rank(c.FAILSLOW_SIZE.name, 'humanizePercentage')} of its "
            f"clean cycle, and every rank waits for it (relative score {{{{ $value | printf `%.2f` }}}}). "
            f"{_whole_groups()}Device state: {device_state()}. docs/failslow.md says what a host-side monitor "
            "cannot attribute.",
        ),
    )


def _whole_groups() -> str:
    """ "Every rank of its <kind> <group> slowed: ...", for each group of the rank (node, pipeline stage, model copy)
    whose every rank its detector flagged; nothing where the rank is alone."""
    query = (
        f"{c.PROJECT_GROUP_FAILSLOW}{{project=%q}} == 1 and on (project, kind, group) "
        f"{c.PARALLEL_GROUP_INFO.name}{{project=%q, rank=%q}}"
    )
    return (
        f"{{{{ range query (printf `{query}` $labels.project $labels.project $labels.rank) }}}}"
        "Every rank of its {{ .Labels.kind }} {{ .Labels.group }} slowed: look for what they share. {{ end }}"
    )


def _of_rank(family: str, how: str = "printf `%.0f`") -> str:
    """The rank's own value of `family`, in an alert's description."""
    return (
        f"{{{{ range query (printf `max({family}{{project=%q, rank=%q}})` $labels.project $labels.rank) }}}}"
        f"{{{{ .Value | {how} }}}}{{{{ end }}}}"
    )
