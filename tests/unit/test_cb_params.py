"""The one reader of MindSpore's cb_params: its keys are the ones MindSpore sets, its readers answer defaults."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import ms_exporter
from ms_exporter.core import cb_params as keys
from ms_exporter.core.cb_params import (
    epoch_of,
    eval_results_of,
    loss_scale_manager_of,
    network_of,
    sink_mode_of,
    step_of,
    steps_per_epoch_of,
)


def test_readers_answer_a_default_where_a_key_is_missing_or_none() -> None:
    assert (step_of({}), epoch_of({}), steps_per_epoch_of({}), sink_mode_of({})) == (0, 0, 0, False)
    assert step_of({"cur_step_num": None}) == 0 and step_of({"cur_step_num": np.int64(7)}) == 7
    assert network_of({}) is None and eval_results_of({}) is None
    assert eval_results_of({"metrics": [1.0]}) is None  # not a {metric: value} mapping: nothing to report


def test_readers_take_the_train_cell_first_and_the_richer_results_first() -> None:
    assert network_of({"train_network": "cell", "network": "net"}) == "cell"
    assert network_of({"train_network": None, "network": "net"}) == "net"
    both = {"metrics": {"acc": 0.5}, "eval_results": {"acc": 0.5, "eval_loss": 1.0}}
    assert eval_results_of(both) == {"acc": 0.5, "eval_loss": 1.0}
    assert eval_results_of({"metrics": {"acc": 0.5}}) == {"acc": 0.5}
    assert loss_scale_manager_of({"loss_scale_mananger": "sic"}) == "sic"
    assert loss_scale_manager_of({"loss_scale_manager": "fixed"}) == "fixed"


def test_every_key_is_one_mindspore_sets() -> None:
    """A real Model.fit: the keys the module names are in cb_params at step end (and the results at eval end)."""
    import mindspore.dataset as ds
    from mindspore import nn
    from mindspore.train import Callback, Model

    seen: dict[str, set[str]] = {}

    class Capture(Callback):
        def on_train_step_end(self, run_context: Any) -> None:
            seen["step_end"] = set(run_context.original_args())

        def on_eval_end(self, run_context: Any) -> None:
            seen["eval_end"] = set(run_context.original_args())

    network = nn.Dense(4, 1)
    model = Model(network, nn.MSELoss(), nn.SGD(network.trainable_params(), 0.01), metrics={"mae"})
    rng = np.random.default_rng(0)
    data = [(rng.standard_normal(4).astype(np.float32), rng.standard_normal(1).astype(np.float32)) for _ in range(8)]
    dataset = ds.GeneratorDataset(data, ["x", "y"], shuffle=False).batch(4)
    model.fit(1, dataset, dataset, callbacks=[Capture()], dataset_sink_mode=False)
    step_keys = {
        value
        for name, value in vars(keys).items()
        if name.isupper() and name not in ("EVAL_RESULTS", "METRICS") and isinstance(value, str)
    }
    assert step_keys and step_keys <= seen["step_end"], step_keys - seen["step_end"]
    assert keys.METRICS in seen["eval_end"]


@pytest.mark.parametrize("key", ["cur_step_num", "net_outputs", "train_dataset_element"])
def test_the_step_hooks_keys_are_named_once(key: str) -> None:
    package = Path(ms_exporter.__file__).parent
    spelled = [str(path.relative_to(package)) for path in package.rglob("*.py") if f'"{key}"' in path.read_text()]
    assert spelled == ["core/cb_params.py"]
