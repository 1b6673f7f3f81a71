"""Where --batch-by speed takes each node's speed (edgetrain.controller.speeds): a bench that timed
every placed node alone wins over the inventory's edgetrain_speed, the two are never mixed, ranks
sharing a node share its speed, and a run with neither is refused saying how to get one; and
what --batch-by auto takes from the newest bench that chose."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from edgetrain.controller import config as configs, placement, program as programs, speeds
from edgetrain.controller.bench.record import BenchRecord
from edgetrain.controller.inventory import Host
from edgetrain.shared import record, runs
from edgetrain.shared.batches import SPEEDS_ENV, BatchBy
from edgetrain.shared.errors import UsageError
from edgetrain.shared.job_options import JobOptions
from edgetrain.shared.sync import SyncMode
from tests.conftest import assert_one_line_error, edgetrain


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


def bench_dir(root: Path, name: str, each_node: list[dict] | None, batch_choice: dict | None, inventory: str | None = None) -> None:
    """A finished bench of lenet in ``root``, as (t) leaves it."""
    (root / name).mkdir(parents=True)
    body = {"points": [{"nodes": 3, "trials": []}], "inventory": inventory, "each_node": each_node, "batch_choice": batch_choice}
    (root / name / "bench.json").write_text(json.dumps(body))


def test_batch_by_auto_takes_the_newest_benchs_choice_with_its_rates_and_else_equal_batches_saying_which(tmp_path):
    root = tmp_path / "runs"
    said: list[str] = []
    assert speeds.planned(BatchBy.AUTO, root, "lenet", None, said.append) is None  # no bench at all
    assert said == [f"--batch-by auto: equal, as no bench of lenet on this machine in {root} timed every node alone "
                    "(edgetrain bench lenet does)"]
    timed = [trial("t1", 500.0, host="pi5"), trial("t2", 250.0, host="pi4a"), trial("t3", 250.0, host="pi4b")]
    chose = {"batch_by": "speed", "nodes": 3, "by_speed": 1000.0, "equal": 750.0}
    bench_dir(root, "20261201-000000-bench-lenet-aaaa", [{**t, "images_per_sec": 100.0} for t in timed], {**chose, "batch_by": "equal"})
    bench_dir(root, "20261202-000000-bench-lenet-bbbb", timed, chose)
    bench_dir(root, "20261203-000000-bench-lenet-cccc", None, None)  # newer, but it timed no node alone
    bench_dir(root, "20261204-000000-bench-lenet-dddd", timed, {**chose, "batch_by": "fast"})  # damaged: passed over
    bench_dir(root, "20261205-000000-bench-lenet-eeee", timed, {**chose, "batch_by": "equal"}, inventory="/elsewhere")
    said.clear()
    known = speeds.planned(BatchBy.AUTO, root, "lenet", None, said.append)
    assert known == speeds.NodeSpeeds({"pi5": 500.0, "pi4a": 250.0, "pi4b": 250.0}, "20261202-000000-bench-lenet-bbbb", chosen=True)
    assert said == ["--batch-by auto: speed, chosen by bench 20261202-000000-bench-lenet-bbbb on 3 nodes: "
                    "predicted 1,000 img/s by speed against 750 equal (+33%)"]
    assert known.placed(placed((host("pi5"), 1), (host("pi4a"), 1)), "lenet", said.append).speeds == (500.0, 250.0)
    # Placed on a node the bench did not time: its choice does not speak of it, so equal batches,
    # not the inventory's edgetrain_speed nor a refusal as with --batch-by speed.
    said.clear()
    plan = placed((host("pi5", edgetrain_speed=2), 1), (host("pi4c", edgetrain_speed=1), 1))
    assert known.placed(plan, "lenet", said.append) == plan and plan.speeds is None
    assert said == ["--batch-by auto: equal after all, as bench 20261202-000000-bench-lenet-bbbb did not time pi4c alone"]
    assert replace(known, chosen=False).placed(plan, "lenet", said.append).speeds == (2.0, 1.0)
    # A bench that chose equal batches: none by speed, said.
    bench_dir(root, "20261206-000000-bench-lenet-ffff", timed, {**chose, "batch_by": "equal", "by_speed": 780.0})
    said.clear()
    assert speeds.planned(BatchBy.AUTO, root, "lenet", None, said.append) is None
    assert said == ["--batch-by auto: equal, chosen by bench 20261206-000000-bench-lenet-ffff on 3 nodes: "
                    "predicted 780 img/s by speed against 750 equal (+4%)"]
    # Not auto: equal says nothing; speed takes the newest bench's rates whatever it chose.
    assert speeds.planned(BatchBy.EQUAL, root, "lenet", None, said.append) is None
    assert speeds.planned(BatchBy.SPEED, root, "lenet", None, said.append).bench == "20261206-000000-bench-lenet-ffff"
    assert len(said) == 1
    # Through the CLI: the line, then the run's own first error (no ranks).
    r = edgetrain("run", "lenet", "--batch-by", "auto", "--np", "0", "--runs-dir", str(root))
    assert "--batch-by auto: equal, chosen by bench 20261206-000000-bench-lenet-ffff on 3 nodes" in r.stdout, r.stdout
    assert_one_line_error(r, "--np 0", code=2)


def test_auto_takes_equal_batches_where_the_run_cannot_split_them_unevenly_and_speed_is_refused():
    weights = programs.resolve("lenet", [], JobOptions(sync_every=2, sync_mode=SyncMode.WEIGHTS))
    chosen = speeds.NodeSpeeds({"node1": 500.0, "node2": 250.0}, bench="b", chosen=True)
    said: list[str] = []
    assert configs.resolve(weights, np=2, speeds=chosen, log=said.append).speeds is None
    assert said == ["--batch-by auto: equal after all, as --sync-mode weights averages models each rank trained at its own rate"]
    with pytest.raises(UsageError, match="--sync-mode weights averages models"):
        configs.resolve(weights, np=2, speeds=replace(chosen, chosen=False), log=said.append)
    grads = programs.resolve("lenet", [], JobOptions(sync_every=2))
    assert configs.resolve(grads, np=2, speeds=chosen, log=said.append).speeds == chosen and len(said) == 1
