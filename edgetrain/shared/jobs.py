"""The training jobs, by name.

Each job module holds only what makes it that job (network, optimizer, schedule, augmentation);
the shared Horovod recipe is in edgetrain.rank.training. This registry is read by the controller, so
it names modules without importing TensorFlow.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from edgetrain.shared.errors import UsageError


@dataclass(frozen=True)
class JobSpec:
    name: str
    dataset: str
    module: str
    summary: str
    batch_size: int = 64
    epochs: int = 1
    # What `edgetrain bench` times the job to by default: rank-averaged validation accuracy.
    target_accuracy: float | None = None
    # Job-specific options (name -> default) that `edgetrain run` accepts for this job only.
    options: dict[str, Any] = field(default_factory=dict)

    def load(self) -> ModuleType:
        return importlib.import_module(self.module)


JOBS = {
    spec.name: spec
    for spec in (
        JobSpec("lenet", "mnist", "edgetrain.rank.jobs.lenet", "LeNet on MNIST (Adam)", target_accuracy=0.985),
        JobSpec(
            "fashion",
            "fashion-mnist",
            "edgetrain.rank.jobs.fashion",
            "residual WideResNet-style network on Fashion-MNIST (SGD, step schedule, augmentation)",
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
