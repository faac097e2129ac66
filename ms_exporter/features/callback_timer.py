"""The time other callbacks take, told apart from the step and the data wait: the `checkpoint` and `callbacks` phases.

MindSpore calls every callback's hooks in list order, and this monitor's hooks are somewhere in that list: a
ModelCheckpoint after it saves between its step end and the next step begin (what it measures as data wait), one
before it saves inside what it measures as the step. So at train begin the monitor wraps the step and epoch hooks
of the other callbacks in the training's `cb_params.list_callback`. While one runs, the phase is `checkpoint` (a
ModelCheckpoint or a subclass of it, such as MindSpore Transformers' CheckpointMonitor, or a class named in
`hang.checkpoint_callbacks`) or `callbacks` (any other), and its time is kept aside, to be taken out of the step
duration or the data wait it fell in. The wrappers are instance attributes, removed when training ends;
MindSpore's own internal callbacks (its profiler, PYNATIVE's step sync, which is the step's device time) are left
as they are. MindSpore Transformers 2.x's Trainer callbacks (other hook names, another base class) are timed the same
way (monitor/mindformers_trainer.py).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Sequence
from typing import Any

from mindspore.train import Callback, ModelCheckpoint

from ms_exporter.core.catalogue import CALLBACKS, CHECKPOINT
from ms_exporter.core.phases import PhaseClock

# Hooks MindSpore calls between train begin and train end on every step or epoch; each with the older name the
# base class's hook calls (a callback may override either).
MINDSPORE_HOOKS = (
    ("on_train_step_begin", "step_begin"),
    ("on_train_step_end", "step_end"),
    ("on_train_epoch_begin", "epoch_begin"),
    ("on_train_epoch_end", "epoch_end"),
)


def phase_of(callback: Any, checkpoint_names: Collection[str] = ()) -> str:
    """`checkpoint` for a ModelCheckpoint and for a class (or subclass of one) named in `checkpoint_names`."""
    if isinstance(callback, ModelCheckpoint) or any(
        kind.__name__ in checkpoint_names for kind in type(callback).__mro__
    ):
        return CHECKPOINT
    return CALLBACKS


def overridden_hooks(
    callback: Any, hooks: Sequence[tuple[str, str | None]] = MINDSPORE_HOOKS, base: type = Callback
) -> list[str]:
    """The `hooks` (name, older name or None) a callback's class really implements over `base`'s (wrapping the base
    class's no-ops costs time for nothing)."""
    kind = type(callback)
    return [
        hook
        for hook, older in hooks
        if getattr(kind, hook, None) is not getattr(base, hook, None)
        or (older is not None and getattr(kind, older, None) is not getattr(base, older, None))
    ]


def _internal(callback: Any) -> bool:
    kind = type(callback)
    return kind.__module__.startswith("mindspore.") and kind.__name__.startswith("_")


class CallbackTimer:
    """Wraps the other callbacks' hooks for one training call (wrap at train begin, unwrap at its end)."""

    def __init__(self, clock: PhaseClock, checkpoint_names: Collection[str] = ()) -> None:
        self._clock = clock
        self._checkpoint_names = frozenset(checkpoint_names)
        self._wrapped: list[tuple[Any, str, Callable[..., Any]]] = []

    @property
    def wrapped(self) -> list[tuple[Any, str]]:
        return [(callback, hook) for callback, hook, _ in self._wrapped]

    def wrap(
        self,
        callbacks: Iterable[Any],
        monitor: Any,
        hooks: Sequence[tuple[str, str | None]] = MINDSPORE_HOOKS,
        base: type = Callback,
    ) -> None:
        """Times the `hooks` of every callback but `monitor` that overrides them over `base` (MindSpore's by default;
        a trainer with callbacks of its own kind names its hooks and base class)."""
        self.unwrap()
        for callback in callbacks or ():
            if callback is monitor or _internal(callback):
                continue
            phase = phase_of(callback, self._checkpoint_names)
            for hook in overridden_hooks(callback, hooks, base):
                if hook in vars(callback):  # already an instance attribute (another monitor's wrapper, a user's)
                    continue
                wrapper = self._timed(getattr(callback, hook), phase)
                setattr(callback, hook, wrapper)
                self._wrapped.append((callback, hook, wrapper))

    def unwrap(self) -> None:
        for callback, hook, wrapper in self._wrapped:
            if vars(callback).get(hook) is wrapper:
                delattr(callback, hook)
        self._wrapped.clear()

    def _timed(self, hook: Callable[..., Any], phase: str) -> Callable[..., Any]:
        apart = self._clock.apart

        def timed(*args: Any, **kwargs: Any) -> Any:
            with apart(phase):
                return hook(*args, **kwargs)

        timed.__wrapped__ = hook  # type: ignore[attr-defined]
        return timed
