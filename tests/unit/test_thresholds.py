"""Default thresholds live once: the config's defaults, the rules and the dashboard read the same numbers."""

from __future__ import annotations

from ms_exporter import load_config
from ms_exporter.config.alert_thresholds import thresholds_of
from ms_exporter.core.thresholds import DEFAULTS, EXPLODING_FACTOR, Thresholds
from ms_exporter.generate.rules import render_rules
from tests.support.pythons import DASHBOARD_SDK, needs


def _alerts(thresholds: Thresholds) -> dict[str, str]:
    return {
        rule["alert"]: rule["expr"]
        for group in render_rules(thresholds)["groups"]
        for rule in group["rules"]
        if "alert" in rule
    }


def test_the_config_defaults_are_the_alert_defaults() -> None:
    config = load_config({})
    assert config.grad_norm.threshold == DEFAULTS.grad_norm_high
    assert config.layernorm.drift_threshold == DEFAULTS.layernorm_drift
    assert thresholds_of(config) == DEFAULTS
    assert DEFAULTS.grad_norm_exploding == DEFAULTS.grad_norm_high * EXPLODING_FACTOR


@needs(DASHBOARD_SDK)
def test_a_changed_default_moves_rules_and_dashboard_together() -> None:
    from ms_exporter.generate.dashboard import render_dashboard

    moved = Thresholds(loss_high=7.5, grad_norm_high=2.5)
    assert _alerts(moved)["MindSporeTrainingLossHigh"].endswith("> 7.5")
    assert _alerts(moved)["MindSporeTrainingGradNormHigh"].endswith("> 2.5")
    drawn = {
        panel["title"]: panel["fieldConfig"]["defaults"]["thresholds"]["steps"][1]["value"]
        for panel in render_dashboard(moved)["panels"]
        if "thresholds" in panel.get("fieldConfig", {}).get("defaults", {})
    }
    assert drawn["Loss per rank"] == 7.5 and drawn["Global gradient norm"] == 2.5
