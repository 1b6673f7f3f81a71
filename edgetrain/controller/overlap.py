"""How much of a step's allreduce backprop can hide, from a job's layers (edgetrain.shared.jobs.Layer).

Horovod starts a gradient's allreduce at the first turn of its cycle after backprop has produced
it, while backprop goes on through the earlier layers; later gradients queue behind it on the link.
What the compute still to do covers is hidden, the rest lengthens the step. When each gradient is
ready comes from the layers' multiply-adds: forward, then per layer (last first) its weights'
gradient and, except for the first layer, its input's - each as many multiply-adds as its forward
pass. For LeNet that puts the Dense(3136x512) kernel, 98.5% of the bytes, at 54% of the step:
the convolutions' backprop, 46% of the step, is left to hide its allreduce.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from edgetrain.shared.jobs import Layer


@dataclass(frozen=True)
class Gradient:
    ready: float  # share of a step's compute done when backprop has produced it
    share: float  # its share of the gradient's bytes


def schedule(layers: Sequence[Layer]) -> list[Gradient]:
    """A model's trainable layers (in forward order) in the order backprop produces their gradients."""
    macs = [layer.macs for layer in layers]
    params = [layer.params for layer in layers]
    backward = [m if i == 0 else 2 * m for i, m in enumerate(macs)]
    total = sum(macs) + sum(backward)
    if total == 0:  # no layer with a kernel: nothing to place
        return []
    done, whole, found = sum(macs), sum(params), []
    for i in reversed(range(len(layers))):
        done += backward[i]
        found.append(Gradient(ready=done / total, share=params[i] / whole))
    return found


def exposed(step: float, gradients: list[Gradient], transfer: float, cycle: float) -> float:
    """Seconds the last gradient's allreduce ends after the step's compute: each waits for its
    gradient and half a cycle on average, and for the link; ``transfer`` is the whole gradient's."""
    link_free = 0.0
    for g in sorted(gradients, key=lambda g: g.ready):
        link_free = max(g.ready * step + cycle / 2, link_free) + transfer * g.share
    return max(0.0, link_free - step)
