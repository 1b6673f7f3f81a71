"""Pooling benches' tries by seed (lab/pooled.py), on bench.json bodies written here."""

import json
import math
import subprocess
import sys

import pytest

from lab import pooled
from tests.conftest import ROOT


def trial(nodes: int, seed: int, seconds: float | None, ips: float, beside: int = 0, status: str = "completed") -> dict:
    return {"nodes": nodes, "seed": seed, "seconds_to_target": seconds, "images_per_sec": ips, "beside": beside, "status": status,
            "seconds_to_target_from_launch": seconds + 40 if seconds is not None else None, "test_accuracy": 0.99,
            "images_to_target": int(seconds * 300) if seconds is not None else None}


def body(*trials: dict) -> dict:
    return {"command": ["edgetrain", "bench", "lenet"], "trials": list(trials)}


def test_each_try_is_paired_with_the_one_node_try_of_its_own_bench_and_seed():
    b = body(trial(1, 42, 600, 300), trial(2, 42, 300, 450), trial(1, 43, 500, 320), trial(2, 43, 250, 480),
             trial(1, 43, 550, 310, beside=1), trial(2, 44, 200, 500))  # 44 has no one-node try: nothing to pair it with
    found = pooled.pairs(b, "bench-a")
    assert [(p.seed, p.one["seconds_to_target"], p.many["seconds_to_target"]) for p in found] == [(42, 600, 300), (43, 500, 250)]
    assert found[0].ratio("seconds_to_target") == 2.0 and found[0].ratio("seconds_to_target_from_launch") == 640 / 340
    assert found[0].efficiency == 450 / 600


def test_a_benchs_sync_candidates_are_paired_with_its_one_node_tries_in_a_table_of_their_own():
    candidate = {**trial(2, 42, 200, 520), "sync_every": 4, "sync_mode": "weights"}
    one_candidate = {**trial(1, 42, 700, 290), "sync_every": 4, "sync_mode": "weights"}  # not the reference
    b = {**body(trial(1, 42, 600, 300), trial(2, 42, 300, 450), candidate, one_candidate), "sync_every": 1, "sync_mode": "grads"}
    found = pooled.pairs(b, "bench-a")
    assert [(p.sync, p.one["seconds_to_target"], p.many["images_per_sec"]) for p in found] == [((1, "grads"), 600, 450),
                                                                                              ((4, "weights"), 600, 520)]
    out = pooled.tables(found)
    every, weights = out.split("\n\n")
    assert every.startswith("--sync-every 1 --sync-mode grads:") and "| 2 | 1 | 300 / 340 | 2.00x |" in every
    assert weights.startswith("--sync-every 4 --sync-mode weights:") and "| 2 | 1 | 200 / 240 | 3.00x |" in weights
    # E(2) = 520 / (2 x 300), and what it gives: 2 x E(2).
    assert "| 87% (87%-87%) | 1.73x | 60 |" in weights
    # A bench from before the setting was recorded: every try is its own.
    assert [p.sync for p in pooled.pairs(body(trial(1, 42, 600, 300), trial(2, 42, 300, 450)), "old")] == [(1, "grads")]


def test_the_interval_is_students_on_the_logarithms():
    mean, lo, hi = pooled.interval([2.0, 2.0, 2.0])
    assert (mean, lo, hi) == pytest.approx((2.0, 2.0, 2.0))
    mean, lo, hi = pooled.interval([1.5, 2.0, 2.5])
    logs = [math.log(v) for v in (1.5, 2.0, 2.5)]
    sd = math.sqrt(sum((x - sum(logs) / 3) ** 2 for x in logs) / 2)
    assert mean == pytest.approx(math.exp(sum(logs) / 3))
    assert hi == pytest.approx(math.exp(sum(logs) / 3 + 4.303 * sd / math.sqrt(3)))
    assert lo * hi == pytest.approx(mean * mean)
    assert pooled.t95(11) == pooled.T95[10]  # between the table's rows: the wider one


def test_a_miss_is_counted_not_left_out():
    b = body(trial(1, 42, 600, 300), trial(2, 42, None, 450), trial(1, 43, 500, 300), trial(2, 43, 250, 450))
    out = pooled.table(pooled.pairs(b, "b"))
    assert "| 2 | 2 |" in out and "2.00x, 1 missed" in out and "| 75, 1 missed |" in out


def test_the_command_pools_several_benches_and_refuses_one_without_seeds(tmp_path):
    for name, seed in (("one", 42), ("two", 43)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "bench.json").write_text(json.dumps(body(trial(1, seed, 600, 300), trial(3, seed, 240, 630))))
    r = subprocess.run([sys.executable, "-m", "lab.pooled", str(tmp_path / "one"), str(tmp_path / "two" / "bench.json")],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert ("| 3 | 2 | 240 (240-240) / 280 (280-280) | 2.50x (2.50-2.50) | 2.29x (2.29-2.29) | 70% (70%-70%) | 2.10x | 72 (72-72) "
            "| 99.00%-99.00% |") in r.stdout
    old = body(trial(1, 42, 600, 300))
    del old["trials"][0]["seed"]
    (tmp_path / "old.json").write_text(json.dumps(old))
    r = subprocess.run([sys.executable, "-m", "lab.pooled", str(tmp_path / "old.json")], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode != 0 and "name no seed" in r.stderr
