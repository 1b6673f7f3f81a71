"""`edgetrain bench` on the testbed's container cluster: a real command on a real inventory.

The functional test keeps every run tiny and asserts what bench records, not how fast anything is.
The `bench`-marked test is the benchmark itself (emulated Pi 4 nodes, the job to its target
accuracy, three tries per N): `pytest -m bench tests/cluster/test_bench.py`, with
EDGETRAIN_TESTBED_NODES=4 for N = 1..4, EDGETRAIN_TESTBED_LINK_MBIT for slower links,
EDGETRAIN_BENCH_JOB for another job (fashion) and EDGETRAIN_BENCH_ARGS for the options of the lab's
bench, lab/emulated_bench.py (default "--epochs 4"; "--epochs 1 --repeat 1" measures E(N) against the
prediction, no target; the one-node reference is N concurrent one-node runs unless they name a --reference).
"""

from __future__ import annotations

import json
import os
import shlex
import statistics
from pathlib import Path

import pytest

from edgetrain.controller.bench import model
from lab import headline
from tests.conftest import ROOT, edgetrain, lab_bench


JOB = os.environ.get("EDGETRAIN_BENCH_JOB", "lenet")
BENCH_ARGS = shlex.split(os.environ.get("EDGETRAIN_BENCH_ARGS", "--epochs 4"))


def _bench_dir(out: str) -> Path:
    line = next(line for line in out.splitlines() if line.startswith("results: "))
    return Path(line.split()[1]).parent


def test_bench_measures_allreduce_predicts_chooses_and_plots_and_run_takes_its_choice(cluster):
    r = lab_bench("lenet", "-i", cluster.inventory, "--nodes", "1,2", "--repeat", "1", "--epochs", "1",
                  "--max-steps", "8", "--target-accuracy", "0.2", "--reference", "concurrent", "--sync-candidates", "1,4",
                  env=cluster.env, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "(a) allreduce on 2 nodes (gloo)" in r.stdout
    # The prediction comes after one node's run and before the first two-node run.
    out = r.stdout
    assert out.index("(c) 1 node") < out.index("(d) predicted") < out.index("(c) 2 nodes"), out
    d = _bench_dir(out)
    body = json.loads((d / "bench.json").read_text())
    (ar,) = body["allreduce"]
    assert ar["nodes"] == 2 and ar["bytes"] == 4 * 1_630_090  # LeNet's trainable parameters, float32
    assert ar["transport"] == "gloo"  # the default on several CPU nodes
    # Not latency < seconds: on CPU nodes both wait for Horovod's 100 ms cycle, which can dominate.
    assert 0 < ar["latency_seconds"] < 10 and 0 < ar["seconds"] < 10 and ar["cpu_seconds"] > 0
    # Gloo's turns of Horovod's cycle between allreduces: some CPU, not a core's worth.
    assert 0 < ar["idle_cpu_per_second"] < 1
    points = {p["nodes"]: p for p in body["points"]}
    assert points[1]["efficiency"] == pytest.approx(1.0)
    # The prediction charged the communication's CPU to the cores one node's training kept busy.
    assert body["busy_cores"] > 0 and "the communication's CPU taken from the training's" in out
    assert 0 < points[2]["efficiency"] and 0 < points[2]["predicted_efficiency"] < 1
    for p in points.values():
        (trial,) = p["trials"]
        assert trial["status"] == "completed" and trial["images_per_sec"] > 0
        # Each try is an ordinary run, one rank per node.
        info = cluster.run_json(trial["run"])
        assert [h["ranks"] for h in info["placement"]["hosts"]] == [1] * p["nodes"]
    # E(2)'s one node: two one-node runs at once, one on each of the two nodes, their median.
    beside = [t for t in body["trials"] if t["beside"] == 1]
    assert sorted(h["host"] for t in beside for h in cluster.run_json(t["run"])["placement"]["hosts"]) == ["node1", "node2"]
    assert all(t["nodes"] == 1 and t["status"] == "completed" for t in beside)
    assert points[2]["reference"] == pytest.approx(statistics.median(t["images_per_sec"] for t in beside))
    assert points[2]["efficiency"] == pytest.approx(points[2]["images_per_sec"] / (2 * points[2]["reference"]))
    assert "(r) 2 one-node runs at once, try 1: node1 " in out
    # Its figure (what a figure carries: tests/unit/test_plots.py).
    assert f"plot: {d / 'bench.svg'}" in out and "lenet (horovod)" in (d / "bench.svg").read_text()
    _the_choice_is_measured_on_the_nodes_and_run_takes_it(cluster, d, body, out)
    assert not cluster.leftovers()


def _the_choice_is_measured_on_the_nodes_and_run_takes_it(cluster, d: Path, body: dict, out: str) -> None:
    """--sync-candidates 1,4 at N = 2 on the testbed: K = 4 in both modes, predicted from (a) and
    measured as ordinary two-node runs; then `run --sync-every auto` on the same inventory (the
    choice is looked up by it) takes the choice and says so. What else the choice rests on:
    tests/mpi/test_bench.py and tests/unit/test_sync.py."""
    kept = {(c["sync_every"], c["sync_mode"]): c for c in body["sync_candidates"]}
    assert set(kept) == {(1, "grads"), (4, "grads"), (4, "weights")}
    assert all(0 < c["predicted"] <= 1 and c["nodes"] == 2 for c in kept.values())
    # Four batches between allreduces hide more of them than one: the model says so before measuring.
    assert kept[(4, "grads")]["predicted"] > kept[(1, "grads")]["predicted"]
    for k, mode in ((4, "grads"), (4, "weights")):
        (run_id,) = kept[(k, mode)]["runs"]
        info = cluster.run_json(run_id)
        assert sorted(h["host"] for h in info["placement"]["hosts"]) == ["node1", "node2"]
        args = info["program"]["args"]
        assert args[args.index("--sync-every") + 1] == "4" and (mode == "grads") == ("--sync-mode" not in args), args
        assert info["status"] == "completed" and kept[(k, mode)]["images_per_sec"] > 0
    choice = body["sync_choice"]
    assert (choice["sync_every"], choice["sync_mode"]) in kept and choice["nodes"] == 2
    assert f"(s) chose --sync-every {choice['sync_every']} --sync-mode {choice['sync_mode']} on 2 nodes" in out

    r = edgetrain("run", "lenet", "-i", cluster.inventory, "--np", "2", "--epochs", "1", "--max-steps", "8",
                  "--sync-every", "auto", env=cluster.env, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert (f"--sync-every auto: {choice['sync_every']} --sync-mode {choice['sync_mode']}, chosen by bench {d.name} "
            f"on 2 nodes by {choice['by']}") in r.stdout


def test_bench_times_each_node_alone_and_run_by_speed_takes_those_rates(cluster, mixed, report):
    """On the mixed cluster (node1 an emulated Pi 5, node2 and node3 Pi 4s: conftest's ``mixed``),
    `edgetrain bench` times each node alone, one after another, and chooses batches by speed from
    those rates (the Pi 5 at twice a Pi 4's quota: +33% predicted, past BY_SPEED_PAYS); `run
    --batch-by auto` takes that choice and sizes the batches by the measured rates rather than the
    inventory's declared edgetrain_speed."""
    # An inventory of its own: the newest bench of lenet on it wins over edgetrain_speed, and
    # tests/cluster/test_mixed.py's runs by speed on mixed.yml take the declared speeds.
    inventory = cluster.docker_inventory("mixed-benched.yml", head_slots=1)
    short = ("--epochs", "1", "--max-steps", "32", "--steps-per-execution", "4")
    r = edgetrain("bench", "lenet", "-i", inventory, "--nodes", "3", "--repeat", "1", *short, env=cluster.env, timeout=1500)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    d = _bench_dir(r.stdout)
    body = json.loads((d / "bench.json").read_text())
    timed = body["each_node"]
    assert [t["host"] for t in timed] == ["node1", "node2", "node3"] and "(t) each node alone: node1 " in r.stdout
    for t in timed:
        placed = cluster.run_json(t["run"])["placement"]["hosts"]
        assert t["status"] == "completed" and [h["host"] for h in placed] == [t["host"]], placed
    rates = {t["host"]: t["images_per_sec"] for t in timed}
    assert rates["node1"] > max(rates["node2"], rates["node3"]), rates  # the Pi 5's quota is twice a Pi 4's
    report["bench (t) on pi5 + 2 x pi4 (pessimistic bracket), img/s alone"] = ", ".join(f"{h} {v:,.0f}" for h, v in rates.items())
    # (t)'s choice, from those rates: speed, as the model says of them.
    choice = body["batch_choice"]
    said = model.choose_batches(list(rates.values())).said()
    assert choice == {"batch_by": "speed", "nodes": 3, "by_speed": pytest.approx(sum(rates.values())),
                      "equal": 3 * min(rates.values())}, (choice, rates)
    assert f"(t) on 3 nodes, chose --batch-by speed: {said}" in r.stdout
    before = cluster.run_ids()
    r = edgetrain("run", "lenet", "--np", "3", "-i", inventory, "--batch-by", "auto", "--epochs", "1", "--max-steps", "4",
                  env=cluster.env, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    out = r.stdout
    chose = f"--batch-by auto: speed, chosen by bench {d.name} on 3 nodes: {said}"
    assert chose in out and out.index(chose) < out.index(f"--batch-by speed: from bench {d.name}: node1 "), out[-3000:]
    placement = cluster.run_json(cluster.new_run(before))["placement"]
    assert placement["speeds"] == [rates[h] for h in ("node1", "node2", "node3")] and sum(placement["batches"]) == 3 * 64
    # Each rank's batch is its node's share of the global batch (to the integers the split rounds to).
    total = sum(placement["speeds"])
    assert all(abs(b - 3 * 64 * v / total) < 2 for b, v in zip(placement["batches"], placement["speeds"], strict=True)), placement
    assert not cluster.leftovers()


def test_a_torch_script_is_benched_with_torchs_own_allreduce_across_the_nodes(cluster):
    script = ROOT / "tests" / "scripts" / "torch" / "with_extras.py"
    r = edgetrain("bench", str(script), "--strategy", "torch", "-i", cluster.inventory, "--nodes", "1,2", "--repeat", "1",
                  "--gradient-mb", "3.37", "--", "--epochs", "2", env=cluster.env, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "(a) allreduce on 2 nodes (gloo)" in r.stdout
    body = json.loads((_bench_dir(r.stdout) / "bench.json").read_text())
    (ar,) = body["allreduce"]
    assert body["strategy"] == "torch" and ar["bytes"] == 3_370_000 and ar["cycle_seconds"] == 0
    assert 0 < ar["latency_seconds"] < 10 and 0 < ar["seconds"] < 10 and ar["cpu_seconds"] > 0
    points = {p["nodes"]: p for p in body["points"]}
    assert points[2]["images_per_sec"] > 0 and 0 < points[2]["predicted_efficiency"] < 1
    info = cluster.run_json(points[2]["trials"][0]["run"])
    assert info["placement"]["strategy"] == "torch" and [h["ranks"] for h in info["placement"]["hosts"]] == [1, 1]
    assert not cluster.leftovers()


@pytest.mark.bench
def test_scaling_on_emulated_pi4_nodes(cluster, emulated, conditions, report):
    refusal = headline.tuning_refusal(BENCH_ARGS)  # docs/scaling.md's protocol: tuning never sees the reported split
    if refusal:
        pytest.fail(f"EDGETRAIN_BENCH_ARGS: {refusal}")
    # The emulated nodes share this machine: the lab's bench takes E(N)'s one node from N one-node runs
    # at once, unless the arguments say otherwise (a bench to accuracy, whose ratios are to one node's
    # time, may spare them with --reference alone).
    r = lab_bench(JOB, "-i", cluster.inventory, *BENCH_ARGS, env=cluster.env, timeout=4 * 3600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report[f"bench {JOB} {shlex.join(BENCH_ARGS)}, {conditions}"] = "\n" + r.stdout
    body = json.loads((_bench_dir(r.stdout) / "bench.json").read_text())
    assert all(p["images_per_sec"] for p in body["points"])
