"""Batches by speed (edgetrain.shared.batches): the split's rounding, the shards' cover of the
data, the steps every rank takes, and the loss weight that makes an update the global batch's mean."""

from __future__ import annotations

import numpy as np
import pytest

from edgetrain.shared.batches import SPEEDS_ENV, Batches, owners, split


@pytest.mark.parametrize(("total", "speeds", "expected"), [
    (4, [3, 1], (3, 1)),
    (192, [2, 1, 1], (96, 48, 48)),
    (64, [1, 1], (32, 32)),
    (10, [1, 1, 1], (4, 3, 3)),  # the remainder to the lower rank
    (3, [100, 1, 1], (1, 1, 1)),  # every rank keeps one example, however slow
    (7, [1000, 1], (6, 1)),
])
def test_the_split_is_integer_proportional_and_sums_to_the_global_batch(total, speeds, expected):
    got = split(total, speeds)
    assert got == expected
    assert sum(got) == total and min(got) >= 1


@pytest.mark.parametrize(("total", "speeds"), [(1, [1, 1]), (4, [1, 0]), (4, [1, float("nan")])])
def test_a_split_that_cannot_be_made_is_refused(total, speeds):
    with pytest.raises(ValueError):
        split(total, speeds)


@pytest.mark.parametrize("sizes", [(3, 1), (96, 48, 48), (5, 2, 7, 1), (32, 32)])
@pytest.mark.parametrize("examples", [0, 1, 17, 1000, 60000])
def test_uneven_shards_cover_every_example_once_and_give_every_rank_the_same_steps(sizes, examples):
    plans = [Batches(sizes, r) for r in range(len(sizes))]
    shards = [p.indices(examples) for p in plans]
    seen = sorted(i for s in shards for i in s)
    assert seen == list(range(examples))  # a partition: every example in exactly one shard
    steps = plans[0].steps(examples)
    assert all(p.steps(examples) == steps for p in plans) and steps == examples // sum(sizes)
    for p, shard in zip(plans, shards):
        assert len(shard) >= steps * p.mine  # each rank has its steps' examples
        assert abs(len(shard) - examples * p.mine / p.total) < p.total  # in proportion to its batch


def test_equal_batches_keep_the_strided_shards_they_always_had():
    assert owners((4, 4, 4)) == [0, 1, 2] * 4
    assert Batches((8, 8, 8), 1).indices(50) == list(range(1, 50, 3))
    x = np.arange(50)
    even, uneven = Batches((8, 8, 8), 1).shard(x), Batches((3, 1), 1).shard(x)
    assert even.base is x and even.tolist() == list(range(1, 50, 3))  # a view: no copy of the data
    assert uneven.tolist() == Batches((3, 1), 1).indices(50)
    xs, ys = Batches((3, 1), 0).shard(x, x * 10)
    assert (ys == xs * 10).all()


def test_the_weights_make_the_equally_averaged_gradients_the_global_mean():
    plans = [Batches((3, 1), r) for r in range(2)]
    assert [p.weight for p in plans] == [1.5, 0.5]
    # Horovod and DDP average w_r x mean_r: sum(b_r x mean_r) / B is the global batch's mean.
    means = [2.0, 10.0]  # each rank's mean loss (or gradient) over its own batch
    averaged = sum(p.weight * m for p, m in zip(plans, means)) / 2
    assert averaged == pytest.approx((3 * 2.0 + 1 * 10.0) / 4)
    assert Batches((32, 32), 0).weight == 1.0


def test_the_planned_batches_come_from_the_controllers_speeds_with_the_global_batch_unchanged():
    assert Batches.planned(64, 1, 2, env={}) == Batches((64, 64), 1)
    planned = Batches.planned(64, 1, 3, env={SPEEDS_ENV: "2,1,1"})
    assert planned.sizes == (96, 48, 48) and planned.total == 3 * 64 and planned.mine == 48
    with pytest.raises(ValueError, match="2 speeds for 3 ranks"):
        Batches.planned(64, 0, 3, env={SPEEDS_ENV: "2,1"})
