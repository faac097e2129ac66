"""MindSpore's cb_params (`run_context.original_args()`), read in one place: each key named once, with its meaning.

cb_params is a dict (MindSpore's `_InternalCallbackParam`); its attribute access is a slower detour, so the step
hooks subscript it with the key constants below, and everything else reads it through the functions, which answer
a default where a key is missing (a script's own run_context, an older MindSpore). Checked against MindSpore 2.10.
"""

from __future__ import annotations

from typing import Any

# -- keys ----------------------------------------------------------------------------------------------------------

# Whatever the train cell returned this step: a scalar loss Tensor (TrainOneStepCell); (loss, overflow, scale) from
# TrainOneStepWithLossScaleCell; (loss, {name: grad}) with return_grad=True; MindSpore Transformers' wrappers give
# (loss, overflow, scaling_sens, lr, global_norm) or a 7-tuple adding local norms (core/output_layout.py).
NET_OUTPUTS = "net_outputs"
# The global step after this call (already incremented in on_train_step_begin; sink mode adds sink_size per call).
CUR_STEP_NUM = "cur_step_num"
CUR_EPOCH_NUM = "cur_epoch_num"  # the current epoch, from 1
EPOCH_NUM = "epoch_num"  # epochs this training call runs (from initial_epoch on)
BATCH_NUM = "batch_num"  # steps per epoch: the dataset's size (sink_size in sink mode)
DATASET_SINK_MODE = "dataset_sink_mode"
# The batch's tensors, in the dataset's column order (non-sink mode only: absent in sink mode).
TRAIN_DATASET_ELEMENT = "train_dataset_element"
TRAIN_DATASET = "train_dataset"  # the dataset training reads (column names, batch size, shapes)
TRAIN_NETWORK = "train_network"  # the train cell that runs a step (TrainOneStepCell or one of ours)
NETWORK = "network"  # the network Model was given (with its loss, or the train cell itself)
OPTIMIZER = "optimizer"
LOSS_SCALE_MANAGER = "loss_scale_mananger"  # sic: MindSpore spells it so
LIST_CALLBACK = "list_callback"  # the list of this training call's callbacks (MindSpore's own inserted ones too)
# At eval end, {metric name: value}: "metrics" the Model's metrics; "eval_results" those plus "eval_loss", when
# Model.fit adds the validation loss.
EVAL_RESULTS, METRICS = "eval_results", "metrics"


# -- readers -------------------------------------------------------------------------------------------------------


def step_of(cb_params: Any) -> int:
    """The global step after this call (0 before the first)."""
    return int(cb_params.get(CUR_STEP_NUM, 0) or 0)


def epoch_of(cb_params: Any) -> int:
    return int(cb_params.get(CUR_EPOCH_NUM, 0) or 0)


def epochs_of(cb_params: Any) -> int:
    """Epochs this training call runs (0 when not said)."""
    return int(cb_params.get(EPOCH_NUM, 0) or 0)


def steps_per_epoch_of(cb_params: Any) -> int:
    """Steps per epoch as MindSpore counts them (0 when not said)."""
    return int(cb_params.get(BATCH_NUM, 0) or 0)


def sink_mode_of(cb_params: Any) -> bool:
    return bool(cb_params.get(DATASET_SINK_MODE, False))


def batch_of(cb_params: Any) -> Any:
    """This step's batch (its tensors in column order), None in sink mode."""
    return cb_params.get(TRAIN_DATASET_ELEMENT)


def dataset_of(cb_params: Any) -> Any:
    return cb_params.get(TRAIN_DATASET)


def train_network_of(cb_params: Any) -> Any:
    """The train cell that runs each step (None when MindSpore did not say)."""
    return cb_params.get(TRAIN_NETWORK)


def network_of(cb_params: Any) -> Any:
    """The train cell, else the network Model was given: the cell to look for parameters and layers in."""
    return cb_params.get(TRAIN_NETWORK) or cb_params.get(NETWORK)


def optimizer_of(cb_params: Any) -> Any:
    return cb_params.get(OPTIMIZER)


def trained_weights_of(cb_params: Any) -> list[Any]:
    """The parameters the step trains: the train cell's `weights`, else the optimizer's `parameters`
    (Model(GradNormTrainOneStepCell(...)) leaves cb_params.optimizer empty: the cell's weights are the same)."""
    weights = getattr(train_network_of(cb_params), "weights", None)
    if weights is None:
        weights = getattr(optimizer_of(cb_params), "parameters", None)
    return list(weights or [])


def optimizer_state_of(cb_params: Any, weights: list[Any]) -> list[Any]:
    """The optimizer's own Parameters (moments, its step counter, its learning rate where it is one), in its order:
    the optimizer of the run, else the train cell's."""
    optimizer = optimizer_of(cb_params) or getattr(train_network_of(cb_params), "optimizer", None)
    if optimizer is None or not hasattr(optimizer, "get_parameters"):
        return []
    trained = {id(w) for w in weights}
    return [p for p in optimizer.get_parameters() if id(p) not in trained]


def loss_scale_manager_of(cb_params: Any) -> Any:
    # Also the correct spelling: a script's own run_context (or a MindSpore that fixes it) may use it.
    return cb_params.get(LOSS_SCALE_MANAGER) or cb_params.get("loss_scale_manager")


def callbacks_of(cb_params: Any) -> Any:
    """The callbacks of this training call, if MindSpore said."""
    return cb_params.get(LIST_CALLBACK)


def eval_results_of(cb_params: Any) -> dict[str, Any] | None:
    """The latest evaluation's {metric: value}, None when there is none."""
    results = cb_params.get(EVAL_RESULTS) or cb_params.get(METRICS)
    return results if isinstance(results, dict) else None
