"""A MindSpore Transformers training configured from a run YAML, with TrainingMonitor in its `callbacks:` list.

Runs in the MindSpore Transformers virtual environment (tests/support/mindformers_venv.py). Usage:
    python mindformers_train.py RUN_YAML WORK_DIR
WORK_DIR receives the MindRecord data, MindSpore Transformers' output and ms_exporter's save_dir; scrapes.jsonl holds
the /metrics lines this harness read after every step.
"""

import json
import sys
import urllib.request
from pathlib import Path

import mindspore as ms
import numpy as np
from mindformers import MindFormerConfig, Trainer
from mindformers.tools.register import MindFormerModuleType, MindFormerRegister
from mindformers.wrapper import MFTrainOneStepCell
from mindspore import ops
from mindspore.mindrecord import FileWriter
from mindspore.train import Callback

import ms_exporter.mindformers  # noqa: F401  (registers TrainingMonitor)

SEQ_LENGTH, VOCAB, SAMPLES = 32, 128, 48


class CpuMFTrainOneStepCell(MFTrainOneStepCell):
    """MFTrainOneStepCell with the overflow check a CPU can run: Ascend's float-status registers
    (NPUGetFloatStatusV2) do not exist there, so overflow is read as "a gradient is not finite"."""

    def get_overflow_status(self, status, compute_output):
        finite = [ops.isfinite(grad).all() for grad in compute_output]
        return ops.logical_not(ops.stack(finite).all())


MindFormerRegister.register_cls(CpuMFTrainOneStepCell, MindFormerModuleType.WRAPPER)


def write_mindrecord(path: Path) -> None:
    writer = FileWriter(str(path), shard_num=1, overwrite=True)
    writer.add_schema({"input_ids": {"type": "int32", "shape": [-1]}}, "tokens")
    rng = np.random.default_rng(0)
    writer.write_raw_data(
        [{"input_ids": rng.integers(3, VOCAB, size=SEQ_LENGTH + 1).astype(np.int32)} for _ in range(SAMPLES)]
    )
    writer.commit()


class Scrape(Callback):
    """Reads the monitor's /metrics after every step (after the YAML's callbacks: Trainer appends these last)."""

    def __init__(self, out: Path) -> None:
        self.out = out.open("w")

    def on_train_step_end(self, run_context):
        monitor = next(cb for cb in run_context.original_args().list_callback if type(cb).__name__ == "TrainingMonitor")
        monitor.publish()
        text = urllib.request.urlopen(monitor.url, timeout=30).read().decode()
        step = run_context.original_args().cur_step_num
        self.out.write(json.dumps({"step": step, "metrics": text}) + "\n")
        self.out.flush()


def main() -> None:
    run_yaml, work = Path(sys.argv[1]), Path(sys.argv[2])
    work.mkdir(parents=True, exist_ok=True)
    data = work / "data.mindrecord"
    write_mindrecord(data)
    config = MindFormerConfig(str(run_yaml))
    config.train_dataset.data_loader.dataset_dir = str(data)
    config.output_dir = str(work / "output")
    for callback in config.callbacks:
        if callback["type"] == "TrainingMonitor":
            callback["save_dir"] = str(work / "monitor")
            callback["config"] = str(run_yaml)
    trainer = Trainer(args=config, callbacks=[Scrape(work / "scrapes.jsonl")])
    trainer.train()
    print("MINDFORMERS_TRAIN_DONE", ms.__version__, flush=True)


if __name__ == "__main__":
    main()
