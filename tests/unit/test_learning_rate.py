"""The built-in jobs' learning-rate rule (edgetrain.shared.learning_rate)."""

from __future__ import annotations

import pytest

from edgetrain.shared.learning_rate import anneal, images_per_update, scale, warmup
from edgetrain.shared.sync import Sync, SyncMode


@pytest.mark.parametrize(("ranks", "accumulated", "batch", "power", "expected"), [
    (1, 1, 64, 1.0, 1.0),    # the job's own setting: its base rate
    (4, 1, 64, 1.0, 4.0),    # each rank adds a batch to the update
    (1, 2, 64, 1.0, 2.0),    # so does each accumulated batch
    (1, 1, 128, 1.0, 2.0),   # and a larger batch
    (2, 1, 32, 1.0, 1.0),    # half the batch on two ranks: the same images per update
    (2, 2, 96, 0.5, 6 ** 0.5),
    (4, 1, 128, 0.0, 1.0),   # power 0: never scaled
])
def test_the_rate_scales_with_the_images_an_update_averages_against_the_jobs_batch(ranks, accumulated, batch, power, expected):
    assert scale(ranks, batch, 64, power, Sync(accumulated)) == pytest.approx(expected)


@pytest.mark.parametrize(("ranks", "every", "batch", "power", "expected"), [
    (1, 1, 64, 1.0, 1.0),
    (4, 1, 64, 1.0, 1.0),    # more ranks: each still updates with its own batch
    (4, 8, 64, 1.0, 1.0),    # and syncing less often changes nothing of a local update
    (4, 8, 128, 1.0, 2.0),   # only the batch does
    (4, 8, 128, 0.5, 2 ** 0.5),
])
def test_syncing_weights_the_rate_is_one_ranks_at_its_batch_whatever_the_ranks_and_k(ranks, every, batch, power, expected):
    assert scale(ranks, batch, 64, power, Sync(every, SyncMode.WEIGHTS)) == pytest.approx(expected)


def test_accumulating_k_batches_on_n_ranks_an_update_averages_n_k_batches_and_syncing_weights_one():
    assert images_per_update(3, 64, Sync(4, "grads")) == 3 * 4 * 64
    assert images_per_update(3, 64, Sync(4, "weights")) == 64
    assert images_per_update(3, 64) == 3 * 64  # every step: what the jobs did before --sync-every


def test_warmup_rises_linearly_from_the_base_rate_to_the_scaled_one():
    assert warmup(0.0, 4.0, 0.25) == pytest.approx(0.25)  # 1/peak: the job's base rate
    assert warmup(0.125, 4.0, 0.25) == pytest.approx(0.625)
    assert warmup(0.25, 4.0, 0.25) == 1.0
    assert warmup(3.0, 4.0, 0.25) == 1.0


def test_a_rate_scaled_down_or_no_warmup_starts_at_the_scaled_rate():
    assert warmup(0.0, 0.5, 0.25) == 1.0  # a batch under the job's: no rise above its own rate
    assert warmup(0.0, 4.0, 0.0) == 1.0


def test_anneal_holds_the_rate_then_falls_along_a_half_cosine_to_its_floor():
    assert anneal(0.0, 0.25, 1.0, 0.1) == 1.0
    assert anneal(0.25, 0.25, 1.0, 0.1) == 1.0
    assert anneal(0.625, 0.25, 1.0, 0.1) == pytest.approx(0.55)  # halfway: the mean of 1 and the floor
    assert anneal(1.0, 0.25, 1.0, 0.1) == pytest.approx(0.1)
    assert anneal(5.0, 0.25, 1.0, 0.1) == pytest.approx(0.1)
    rates = [anneal(e / 100, 0.25, 1.0, 0.1) for e in range(25, 101)]
    assert all(a > b for a, b in zip(rates, rates[1:]))
