"""Whether the replica checks of every step cost this rank more than their share of a step, said once (docs/sdc.md).

The checks read every weight and optimizer state tensor each step, so their time grows with the parameters while a
step's grows with the work per parameter: on the demo model they take under 1% of a step, with few tokens per rank
and many parameters (or on a CPU, where the device's reductions share the training's cores) they can take more than
the step itself (docs/benchmarks.md, "Cost against model size"). The monitor cannot lower their rate on its own:
every replica must read the same steps, or their sums differ, and each rank measures only its own time. So it
measures, and once the median check has cost more than CHECK_BUDGET of the median step over CHECK_WINDOW steps, it
warns with the figures and the setting that turns the checks off.
"""

from __future__ import annotations

import collections
import logging
import statistics

logger = logging.getLogger("ms_exporter")

CHECK_BUDGET = 0.01  # of a step: the replica checks' target (docs/sdc.md)
CHECK_WINDOW = 64  # steps the medians are over


class CheckCost:
    """Each step's checks against the rest of its cycle, both in seconds, from the training thread at step end;
    warns once when the medians put the checks over CHECK_BUDGET of the cycle."""

    def __init__(self, values: int) -> None:
        self._values = values  # values read a step: for the warning
        self._checks: collections.deque[float] = collections.deque(maxlen=CHECK_WINDOW)
        self._steps: collections.deque[float] = collections.deque(maxlen=CHECK_WINDOW)
        self._seen = 0
        self.warned = False

    def observe(self, check: float, rest: float) -> None:
        """A step's checks took `check` seconds; the rest of its cycle (from the end of the previous step's checks)
        `rest` seconds."""
        if self.warned:
            return
        self._checks.append(check)
        self._steps.append(check + rest)
        self._seen += 1
        if self._seen % CHECK_WINDOW:
            return  # judged once a window: a median a step would cost more than the check of a small model
        check, step = statistics.median(self._checks), statistics.median(self._steps)
        if check > CHECK_BUDGET * step:
            self.warned = True
            logger.warning(
                "ms_exporter: the replica checks of every step read %s values in %.2f ms, %.1f%% of this rank's "
                "median step cycle of %.1f ms (more than the %.0f%% they are meant to cost): "
                "divergence.check_every_step: false keeps a fingerprint every divergence.every_n_steps steps instead "
                "(docs/sdc.md#what-it-costs)",
                f"{self._values:,}",
                check * 1e3,
                100 * check / step,
                step * 1e3,
                100 * CHECK_BUDGET,
            )
