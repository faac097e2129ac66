"""Whether the replica checks of every step cost this rank more than their share of a step, said once (docs/sdc.md).

The checks read every weight and optimizer state tensor each step, so their time grows with the parameters while a
step's grows with the work per parameter: on the demo model they take under 1% of a step, with few tokens per rank
and many parameters (or on a CPU, where the device's reductions share the training's cores) they can take more than
the step itself (docs/benchmarks.md, "Cost against model size"). The monitor cannot lower their rate on its own:
every replica must read the same steps, or their sums differ, and each rank measures only its own time. So it
measures, and once the median check has cost more than CHECK_BUDGET of the median cycle between two checks over
CHECK_WINDOW checks, it warns with the figures and the settings that bring them within it: the least
`divergence.check_every_n_steps` that does (it must divide `divergence.every_n_steps`), or the checks off.
"""

from __future__ import annotations

import collections
import logging
import math
import statistics

logger = logging.getLogger("ms_exporter")

CHECK_BUDGET = 0.01  # of a step: the replica checks' target (docs/sdc.md)
CHECK_WINDOW = 64  # steps the medians are over


class CheckCost:
    """Each check against the cycle between two checks (`every` steps), in seconds, from the training thread at step
    end; warns once when the medians put the checks over CHECK_BUDGET of that cycle."""

    def __init__(self, values: int, every: int = 1, compared_every: int = 1) -> None:
        self._values = values  # values read a check: for the warning
        self._every = every  # divergence.check_every_n_steps: the steps a cycle between two checks spans
        self._compared_every = compared_every  # divergence.every_n_steps, which a check interval must divide
        self._checks: collections.deque[float] = collections.deque(maxlen=CHECK_WINDOW)
        self._steps: collections.deque[float] = collections.deque(maxlen=CHECK_WINDOW)
        self._seen = 0
        self.warned = False

    def observe(self, check: float, rest: float) -> None:
        """A check took `check` seconds, and the time since the end of the previous one `rest` seconds."""
        if self.warned:
            return
        self._checks.append(check)
        self._steps.append(check + rest)
        self._seen += 1
        if self._seen % CHECK_WINDOW:
            return  # judged once a window: a median a step would cost more than the check of a small model
        check, cycle = statistics.median(self._checks), statistics.median(self._steps)
        if check > CHECK_BUDGET * cycle:
            self.warned = True
            logger.warning(
                "ms_exporter: the replica checks read %s values in %.2f ms every %d step(s), %.1f%% of this rank's "
                "median %.1f ms between two checks (more than the %.0f%% they are meant to cost): %s "
                "(docs/sdc.md#what-it-costs)",
                f"{self._values:,}",
                check * 1e3,
                self._every,
                100 * check / cycle,
                cycle * 1e3,
                100 * CHECK_BUDGET,
                self._remedy(check, cycle),
            )

    def _remedy(self, check: float, cycle: float) -> str:
        """The least check interval within the budget that divides the comparison interval, set alike on every rank;
        else the checks off."""
        step = (cycle - check) / self._every  # a step's time without the checks
        wanted = math.ceil(check / (CHECK_BUDGET * step)) if step > 0 else math.inf
        fitting = [n for n in range(self._every + 1, self._compared_every + 1) if not self._compared_every % n]
        within = [n for n in fitting if n >= wanted]
        off = "divergence.check_every_step: false keeps only a fingerprint every divergence.every_n_steps steps"
        if within:
            return f"divergence.check_every_n_steps: {within[0]} on every rank brings them within it, or {off}"
        return off
