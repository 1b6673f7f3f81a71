"""The training jobs, by name.

Each job module holds only what makes it that job (network, optimizer, schedule, augmentation);
the shared Horovod recipe is in edgetrain.rank.training. This registry is read by the controller, so
it names modules without importing TensorFlow.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from edgetrain.shared.errors import UsageError


@dataclass(frozen=True)
class Layer:
    """A trainable layer as backprop sees it: its forward multiply-adds per example (the kernel's size
    at each output position; none for one without a kernel, as batch normalization) and its
    trainable parameters."""

    macs: int
    params: int


def _lenet(options: dict[str, Any]) -> tuple[Layer, ...]:
    """edgetrain.rank.jobs.lenet's model: two 3x3 convolutions (28x28, then 14x14 after pooling), Dense(512), Dense(10)."""
    return (Layer(28 * 28 * 9 * 32, 9 * 32 + 32), Layer(14 * 14 * 9 * 32 * 64, 9 * 32 * 64 + 64),
            Layer(7 * 7 * 64 * 512, 7 * 7 * 64 * 512 + 512), Layer(512 * 10, 512 * 10 + 10))


def _fashion(options: dict[str, Any]) -> tuple[Layer, ...]:
    """edgetrain.rank.jobs.fashion's model: three stages (28, 14, 7 pixels a side) of ``depth`` blocks,
    each two 3x3 convolutions without bias and their batch normalizations, and a 1x1 shortcut
    convolution where the width changes (after the block's own, in the order Keras lists them)."""
    depth, width = int(options["depth"]), int(options["width"])
    found, channels = [], 1
    for stage, side in enumerate((28, 14, 7)):
        wide = width << stage
        for _ in range(depth):
            found += [Layer(side * side * 9 * c * wide, 9 * c * wide) if k == 0 else Layer(0, 2 * wide)
                      for c in (channels, wide) for k in (0, 1)]
            if channels != wide:
                found.append(Layer(side * side * channels * wide, channels * wide))
            channels = wide
    return (*found, Layer(channels * 10, channels * 10 + 10))


@dataclass(frozen=True)
class JobSpec:
    name: str
    dataset: str
    module: str
    summary: str
    # Its model's trainable layers, in the order Keras lists them, as its options shape them: what
    # the controller knows of the model (its gradient's size, when backprop produces each part)
    # without importing TensorFlow. tests/unit/test_bench.py holds them against the built model.
    layers: Callable[[dict[str, Any]], tuple[Layer, ...]]
    batch_size: int = 64
    epochs: int = 1
    # What `edgetrain bench` times the job to by default: rank-averaged validation accuracy.
    target_accuracy: float | None = None
    # Job-specific options (name -> default) that `edgetrain run` accepts for this job only.
    options: dict[str, Any] = field(default_factory=dict)

    def load(self) -> ModuleType:
        """The job's module, which imports TensorFlow: for a rank, never the controller."""
        return importlib.import_module(self.module)

    def gradient_bytes(self, options: dict[str, Any]) -> int:
        """The model's gradient: 4 bytes per trainable parameter."""
        return 4 * sum(layer.params for layer in self.layers(options))


JOBS = {
    spec.name: spec
    for spec in (
        JobSpec("lenet", "mnist", "edgetrain.rank.jobs.lenet", "LeNet on MNIST (Adam)", _lenet, target_accuracy=0.985),
        JobSpec(
            "fashion",
            "fashion-mnist",
            "edgetrain.rank.jobs.fashion",
            "residual WideResNet-style network on Fashion-MNIST (SGD, step schedule, augmentation)",
            _fashion,
            batch_size=32,
            options={"depth": 2, "width": 16},
            target_accuracy=0.90,
        ),
    )
}


def get(name: str) -> JobSpec:
    try:
        return JOBS[name]
    except KeyError:
        raise UsageError(f"unknown job {name!r}", f"choose one of: {', '.join(JOBS)}") from None
