"""Drills: the bit a flip names is flipped at the end of its step on its rank only, both ways a tensor is written,
and the replica checks read it at that step."""

from __future__ import annotations

import json
import logging

import mindspore as ms
import numpy as np
import pytest

from ms_exporter.actions.bit_flips import BitFlips, flip_bit
from ms_exporter.config import load_config
from ms_exporter.config.sections import BitFlip
from ms_exporter.core.analysis.replicas import first_disagreement
from ms_exporter.core.device import device_reductions as d
from ms_exporter.core.output_layout import LayoutResolver
from ms_exporter.core.ranks import RankInfo
from ms_exporter.core.store import MetricStore
from ms_exporter.features.fingerprint import Fingerprints


def run(values: np.ndarray | None = None) -> dict[str, object]:
    """A run view with two weights and their moments, as the Callback hands it."""
    rng = np.random.default_rng(5)
    weights = [ms.Parameter(ms.Tensor(rng.normal(size=(8, 8)).astype(np.float32)), name=f"w{i}") for i in range(2)]
    moments = [ms.Parameter(ms.Tensor(np.zeros((8, 8), np.float32)), name=f"adam_m.w{i}") for i in range(2)]
    network = type("Network", (), {"weights": weights})()
    optimizer = type("Optimizer", (), {"get_parameters": lambda self: [*weights, *moments]})()
    return {"train_network": network, "optimizer": optimizer, "cur_step_num": 0}


def bits(parameter: ms.Parameter) -> np.ndarray:
    return np.array(parameter.asnumpy()).reshape(-1).view(np.uint32).copy()


@pytest.mark.parametrize("in_place", [True, False])
def test_the_named_bit_of_the_named_element_flips_and_nothing_else(
    in_place: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(d, "read_in_place", in_place)
    view = run()
    flips = (
        BitFlip(rank=1, step=3, kind="weights", tensor="w1", element=9, bit=30),
        BitFlip(rank=1, step=3, kind="optimizer", tensor=0, element=0, bit=31),
        BitFlip(rank=0, step=3, kind="weights", tensor=0, element=0, bit=0),  # another rank's
    )
    part = BitFlips(flips, rank=1)
    part.on_train_begin(view)
    weights = view["train_network"].weights  # type: ignore[attr-defined]
    moments = view["optimizer"].get_parameters()[2:]  # type: ignore[attr-defined]
    before = [bits(p) for p in (*weights, *moments)]
    part.on_step_end(2, None)
    assert all((bits(p) == b).all() for p, b in zip((*weights, *moments), before))
    part.on_step_end(3, None)
    after = [bits(p) for p in (*weights, *moments)]
    changed = [
        (i, int(np.flatnonzero(a != b)[0]), int(a[a != b][0] ^ b[a != b][0]))
        for i, (a, b) in enumerate(zip(after, before))
        if (a != b).any()
    ]
    assert changed == [(1, 9, 1 << 30), (2, 0, 1 << 31)]
    part.on_step_end(3, None)  # once only
    assert all((bits(p) == a).all() for p, a in zip((*weights, *moments), after))


def test_bfloat16_and_float16_flip_their_own_bits(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(d, "read_in_place", False)
    half = ms.Parameter(ms.Tensor(np.ones(4, np.float16)), name="h")
    flip_bit([half], BitFlip(0, 1, "weights", 0, 2, 15))
    assert np.array(half.asnumpy()).tolist() == [1, 1, -1, 1]
    brain = ms.Parameter(ms.Tensor(np.ones(4, np.float32)).astype(ms.bfloat16), name="b")
    flip_bit([brain], BitFlip(0, 1, "weights", 0, 1, 15))
    assert np.array(brain.astype(ms.float32).asnumpy()).tolist() == [1, -1, 1, 1]


def test_a_flip_past_the_tensor_is_said_and_skipped() -> None:
    tensor = ms.Parameter(ms.Tensor(np.ones(4, np.float32)), name="w")
    assert "nothing flipped" in flip_bit([tensor], BitFlip(0, 1, "weights", "v", 0, 0))
    assert "skipped" in flip_bit([tensor], BitFlip(0, 1, "weights", 0, 4, 0))
    assert "skipped" in flip_bit([tensor], BitFlip(0, 1, "weights", 0, 0, 32))
    assert np.array(tensor.asnumpy()).tolist() == [1, 1, 1, 1]


def test_the_checks_name_the_flip_at_its_step(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """Three replicas, rank 2 flipped at step 4 by the configured drill: the window names step 4, the tensor and
    rank 2."""
    monkeypatch.setattr(d, "read_in_place", True)
    flip = {"rank": 2, "step": 4, "kind": "optimizer", "tensor": "adam_m.w1", "element": 5, "bit": 22}
    config = load_config({"divergence": {"replica_group": "0", "allow_injection": True, "inject_flips": [flip]}})
    pages = {}
    for rank in range(3):
        view = run()
        flips = BitFlips(config.divergence.inject_flips, rank)
        checks = Fingerprints(MetricStore(), config.divergence, RankInfo(rank, rank, 3, "node"), LayoutResolver())
        for part in (flips, checks):
            part.on_train_begin(view)
        with caplog.at_level(logging.WARNING, logger="ms_exporter"):
            for step in range(1, 7):
                flips.on_step_end(step, None)
                checks.on_step_end(step, None)
        pages[str(rank)] = json.loads(checks.checksums_page() or "")
    found = first_disagreement(pages)
    assert found == {"step": 4, "kind": "optimizer", "tensor": "adam_m.w1", "ranks": ["2"]}
    assert [r.getMessage() for r in caplog.records if "inject_flips" in r.getMessage()] == [
        "ms_exporter: divergence.inject_flips at step 4: bit 22 of element 5 of optimizer tensor adam_m.w1 flipped"
    ]


def test_a_local_gradient_flip_is_armed_in_the_cell_and_the_other_replicas_split_the_same_step() -> None:
    """The drill's step runs as two graphs on every replica, so that their all-reduces meet."""

    class Cell:
        def __init__(self, weights: list[ms.Parameter]) -> None:
            self.weights = weights
            self.armed: list[tuple[int, int, int, int]] = []
            self.split: list[int] = []

        def flip_local_gradient(self, step: int, gradient: int, element: int, bit: int) -> None:
            self.armed.append((step, gradient, element, bit))

        def split_step(self, step: int) -> None:
            self.split.append(step)

    flips = (
        BitFlip(rank=2, step=40, kind="gradients", tensor="w1", element=3, bit=30),
        BitFlip(rank=2, step=50, kind="gradients", tensor="nope", element=0, bit=0),
        BitFlip(rank=1, step=60, kind="weights", tensor=0, element=0, bit=0),
    )
    for rank in (0, 2):
        view = run()
        cell = Cell(view["train_network"].weights)  # type: ignore[attr-defined]
        view["train_network"] = cell
        BitFlips(flips, rank=rank).on_train_begin(view)
        if rank == 2:
            assert (cell.armed, cell.split) == ([(40, 1, 3, 30)], [50])  # 50: nothing to flip, split all the same
        else:
            assert (cell.armed, cell.split) == ([], [40, 50])
