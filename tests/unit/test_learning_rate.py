"""The built-in jobs' learning-rate rule (edgetrain.shared.learning_rate)."""

from __future__ import annotations

import pytest

from edgetrain.shared.learning_rate import anneal, scale, warmup


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
    assert scale(ranks, accumulated, batch, 64, power) == pytest.approx(expected)


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
