"""The quick start's network and data (examples/quickstart_loop.py) trained by `Model.train` with the monitor as its
Callback (test helper): what the loop API serves is held against what the Callback serves for the same training.

    python quickstart_model_train.py --port P --samples N
"""

from __future__ import annotations

import argparse
import runpy
from pathlib import Path

import mindspore as ms
from mindspore import nn
from mindspore.dataset import GeneratorDataset
from mindspore.train import Model

from ms_exporter import GradNormTrainOneStepCell, TrainingMonitor

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "quickstart_loop.py"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--samples", type=int, default=1280)
    args = parser.parse_args()
    example = runpy.run_path(str(EXAMPLE))  # its __main__ guard keeps its own training from running
    ms.set_context(mode=ms.PYNATIVE_MODE)
    ms.set_seed(0)
    dataset = GeneratorDataset(example["SyntheticDigits"](args.samples), ["image", "label"], shuffle=False).batch(64)
    network = example["Network"]()
    optimizer = nn.SGD(network.trainable_params(), 1e-2)
    model = Model(GradNormTrainOneStepCell(nn.WithLossCell(network, nn.CrossEntropyLoss()), optimizer))
    monitor = TrainingMonitor(port=args.port, project="quickstart")
    print("metrics at", monitor.url, flush=True)
    model.train(1, dataset, callbacks=[monitor], dataset_sink_mode=False)
    print("trained", flush=True)
    monitor.close()


if __name__ == "__main__":
    main()
