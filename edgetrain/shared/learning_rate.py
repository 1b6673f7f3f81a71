"""The built-in jobs' learning-rate rule: how the job's base rate grows with the images an update
averages, the warmup that reaches it, and the annealing a job's schedule can use after it.

A job's ``BASE_LR`` is tuned for one rank at the job's own batch size. The rate is scaled by how
many times the job's batch an update averages, to the power ``--lr-scaling`` (1: linear, the rule
of Goyal et al.). With ``--sync-mode grads`` (the default) an update averages the gradients of
``ranks x K x batch`` images (K = ``--sync-every``); with ``--sync-mode weights`` each rank's update
is its own batch's, ``batch`` images, whatever the ranks and K: local steps are one rank's steps,
and the ranks' models are averaged every K of them (the outer step's rate, ``--outer-lr``, is
never scaled).
"""

from __future__ import annotations

import math

from edgetrain.shared.sync import EVERY_STEP, Sync

# The default warmup, in epochs; LeNet's annealing starts where it ends.
WARMUP_EPOCHS = 0.25


def images_per_update(ranks: int, batch: int, sync: Sync = EVERY_STEP) -> int:
    """The images whose gradients one update of a rank's model averages."""
    return (ranks if sync.averages_ranks else 1) * sync.accumulated * batch


def scale(ranks: int, batch: int, job_batch: int, power: float = 1.0, sync: Sync = EVERY_STEP) -> float:
    """The factor on the job's base rate once warmed up."""
    return float((images_per_update(ranks, batch, sync) / job_batch) ** power)


def warmup(epoch: float, peak: float, epochs: float) -> float:
    """The share of the scaled rate at ``epoch`` (fractional): a linear rise from the base rate to
    the scaled one over ``epochs``. A rate scaled down (a batch smaller than the job's) needs no
    warmup and has none."""
    if epoch >= epochs or peak <= 1:
        return 1.0
    return (1 + epoch * (peak - 1) / epochs) / peak


def anneal(epoch: float, start: float, end: float, floor: float) -> float:
    """A job's schedule after the warmup: the full rate until ``start``, a half cosine down to
    ``floor`` of it at ``end``, then ``floor``."""
    if epoch <= start:
        return 1.0
    done = min(1.0, (epoch - start) / (end - start))
    return floor + (1 - floor) * (1 + math.cos(math.pi * done)) / 2
