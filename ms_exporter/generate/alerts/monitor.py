"""Alerts on the monitor itself: the rollbacks it made, the stop of a rollback loop, the errors it absorbed."""

from __future__ import annotations

from ms_exporter.core import catalogue as c
from ms_exporter.generate.alerts.alert import WHO, Alert
from ms_exporter.generate.timing import Timing


def alerts(w: Timing) -> tuple[Alert, ...]:
    return (
        # The action label keeps the rank apart from another action's series; the count is shown whole.
        Alert(
            "MindSporeTrainingRolledBack",
            expr=f'increase({c.ACTIONS_TAKEN.name}{{action="rollback"}}[{w.events_window}]) > 0',
            for_=w.event_for,
            severity="warning",
            summary="The monitor rolled the training back to its last good state",
            description=f'{WHO} diverged and was rolled back {{{{ printf "%.0f" $value }}}} times in the last '
            f"{w.events_window}; {c.ROLLBACK_LOST_STEPS.name} counts the steps undone and "
            f"save_dir/skipped-batches.json lists the batches.",
        ),
        Alert(
            "MindSporeTrainingRollbackLoop",
            expr=f'increase({c.ACTIONS_TAKEN.name}{{action="rollback_stop"}}[{w.events_window}]) > 0',
            for_=w.event_for,
            severity="critical",
            summary="Rollbacks did not stop the divergence: the monitor ended the training",
            description=f"{WHO} diverged again after actions.rollback.max_rollbacks rollbacks within window_steps; "
            f"the monitor stopped the training (the reason is in the log and the JSON Lines file).",
        ),
        Alert(
            "MindSporeExporterErrors",
            expr=f"increase({c.ERRORS.name}[{w.errors_window}]) > 0",
            for_=w.short_for,
            severity="warning",
            summary="The training monitor is absorbing errors",
            description=f"Component {{{{ $labels.component }}}} of the monitor on {WHO} failed "
            f"{{{{ $value | humanize }}}} times in {w.errors_window}; training goes on, but its metrics may be "
            f"incomplete.",
        ),
    )
