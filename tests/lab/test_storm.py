"""The storm's draw and its judgements of what ran (lab/storm.py), on made-up runs."""

from __future__ import annotations

from collections import Counter

from lab.storm import Kind, draw, progress_at, retrained, time_lost


def test_the_draw_is_the_seeds_and_gives_every_kind_once_before_any_twice():
    plan = draw(7, 10, 30, "node1", ["node2", "node3"])
    assert plan == draw(7, 10, 30, "node1", ["node2", "node3"]) and plan != draw(8, 10, 30, "node1", ["node2", "node3"])
    assert set(p.kind for p in plan[:5]) == set(Kind) and set(p.kind for p in plan[5:]) == set(Kind)
    assert Counter(p.kind for p in draw(1, 3, 30, "node1", ["node2"])).most_common(1)[0][1] == 1
    for p in plan:
        assert p.node == "node1" if p.kind in (Kind.DISK, Kind.CONTROLLER) else True
        assert p.node in ("node2", "node3") if p.kind in (Kind.CONTAINER, Kind.LINK) else True
    gap = 30 * 60 * 0.35 / 11
    assert all(0.5 * gap <= p.after_s <= 1.5 * gap and 5 <= p.hold_s <= 30 for p in plan)


def test_an_epoch_may_be_trained_twice_only_where_an_attempt_resumed_before_it():
    attempts = [{"resumed_from_epoch": None}, {"resumed_from_epoch": 3}, {"resumed_from_epoch": 6}]
    once = [{"epoch": e} for e in range(1, 10)]
    assert retrained(once, attempts) == []
    # Epoch 4's line was written, its checkpoint not, when the first attempt ended: in progress.
    assert retrained(once[:4] + [{"epoch": e} for e in range(4, 10)], attempts) == []
    # Epoch 3 had its checkpoint: training it again lost work.
    again = once[:4] + [{"epoch": e} for e in range(3, 10)]
    assert retrained(again, attempts) == ["epoch 3 trained 2 times"]
    # Resumed from checkpoint 2 though 3 was written: 3 and 4 again, one more than the one end allows.
    assert retrained(again, [{"resumed_from_epoch": None}, {"resumed_from_epoch": 2}]) == [
        "epoch 4 trained 2 times", "2 epochs trained twice over 1 ends of an attempt: [3, 4]"]
    three = once + [{"epoch": 7}, {"epoch": 7}]
    assert "epoch 7 trained 3 times" in retrained(three, attempts)


def test_time_lost_is_the_wait_less_the_progress_made():
    epochs = [(10.0 * e, e) for e in range(1, 6)] + [(100.0 + 10 * e, e) for e in range(6, 9)]  # 50 s lost between 5 and 6
    assert progress_at(epochs, 25.0, 10.0) == 2.5
    # A fault at 55 s (epoch 5 half done), training back at 100 s: epoch 6 ends at 160 s, 5.5 epochs' progress
    # would have taken 5 s undisturbed... the run was at 5.5, reached 6 at 160 s: 105 s for half an epoch.
    assert time_lost(epochs, 55.0, 100.0, 10.0) == 100.0
    assert time_lost(epochs, 20.0, 20.5, 10.0) == 0.0  # nothing lost: the next epoch came on time
