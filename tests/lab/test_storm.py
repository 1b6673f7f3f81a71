"""The storm's draw and its judgements of what ran (lab/storm.py), on made-up runs."""

from __future__ import annotations

from collections import Counter

import pytest

from lab.storm import Kind, docs_table, draw, progress_at, retrained, time_lost


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


def _kept(problems: list[str]) -> dict:
    fault = {"what": "worker link cut", "node": "node2", "noticed_seconds": 25.6, "over_seconds": 38.2, "back_seconds": 52.4,
             "lost_seconds": 44.9}
    return {"seed": 7, "epochs": 40, "took_seconds": 600.0, "lost_seconds": 60.2, "attempts": 3, "checkpoints_verified": 40,
            "epochs_trained_twice": [12], "problems": problems,
            "faults": [{**fault, "kind": "link"}, {**fault, "kind": "cpu", "what": "CPU cut to a quarter", "noticed_seconds": None}],
            "compared": {"storm_accuracy": 0.9871, "undisturbed_accuracy": 0.9875, "difference_points": -0.04}}


def test_the_docs_table_is_the_kept_storms_and_refuses_one_with_problems():
    text = docs_table(_kept([]))
    assert "| worker link cut (node2) | 26 s | 52 s | 45 s | restarted without node2, taken back 38 s after |" in text
    assert "| CPU cut to a quarter (node2) | - | 52 s | 45 s | slower, nothing ended |" in text
    assert "Seed 7, 2 faults, 40 epochs in 10.0 minutes, 60 s lost in all" in text and "epochs trained twice: 12 (each the one in progress when its attempt ended)." in text
    assert "0.9871 after the storm, 0.9875 undisturbed (-0.04 points)" in text
    with pytest.raises(ValueError, match="had problems"):
        docs_table(_kept(["left: a container"]))
