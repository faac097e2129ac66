"""Alerts on a rank's devices (too hot, held down, uncorrected memory errors, a link down), and the device state the
rank alerts quote: all read the rank_device recordings (generate/recording.py), which join npu-exporter's and
dcgm-exporter's series to ranks where the rank's own reader has no reading."""

from __future__ import annotations

from ms_exporter.core import catalogue as c
from ms_exporter.core.thresholds import Thresholds
from ms_exporter.core.verdicts import DEVICE_HOT
from ms_exporter.generate.alerts.alert import WHO, Alert, number
from ms_exporter.generate.alerts.verdicts import promql
from ms_exporter.generate.timing import Timing

_DEVICE = f"{{{{ $labels.device }}}} of {WHO}"  # after "device"

# How the description of a rank alert says each state of DEVICE_STATES but healthy.
STATE_WORDS = {
    "ecc_errors": "has uncorrected ECC errors",
    "link_down": "has its network link down",
    "throttled": "is throttled",
    "hot": "is hot",
}


def _t(action: str) -> str:
    """A Go template action."""
    return "{{ " + action + " }}"


def device_state() -> str:
    """A template sentence on the devices of the alert's rank, from the states recorded when the alert is sent:
    "device npu3 is throttled" (each device not healthy, by name), "its devices look healthy", or "no device
    readings" where the rank has none (no reader found a device, and no device exporter is joined)."""
    rank = "project=%q, rank=%q"  # printf fills them from the alert's own labels
    unhealthy = f'query (printf `{c.RANK_DEVICE_STATE}{{{rank}, state!="healthy"}}` $labels.project $labels.rank)'
    any_state = f"query (printf `{c.RANK_DEVICE_STATE}{{{rank}}}` $labels.project $labels.rank)"
    words = "".join(
        _t(f'{"if" if i == 0 else "else if"} eq $s.Labels.state "{state}"') + text
        for i, (state, text) in enumerate(STATE_WORDS.items())
    )
    each = (
        _t('range $i, $s := . | sortByLabel "device"')
        + _t("if $i")
        + ", "
        + _t("end")
        + "device "
        + _t("$s.Labels.device")
        + " "
        + words
        + _t("end")
        + _t("end")
    )
    return (
        _t(f"with {unhealthy}")
        + each
        + _t("else")
        + _t(f"with {any_state}")
        + "its devices look healthy"
        + _t("else")
        + "no device readings"
        + _t("end")
        + _t("end")
    )


def alerts(t: Thresholds, w: Timing) -> tuple[Alert, ...]:
    hot = number(t.device_hot_celsius)
    return (
        # Accelerators only, as the recordings are: the threshold is a GPU's or an NPU's, and a host's CPUs may run
        # hotter by design.
        Alert(
            "MindSporeTrainingDeviceHot",
            expr=promql(DEVICE_HOT, t),
            for_=w.device_for,
            severity="warning",
            summary="A training device is too hot",
            description=f"Device {_DEVICE} is at {{{{ $value | humanize }}}} °C, at or above {hot} °C; a few "
            f"degrees more and it slows down, and the whole job with it.",
        ),
        Alert(
            "MindSporeTrainingDeviceThrottling",
            expr=f"{c.RANK_DEVICE_THROTTLED} > 0",
            for_=w.device_for,
            severity="warning",
            summary="A training device holds its clock down for heat or power",
            description=f"Device {_DEVICE} runs below its clock for heat or power (a thermal or hardware "
            f"slowdown, a power brake); a synchronous job runs at its pace.",
        ),
        # Any count, not an increase: the count is since the driver loaded, so it stays above 0 until the device is
        # reset, which is what it needs; an increase would go quiet after one window on a device still broken, and
        # miss the errors a device had before this job landed on it.
        Alert(
            "MindSporeTrainingDeviceEccErrors",
            expr=f"{c.RANK_DEVICE_ECC_ERRORS} > 0",
            for_=w.event_for,
            severity="critical",
            summary="A training device has uncorrected memory errors",
            description=f"Device {_DEVICE} counted {{{{ $value | humanize }}}} uncorrected ECC memory errors "
            f"since its driver loaded: what it computes can no longer be trusted.",
        ),
        Alert(
            "MindSporeTrainingDeviceLinkDown",
            expr=f"{c.RANK_DEVICE_LINK_UP} == 0",
            for_=w.link_for,
            severity="critical",
            summary="A training device's network link is down",
            description=f"The network link (RoCE) of device {_DEVICE} is down: the job's collectives through it "
            f"fail or hang.",
        ),
    )
