"""What the monitor prints and logs leaks no secret, and an open endpoint is said to be open."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from ms_exporter import TrainingMonitor, cli
from ms_exporter.config import ConfigError, load_config
from ms_exporter.core.errors import ErrorSink
from ms_exporter.core.store import MetricStore

SECRET = "s3cr3t-pw"


def test_url_passwords_stay_out_of_check_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "monitor.yaml"
    path.write_text(
        f"monitor_config:\n  pushgateway:\n    url: http://ops:{SECRET}@gateway:9091\n"
        f"  otlp:\n    endpoint: https://ops:{SECRET}@collector:4318\n"
    )
    assert cli.main(["check-config", str(path)]) == 0
    printed = capsys.readouterr().out
    assert SECRET not in printed
    assert "http://ops:<redacted>@gateway:9091" in printed and "https://ops:<redacted>@collector:4318" in printed


def test_url_passwords_stay_out_of_config_errors_and_error_logs(caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(ConfigError) as raised:
        load_config({"pushgateway": {"url": f"http://ops:{SECRET}@gateway:9091", "timeout": "soon"}})
    with pytest.raises(ConfigError) as bad_url:
        load_config({"otlp": {"endpoint": f"ops:{SECRET}@collector"}, "pushgateway": {"url": 5}})
    assert SECRET not in str(raised.value) and SECRET not in str(bad_url.value)
    errors = ErrorSink(MetricStore(()))
    with caplog.at_level(logging.ERROR, logger="ms_exporter"):
        errors.absorb("pushgateway", OSError(f"cannot reach http://ops:{SECRET}@gateway:9091/metrics/job/x"))
    assert caplog.records and SECRET not in caplog.text and "ops:<redacted>@gateway" in caplog.text


@pytest.mark.parametrize(("address", "warned"), [("0.0.0.0", True), ("127.0.0.1", False), ("::1", False)])
def test_an_endpoint_open_to_other_hosts_without_tls_or_auth_is_warned_about(
    address: str, warned: bool, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="ms_exporter"):
        monitor = TrainingMonitor(port=0, bind_address=address)
        monitor.close()
    assert ("reachable from other hosts without TLS or a password" in caplog.text) is warned


def test_an_open_endpoint_with_a_password_is_not_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    users = {"prometheus": "sha256:" + "0" * 64}
    with caplog.at_level(logging.WARNING, logger="ms_exporter"):
        TrainingMonitor(port=0, bind_address="0.0.0.0", web={"basic_auth_users": users}).close()
    assert "reachable from other hosts" not in caplog.text
