"""The wandb backend's choices: which ranks log, a missing extra, a run that cannot start or log."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from ms_exporter.config import ConfigError, load_config
from ms_exporter.core import catalogue as c
from ms_exporter.core.errors import Breaker, ErrorSink
from ms_exporter.core.ranks import RankInfo
from ms_exporter.core.sample import StepSample
from ms_exporter.core.store import MetricStore
from ms_exporter.sinks.wandb import WandbWriter
from tests.support.pythons import WANDB, needs
from tests.support.sinks import sinks_of as tensorboard_sinks_of


def sinks_of(rank: int, tmp_path: Path, **options: object) -> list[str]:
    return tensorboard_sinks_of(rank, tmp_path, "wandb", **options)  # never started: no run, no wandb service


@needs(WANDB)
def test_rank_0_logs_by_default_and_every_rank_with_all_ranks(tmp_path: Path) -> None:
    assert sinks_of(0, tmp_path) == ["wandb"]
    assert sinks_of(1, tmp_path) == []
    assert sinks_of(1, tmp_path, wandb={"all_ranks": True}) == ["wandb"]


def test_without_wandb_the_config_error_names_the_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # what an install without the extra looks like
    with pytest.raises(ConfigError, match=r"pip install 'ms-exporter\[wandb\]'"):
        sinks_of(0, tmp_path)


def test_a_bad_mode_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"monitor_config.wandb.mode: .*'offline', 'online'"):
        load_config({"wandb": {"mode": "disabled"}})


class FakeRun:
    def __init__(self, fail: bool, save_dir: Path) -> None:
        self.dir = str(save_dir / "wandb" / "offline-run-1" / "files")
        Path(self.dir).mkdir(parents=True)
        self.fail = fail
        self.logged: list[tuple[int, dict[str, float]]] = []

    def log(self, data: dict[str, float], step: int) -> None:
        if self.fail:
            raise OSError(28, "No space left on device")
        self.logged.append((step, data))

    def finish(self) -> None:
        pass


def writer(
    tmp_path: Path, store: MetricStore, errors: ErrorSink, monkeypatch: pytest.MonkeyPatch, init: object
) -> WandbWriter:
    """A writer whose wandb.init is `init` (wandb itself is tested in tests/integration/test_wandb.py)."""
    import wandb

    monkeypatch.setattr(wandb, "init", init)
    config = load_config({"backend": "wandb"})
    return WandbWriter(
        store, tmp_path, config.wandb, "p", "p", RankInfo(0, 0, 1, "n"), {}, 30.0, errors.absorb, Breaker(errors, store)
    )


def sample(step: int) -> StepSample:
    return StepSample(step, 1, 1, 0.5, 0.01, 0.0, 8, 64, 1e9 + step, float(step))


@needs(WANDB)
def test_a_run_that_cannot_start_is_counted_and_training_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = MetricStore()
    errors = ErrorSink(store, ("callback", "wandb"))

    def no_service(**kwargs: object) -> None:
        raise RuntimeError("wandb-core did not start")

    made = writer(tmp_path, store, errors, monkeypatch, no_service)
    made.on_train_begin({"cur_step_num": 0})  # raises nothing
    made.on_step(sample(1))
    made.flush()
    made.close()
    counted = {dict(series.labels)["component"]: series.value for series in store.series_of(c.ERRORS)}
    assert counted["wandb"] == 1


@needs(WANDB)
def test_a_run_that_fails_to_log_costs_its_records_never_the_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = MetricStore()
    errors = ErrorSink(store, ("callback", "wandb"))
    run = FakeRun(fail=True, save_dir=tmp_path)
    made = writer(tmp_path, store, errors, monkeypatch, lambda **kwargs: run)
    made.on_train_begin({"cur_step_num": 0})
    for step in range(1, 4):
        made.on_step(sample(step))
        made.flush()  # raises nothing
    assert store.series_of(c.DROPPED_RECORDS)[0].value == 3
    made.on_step(sample(4))  # switched off after 3 failures: not even queued
    made.close()
    disabled = {dict(series.labels)["component"]: series.value for series in store.series_of(c.COMPONENT_DISABLED)}
    assert disabled["wandb"] == 1


@needs(WANDB)
def test_each_step_is_one_log_call_at_its_global_step(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = MetricStore()
    errors = ErrorSink(store, ("callback", "wandb"))
    run = FakeRun(fail=False, save_dir=tmp_path)
    made = writer(tmp_path, store, errors, monkeypatch, lambda **kwargs: run)
    made.on_train_begin({"cur_step_num": 0})
    made.on_step(sample(7))
    made.on_eval(7, {"accuracy": 0.5, "confusion": [[1, 0], [0, 1]]})
    made.close()
    assert run.logged == [
        (7, {"loss": 0.5, "step_duration_seconds": 0.01, "data_wait_seconds": 0.0}),
        (7, {"eval/accuracy": 0.5}),
    ]
