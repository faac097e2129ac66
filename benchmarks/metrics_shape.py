"""The shape of a demo rank's /metrics page with every value masked: HELP and TYPE lines, names, label names and
label values, in order. A change that must not change the page (a refactor) runs this before and after and diffs:

    python -m benchmarks.metrics_shape > after.txt
    git worktree add /tmp/before <commit> && (cd /tmp/before && PYTHONPATH=. python /path/to/this/file) > before.txt
    diff before.txt after.txt

A real GRAPH-mode training of the demo Transformer (DEMO_CONFIG with a fixed peak, so no matmul is timed), 60 steps,
then one memory sample, one round of the hardware readers, one publication and one scrape before close. Values are
masked; so are the label values that are a run's or a machine's own (the run id, the host name, which layers lead
the gradient norms), and the host's CPU temperature is left out (a machine with a sensor has it, a container has
none).
tests/integration/test_metrics_unchanged.py holds the page to tests/integration/data/metrics_shape.txt.
"""

from __future__ import annotations

import re
import sys
import tempfile
import time
import urllib.request
from typing import Any

STEPS = 60
# Label values that are a run's own, not the page's shape.
# The host's CPU temperature exists where the kernel has a sensor (not in most containers): the machine's, not the
# page's shape.
_MACHINE_ONLY = re.compile(r'mindspore_train_device_temperature_celsius\{device="host"')
_VARYING = re.compile(
    r'(run_id|node|layer|mindspore_version|exporter_version|hostname|pod|namespace|container)="[^"]*"'
)
_NODE_GROUP = re.compile(r'group="[^"]*",kind="node"')  # a group of kind node is named by the host


def _checkout_only() -> None:
    """Import ms_exporter from the checkout this runs in (the current directory or PYTHONPATH), never through the
    venv's editable install of another checkout: its finder would hand out that checkout's modules by name."""
    sys.meta_path[:] = [finder for finder in sys.meta_path if "editable" not in repr(finder).lower()]


def _sample_memory(monitor: Any) -> None:
    sampler = getattr(monitor, "_sampler", None)  # a checkout before the parts were one list
    if sampler is None:
        from ms_exporter.features.sampler import MemorySampler

        sampler = monitor.part_of(MemorySampler)
    sampler._sample()


def _sample_hardware(monitor: Any) -> None:
    """One round of the hardware readers, waited for (a checkout without hardware readers has none)."""
    try:
        from ms_exporter.features.hardware.monitor import HardwareMonitor
    except ImportError:
        return
    hardware = monitor.part_of(HardwareMonitor)
    hardware.sample()
    deadline = time.monotonic() + 30
    while any(worker.busy_since is not None for worker in hardware._readers) and time.monotonic() < deadline:
        time.sleep(0.05)


def masked(page: str) -> list[str]:
    lines = []
    for line in page.splitlines():
        if _MACHINE_ONLY.match(line):
            continue
        if line.startswith("#"):
            lines.append(line)
            continue
        name_and_labels, _, _value = line.rpartition(" ")
        masked = _NODE_GROUP.sub('group="*",kind="node"', _VARYING.sub(r'\1="*"', name_and_labels))
        lines.append(masked + " V")
    return lines


def shape() -> list[str]:
    return masked(page())


def page() -> str:
    """The demo's /metrics page after a short training, as it is (`promtool check metrics` reads it)."""
    _checkout_only()
    import mindspore as ms

    from ms_exporter import TrainingMonitor, demo  # demo.py has been ms_exporter's own since the first commit

    ms.set_context(mode=ms.GRAPH_MODE)
    ms.set_seed(0)
    with tempfile.TemporaryDirectory() as save_dir:
        config = {
            **demo.DEMO_CONFIG,
            "flops": {**demo.DEMO_CONFIG["flops"], "peak_flops_per_device": 1e12},
            "file_sd_dir": f"{save_dir}/targets",
            "save_dir": save_dir,
            "port": 0,
        }
        monitor = TrainingMonitor(config)
        try:
            model = demo.build_model(decay_steps=STEPS)
            model.train(
                1, demo.synthetic_dataset(size=STEPS * demo.BATCH), callbacks=[monitor], dataset_sink_mode=False
            )
            _sample_memory(monitor)  # what the sampler thread does every few seconds, once, now: no timing
            _sample_hardware(monitor)
            monitor.publish()
            url = monitor.url
            assert url is not None, "DEMO_CONFIG's backend serves /metrics: the monitor has its URL"
            with urllib.request.urlopen(url, timeout=10) as answer:
                page: str = answer.read().decode("utf-8")
        finally:
            monitor.close()
    return page


if __name__ == "__main__":
    sys.stdout.write("\n".join(shape()) + "\n")
