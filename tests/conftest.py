import logging

import pytest


@pytest.fixture(autouse=True)
def _clean_exporter_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tests must not pick up MS_EXPORTER_* settings from the machine they run on."""
    import os

    for key in list(os.environ):
        if key.startswith("MS_EXPORTER_"):
            monkeypatch.delenv(key)
    logging.getLogger("ms_exporter").propagate = True
