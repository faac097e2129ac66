"""MindSpore Transformers' own `monitor_config` keys (its TrainingStateMonitor's settings) in a block ms_exporter reads.

A MindSpore Transformers run YAML has one top-level `monitor_config`; ms_exporter reads the same block when pointed
at that file (docs/mindformers.md#monitor_config). Keys that mean what one of ours means are read as ours, unless
the block also sets ours; the others stay MindSpore Transformers' business and are named in one log line, never
an error. The table is MindSpore Transformers 1.8's TrainingStateMonitor.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# The names TrainingMonitor is registered under in its callback registry: ours, and the monitor_config article's
# `callback.type` (ms_exporter/mindformers.py, mindformers_register/).
CALLBACK_NAMES = ("TrainingMonitor", "MindSporeTransformersMonitor")

# Its settings that ms_exporter has no counterpart for (local and device-local norms and losses, optimizer and weight
# state, stable rank, attention logits, structure printing, linearity against a baseline, the spike count that
# makes MindSpore Transformers skip data).
LEFT_TO_MINDFORMERS = (
    "monitor_on",
    "dump_path",
    "target",
    "invert",
    "local_norm_format",
    "device_local_norm_format",
    "local_loss_format",
    "device_local_loss_format",
    "optimizer_state_format",
    "weight_state_format",
    "max_attention_logit_format",
    "throughput_baseline",
    "print_struct",
    "stable_rank_config",
    "check_for_global_norm",
    "global_norm_spike_count_threshold",
)
# Its keys read as ours: (ours, why).
READ_AS_OURS = {
    "step_interval": ("grad_norm.every_n_steps", "both are how many steps apart gradient norms are read"),
    "global_norm_spike_threshold": (
        "grad_norm.threshold",
        "both are the global norm above which a step counts as a spike",
    ),
}
MINDFORMERS_KEYS = frozenset(LEFT_TO_MINDFORMERS) | frozenset(READ_AS_OURS)
# Top-level keys of a MindSpore Transformers run YAML that no monitor_config key resembles: a file with one of these
# is such a run config, and its other top-level keys are not a mistake (a stray `model:` still is).
RUN_CONFIG_KEYS = frozenset(
    {
        "trainer",
        "runner_config",
        "runner_wrapper",
        "train_dataset",
        "train_dataset_task",
        "parallel_config",
        "lr_schedule",
    }
)


@dataclass
class Translation:
    """What became of MindSpore Transformers' keys in one monitor_config block."""

    read: dict[str, str] = field(default_factory=dict)  # its key -> ours
    shadowed: dict[str, str] = field(default_factory=dict)  # its key -> ours, which the block also set
    left: list[str] = field(default_factory=list)

    def summary(self) -> str | None:
        """One line for the log and check-config, or None when the block had none of its keys."""
        parts = []
        if self.read:
            parts.append("read as ms_exporter's: " + ", ".join(f"{k} -> {v}" for k, v in self.read.items()))
        if self.shadowed:
            parts.append(
                "not read, ms_exporter's own key is set: " + ", ".join(f"{k} ({v})" for k, v in self.shadowed.items())
            )
        if self.left:
            parts.append("left to MindSpore Transformers' TrainingStateMonitor: " + ", ".join(self.left))
        if not parts:
            return None
        return "monitor_config: MindSpore Transformers keys " + "; ".join(parts) + " (docs/mindformers.md)"


def translate(raw: dict[str, Any]) -> Translation:
    """Take MindSpore Transformers' keys out of `raw` (a monitor_config block, changed in place), putting the ones
    that mean one of ours under our name; what is wrong with a value is then reported under our key's checks."""
    done = Translation()
    for key in [k for k in raw if k in MINDFORMERS_KEYS]:
        value = raw.pop(key)
        if key not in READ_AS_OURS:
            done.left.append(key)
            continue
        ours, _ = READ_AS_OURS[key]
        section, _, name = ours.partition(".")
        block = raw.get(section, {})
        if not isinstance(block, Mapping) or name in block:  # ours is set (a bad section is reported as such)
            done.shadowed[key] = ours
            continue
        raw[section] = {**block, name: value}
        done.read[key] = ours
    return done


def refused(block: Mapping[str, Any], where: str) -> list[str]:
    """A run YAML's own monitor_config holding keys MindSpore Transformers does not know: it stops loading the file
    at the first (`KeyError: The config 'monitor_config' gets an unexpected key: enable`), before any callback of
    ours exists, so that message cannot be ours. Said here instead, for check-config and for a script that hands
    the run YAML to the monitor, with where the keys go."""
    foreign = [str(key) for key in block if str(key) not in MINDFORMERS_KEYS]
    if not foreign:
        return []
    return [
        f"{where}: this MindSpore Transformers run YAML's monitor_config holds {', '.join(foreign)}, which MindSpore "
        "Transformers refuses there (it stops loading the file: KeyError: The config 'monitor_config' gets an "
        f"unexpected key: {foreign[0]}). Move those keys into the monitor's entry under callbacks: "
        "(- type: MindSporeTransformersMonitor, with them beside type), or into a file of their own that the entry "
        "names: config: monitor.yaml (docs/articles.md)"
    ]
