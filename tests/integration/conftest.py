"""Fixtures the integration modules share: a real Prometheus and Alertmanager with the shipped rules and routing
(tests/support/alert_stack.py), one per module that asks for it. A module sets ALERT_STACK_JOB_PORTS for the number
of training ports Prometheus scrapes (default 1)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.alert_stack import Stack
from tests.support.webhook import Webhook


@pytest.fixture(scope="module")
def webhook() -> Iterator[Webhook]:
    hook = Webhook()
    yield hook
    hook.close()


@pytest.fixture(scope="module")
def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, webhook: Webhook
) -> Iterator[Stack]:
    stack = Stack(tmp_path_factory.mktemp("stack"), webhook, getattr(request.module, "ALERT_STACK_JOB_PORTS", 1))
    stack.start()
    yield stack
    stack.stop()
