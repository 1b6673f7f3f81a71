"""Where --batch-by speed takes each node's speed (edgetrain.controller.speeds): a bench that timed
every placed node alone wins over the inventory's edgetrain_speed, the two are never mixed, ranks
sharing a node share its speed, and a run with neither is refused saying how to get one."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from edgetrain.controller import placement, speeds
from edgetrain.controller.bench.record import BenchRecord
from edgetrain.controller.inventory import Host
from edgetrain.shared import record, runs
from edgetrain.shared.batches import SPEEDS_ENV
from edgetrain.shared.errors import UsageError


def host(name: str, slots: int = 1, **variables) -> Host:
    return Host(name, name, "aarch64", slots, "docker", vars=variables)


def placed(*hosts_and_ranks) -> placement.Placement:
    return placement.Placement(sum(n for _, n in hosts_and_ranks), tuple(hosts_and_ranks))


def trial(run: str, ips: float, nodes: int = 1, beside: int = 0, **more) -> dict:
    return {"nodes": nodes, "run": run, "images_per_sec": ips, "status": "completed", "beside": beside, **more}


def bench(trials: list[dict], path: Path | None = None) -> BenchRecord:
    """A bench.json holding these trials, as bench reads it back (from ``path``)."""
    return replace(BenchRecord.from_json({"points": None, "trials": trials}), path=path)


def one_node_run(root, host_name: str) -> str:
    run = runs.create(root, "lenet")
    run.write(None, job="lenet", status=record.Status.STARTING,
              placement=record.Where(1, "docker", "horovod", "inv", [{"host": host_name, "ranks": 1}]))
    return run.id


def test_a_bench_that_timed_every_node_wins_and_each_node_is_its_runs_median(tmp_path):
    a, b = one_node_run(tmp_path, "pi5"), one_node_run(tmp_path, "pi4")
    body = bench([trial(a, 500.0), trial(a, 520.0), trial(a, 900.0), trial(b, 250.0), trial("gone", 1.0, host="pi4"),
                  trial(a, 9999.0, nodes=2)], tmp_path / "20261205-bench-lenet-1" / "bench.json")
    known = speeds.from_bench(body, tmp_path)
    assert dict(known.measured) == {"pi5": 520.0, "pi4": 125.5}
    said: list[str] = []
    plan = known.placed(placed((host("pi5", edgetrain_speed=1), 1), (host("pi4", edgetrain_speed=7), 1)), "lenet", said.append)
    assert plan.speeds == (520.0, 125.5) and plan.speeds_from == "bench 20261205-bench-lenet-1"
    assert plan.rank_env[SPEEDS_ENV] == "520,125.5"
    assert said == ["--batch-by speed: from bench 20261205-bench-lenet-1: pi5 520, pi4 125.5"]


def test_one_node_runs_beside_the_most_others_are_taken_over_those_alone():
    body = bench([trial("r1", 800.0, host="pi5"), trial("r2", 600.0, beside=1, host="pi5"),
                  trial("r3", 400.0, beside=2, host="pi5"), trial("r4", 200.0, beside=2, host="pi4"),
                  trial("r5", 210.0, beside=2, host="pi4b")])
    assert dict(speeds.from_bench(body, None).measured) == {"pi5": 400.0, "pi4": 200.0, "pi4b": 210.0}


def test_each_node_timed_alone_is_taken_over_the_n_loops_one_node_runs_and_those_beside_others_over_both():
    tries = [trial("r1", 800.0, host="pi5"), trial("r2", 790.0, host="pi5")]
    each_node = [trial("t1", 500.0, host="pi5"), trial("t2", 250.0, host="pi4")]
    timed = replace(bench(tries), each_node=BenchRecord.from_json({"points": None, "each_node": each_node}).each_node)
    assert dict(speeds.from_bench(timed, None).measured) == {"pi5": 500.0, "pi4": 250.0}
    assert dict(speeds.from_bench(bench(tries), None).measured) == {"pi5": 795.0}  # an older bench: the first node's only
    beside = replace(timed, trials=(*timed.trials, *bench([trial("c1", 400.0, beside=1, host="pi5"),
                                                             trial("c2", 200.0, beside=1, host="pi4")]).trials))
    assert dict(speeds.from_bench(beside, None).measured) == {"pi5": 400.0, "pi4": 200.0}


def test_without_a_bench_of_every_node_the_inventory_speeds_are_used_and_shared_by_a_nodes_ranks():
    known = speeds.NodeSpeeds({"pi5": 500.0}, "b")  # pi4 was never timed alone: the bench is not mixed in
    plan = known.placed(placed((host("pi5", 2, edgetrain_speed=200), 2), (host("pi4", edgetrain_speed="100"), 1)), "lenet", lambda line: None)
    assert plan.speeds == (100.0, 100.0, 100.0) and plan.speeds_from == "the inventory's edgetrain_speed"


def test_a_run_with_no_speed_for_some_node_is_refused_naming_the_nodes():
    with pytest.raises(UsageError) as caught:
        speeds.NodeSpeeds().placed(placed((host("pi5", edgetrain_speed=2), 1), (host("pi4"), 1)), "lenet", lambda line: None)
    assert "no bench of lenet on this inventory timed pi5, pi4 alone, and pi4 set no edgetrain_speed" in str(caught.value)
    assert caught.value.fix.startswith("run edgetrain bench lenet (with the same -i: it times each node alone), or set edgetrain_speed")


def test_equal_batches_tell_the_ranks_nothing():
    assert SPEEDS_ENV not in placed((host("pi4"), 1), (host("pi5"), 1)).rank_env
