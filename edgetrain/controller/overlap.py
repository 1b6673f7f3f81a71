"""How much of a step's allreduce backprop can hide, from a Keras model's layers.

Horovod starts a gradient's allreduce at the first turn of its cycle after backprop has produced
it, while backprop goes on through the earlier layers; later gradients queue behind it on the link.
What the compute still to do covers is hidden, the rest lengthens the step. When each gradient is
ready comes from the layers' multiply-adds: forward, then per layer (last first) its weights'
gradient and, except for the first layer, its input's - each as many multiply-adds as its forward
pass. For LeNet that puts the Dense(3136x512) kernel, 98.5% of the bytes, at 54% of the step:
the convolutions' backprop, 46% of the step, is left to hide its allreduce.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Gradient:
    ready: float  # share of a step's compute done when backprop has produced it
    share: float  # its share of the gradient's bytes


def _macs(layer) -> int:
    """Forward multiply-adds per example of a layer with a kernel (Dense and convolutions, channels
    last): the kernel's size at each output position. Layers without one cost nothing here."""
    kernel = getattr(layer, "kernel", None)
    if kernel is None:
        return 0
    positions = math.prod(int(d) for d in layer.output.shape[1:-1])
    return positions * int(kernel.shape.num_elements())


def schedule(model) -> list[Gradient]:
    """The model's trainable layers in the order backprop produces their gradients."""
    layers = [layer for layer in model.layers if layer.trainable_weights]
    macs = [_macs(layer) for layer in layers]
    params = [sum(int(w.shape.num_elements()) for w in layer.trainable_weights) for layer in layers]
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
