"""The built-in jobs' learning-rate rule: how the job's base rate grows with the images an update
averages, the warmup that reaches it, and the annealing a job's schedule can use after it.

A job's ``BASE_LR`` is tuned for one rank at the job's own batch size. An update averages the
gradients of ``ranks x accumulated batches x batch`` images; the rate is scaled by how many times
the job's batch that is, to the power ``--lr-scaling`` (1: linear, the rule of Goyal et al.).
"""

from __future__ import annotations

import math

# The default warmup, in epochs; LeNet's annealing starts where it ends.
WARMUP_EPOCHS = 0.25


def scale(ranks: int, accumulated: int, batch: int, job_batch: int, power: float = 1.0) -> float:
    """The factor on the job's base rate once warmed up."""
    return (ranks * accumulated * batch / job_batch) ** power


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
