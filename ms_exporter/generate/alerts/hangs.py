"""Alerts on hangs: a rank stopped past its learned deadline (Stalled), and the rank a hung job waits for (Hang).

ms_exporter/tools/hangs.py gives the same verdict in Python.
"""

from __future__ import annotations

from ms_exporter.core import catalogue as c
from ms_exporter.generate.alerts.alert import WHO, Alert
from ms_exporter.generate.alerts.devices import device_state
from ms_exporter.generate.timing import Timing

_PHASE, _SECONDS, _DEADLINE = c.PHASE.name, c.PHASE_SECONDS.name, c.HANG_DEADLINE.name
# A rank past its hang deadline, valued in seconds, with the phase it is in as a label...
_PAST = (
    f"(({_SECONDS} > {_DEADLINE}) * on (job, instance) group_left (phase) topk by (job, instance) (1, {_PHASE} == 1))"
)
# ...unless it waits in `step` (in the collective) for a rank of its project that is in another phase within
# that phase's deadline: rank 0 saving a checkpoint for 5 minutes holds the others in the next step's
# all-reduce, past their learned deadline but not stopped. Once the rank they wait for is past its own
# deadline, they count again.
_BUSY_ELSEWHERE = (
    f'(({_SECONDS} <= {_DEADLINE}) and on (job, instance) ({_PHASE}{{phase!~"{c.STEP_PHASE}|{c.ENDED}"}} == 1))'
)
_STOPPED = (
    f'({_PAST} unless on (job, instance) (({_PHASE}{{phase="{c.STEP_PHASE}"}} == 1)'
    f" and on (project) {_BUSY_ELSEWHERE}))"
)
# Each rank's current phase (ranks that ended left out), as a label.
_CURRENT = (
    f'(topk by (job, instance) (1, {_PHASE} == 1) unless on (job, instance) ({_PHASE}{{phase="{c.ENDED}"}} == 1))'
)
# How many ranks of a project are in each phase now (all of them: ranks scraped a few seconds apart cross their
# deadlines a few seconds apart, and the ones not yet past it still say where they are); `step` counts half a
# rank more (ties).
_WEIGHTS = (
    f"((count by (project, phase) ({_CURRENT} and on (job, instance) "
    f'({_PHASE}{{phase="{c.STEP_PHASE}"}} == 1)) + 0.5) or count by (project, phase) ({_CURRENT}))'
)


def alerts(w: Timing) -> tuple[Alert, ...]:
    return (
        # The phase a rank is stuck in comes along as a label: one phase series is 1 per rank (topk keeps one should a
        # scrape ever catch the hook between two of them).
        Alert(
            "MindSporeTrainingStalled",
            expr=_STOPPED,
            for_=w.event_for,
            severity="critical",
            summary="Training has stalled",
            description=f"{WHO} has been in phase {{{{ $labels.phase }}}} for {{{{ $value | humanizeDuration }}}}, "
            f"longer than its deadline ({_DEADLINE}: hang.factor x its recent step cycle, at least "
            f"hang.min_seconds).",
        ),
        # The job's verdict: a rank past its deadline in a phase fewer of its project's ranks are in (a tie goes
        # against the ranks outside `step`, where the collective is), or every rank when all the project's ranks are
        # in one phase and all are past their deadline. "All" matters: ranks are scraped seconds apart, and a rank
        # whose last scrape predates the block still shows the step it was in then, not yet the data wait it is
        # stuck in.
        Alert(
            "MindSporeTrainingHang",
            expr=f"label_replace({_STOPPED} and on (project, phase) ({_WEIGHTS} < on (project) group_left () "
            f'max by (project) ({_WEIGHTS})), "verdict", "never arrived", "", "")'
            f" or label_replace({_STOPPED} and on (project) (count by (project) ({_WEIGHTS}) == 1)"
            f" and on (project) (count by (project) ({_STOPPED}) == count by (project) ({_CURRENT})),"
            f' "verdict", "every rank stopped", "", "")',
            for_=w.event_for,
            severity="critical",
            summary="Training hangs: the rank the job waits for",
            description=f"{WHO} has been in phase {{{{ $labels.phase }}}} for {{{{ $value | humanizeDuration }}}}, "
            f'past its hang deadline: {{{{ if eq $labels.verdict "never arrived" }}}}the other ranks of its job are '
            f"in another phase, waiting for it{{{{ else }}}}every rank of its job is in this phase, so no rank "
            f"stands out{{{{ end }}}}. Device state: {device_state()}.",
        ),
    )
