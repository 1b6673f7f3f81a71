"""`edgetrain bench` on this machine, training for real (one node, tiny tries), and the allreduce
probes between two local ranks. Its inputs, prediction and advice: tests/unit/test_bench.py."""

from __future__ import annotations

import json

import pytest

from edgetrain.controller import config as configs
from edgetrain.controller import launch, speeds
from edgetrain.controller.bench import record
from edgetrain.shared import runs
from edgetrain.controller.strategies import STRATEGIES
from edgetrain.controller.program import Program
from tests.conftest import ROOT, edgetrain, loopback_pair

pytestmark = pytest.mark.mpi


def test_a_bench_on_this_machine_trains_each_try_from_its_own_seed_and_keeps_its_results(tmp_path):
    # The embedded default: one node, so no allreduce to measure; two tiny tries.
    root = tmp_path / "runs"
    r = edgetrain("bench", "lenet", "--nodes", "1", "--repeat", "2", "--seed", "7", "--epochs", "1", "--max-steps", "16",
                  "--eval-every", "8", "--holdout", "1000", "--target-accuracy", "0.2", "--runs-dir", str(root), timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    tries = [run for run in runs.all_runs(root) if run.record().job == "lenet"]
    args = [run.record().program.args for run in tries]
    assert sorted(a[a.index("--seed") + 1] for a in args) == ["7", "8"]
    seeds = {run.id: int(a[a.index("--seed") + 1]) for run, a in zip(tries, args)}
    assert all(run.status() == "completed" for run in tries)
    [bench_dir] = [p for p in root.iterdir() if "-bench-" in p.name]
    result = json.loads((bench_dir / "bench.json").read_text())
    [point] = result["points"]
    assert point["nodes"] == 1 and point["images_per_sec"] > 0
    # Validated on the 1,000 held-out training examples (the test set would be cut to --max-steps x
    # the batch, 1,024); each try's test set scored once, after it.
    assert all(e["examples"] == 1000 for run in tries for e in run.evaluations())
    assert [t["test_accuracy"] for t in result["trials"]] == [run.test_score()["test_accuracy"] for run in tries]
    # Each trial names the seed its run trained from, so tries can be paired across N and pooled across benches.
    assert {t["run"]: t["seed"] for t in result["trials"]} == seeds
    # And every option it trained with: the held-out split (the default, told to the worker), the recipe.
    assert {(t["options"]["seed"], t["options"]["holdout"], t["options"]["holdout_split"], t["options"]["batch_size"],
             t["options"]["sync_every"]) for t in result["trials"]} == {(7, 1000, 2, 64, 1), (8, 1000, 2, 64, 1)}
    assert all(a[a.index("--holdout-split") + 1] == "2" for a in args)
    # Time to the target from the first step, and from the launch (the first step's own offset more).
    for t, run in zip(result["trials"], tries):
        assert t["seconds_to_target"] is not None, t
        assert t["seconds_to_target_from_launch"] == pytest.approx(run.record().attempts[-1].first_step_s + t["seconds_to_target"])
    # Its figure, and a try's own, drawn from these records (tests/unit/test_plots.py checks what they carry).
    assert "lenet (horovod)" in (bench_dir / "bench.svg").read_text()
    r = edgetrain("runs", "show", tries[0].id, "--plot", "--runs-dir", str(root))
    assert r.returncode == 0, r.stderr
    assert f"plot: {tries[0].path / 'plot.svg'}" in r.stdout
    assert f"{tries[0].id}: evaluations" in (tries[0].path / "plot.svg").read_text()


def test_a_run_that_fails_is_named_in_a_line_and_the_bench_goes_on(tmp_path):
    script = tmp_path / "project" / "train.py"
    script.parent.mkdir()
    script.write_text("raise ValueError('no data here')\n")
    root = tmp_path / "runs"
    r = edgetrain("bench", str(script), "--nodes", "1", "--repeat", "2", "--gradient-mb", "1", "--runs-dir", str(root), timeout=600)
    # Each try says which rank failed and how; every try ran, and each is in bench.json. With no
    # run completed, nothing was measured: one line on stderr and a failing exit.
    assert r.stdout.count("failed: rank 0 on ") == 2 and "ValueError: no data here" in r.stdout, r.stdout
    assert r.returncode == 1 and r.stderr.startswith("edgetrain: error: bench ") and "no run completed" in r.stderr, r.stderr[-3000:]
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr[-3000:]
    [bench_dir] = [p for p in root.iterdir() if "-bench-" in p.name]
    body = json.loads((bench_dir / "bench.json").read_text())
    assert [t["status"] for t in body["trials"]] == ["failed", "failed"]


def test_a_torch_script_is_benched_under_the_torch_strategy(tmp_path):
    # edgetrain.ddp's records: img/s from its epochs, the time to the target from its evaluations.
    root = tmp_path / "runs"
    r = edgetrain("bench", str(ROOT / "tests" / "scripts" / "torch" / "with_extras.py"), "--strategy", "torch", "--nodes", "1",
                  "--repeat", "1", "--gradient-mb", "0.1", "--target-accuracy", "0.01", "--runs-dir", str(root), "--", "--epochs", "3",
                  timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "with_extras (torch) on" in r.stdout
    [bench_dir] = [p for p in root.iterdir() if "-bench-" in p.name]
    result = json.loads((bench_dir / "bench.json").read_text())
    assert result["strategy"] == "torch"
    [point] = result["points"]
    [trial] = point["trials"]
    assert trial["status"] == "completed" and point["images_per_sec"] > 0
    assert trial["seed"] is None  # a script seeds itself
    run = runs.find(root, trial["run"])
    assert run.record().placement.strategy == "torch" and len(run.evaluations()) == 3
    first = run.evaluations()[0]
    assert trial["seconds_to_target"] == first["seconds"] and trial["images_to_target"] == first["images"] == 4 * 16


@pytest.mark.parametrize("fp16", [False, True])
def test_the_torch_probe_times_torchs_own_allreduce_between_two_ranks(tmp_path, fp16):
    args = ("--bytes", "400000", *(["--fp16"] if fp16 else []))
    config = configs.resolve(Program("allreduce", args, module=STRATEGIES["torch"].probe),
                             np=2, strategy="torch", runs_dir=tmp_path / "runs", log=lambda line: None)
    seen: list[dict] = []
    outcome = launch.execute(launch.prepare(config, configs.Attempt.first(config)), seen.append, lambda line: None)
    assert outcome.state is runs.Status.COMPLETED, outcome.why
    [e] = [e for e in seen if e["event"] == "allreduce"]
    assert (e["ranks"], e["bytes"], e["fp16"], e["transport"], e["cycle_seconds"]) == (2, 400_000, fp16, "gloo", 0.0)
    assert 0 < e["latency_seconds"] < 10 and 0 < e["seconds"] < 10 and e["cpu_seconds"] > 0
    # DDP has no background loop: between allreduces its process idles (well under a tenth of a core).
    assert 0 <= e["idle_cpu_per_second"] < 0.1


def test_horovods_probe_prices_its_cycle_between_allreduces(tmp_path):
    config = configs.resolve(Program("allreduce", ("--bytes", "400000"), module=STRATEGIES["horovod"].probe),
                             np=2, runs_dir=tmp_path / "runs", log=lambda line: None)
    seen: list[dict] = []
    outcome = launch.execute(launch.prepare(config, configs.Attempt.first(config)), seen.append, lambda line: None)
    assert outcome.state is runs.Status.COMPLETED, outcome.why
    [e] = [e for e in seen if e["event"] == "allreduce"]
    assert (e["ranks"], e["bytes"]) == (2, 400_000) and 0 < e["seconds"] < 10 and e["cpu_seconds"] > 0
    # Each turn of the cycle coordinates the two ranks with nothing to send: some CPU, at most the
    # background thread's one core (MPI, the transport on one host, polls while it waits).
    assert 0 < e["idle_cpu_per_second"] <= 1.05, e


def test_a_try_that_misses_the_target_says_so_in_its_line(tmp_path):
    r = edgetrain("bench", "lenet", "--nodes", "1", "--repeat", "1", "--epochs", "1", "--max-steps", "8", "--eval-every", "8",
                  "--target-accuracy", "0.999", "--runs-dir", str(tmp_path / "runs"), timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    [line] = [line for line in r.stdout.splitlines() if line.startswith("(c) 1 node, try 1: ")]
    assert ", 99.9% not reached" in line and "target at" not in line, line


def test_bench_chooses_how_often_to_sync_and_run_takes_its_choice(tmp_path):
    """bench --sync-candidates on two local nodes: every candidate predicted, each mode's best
    measured at N = 2 beside the N-loop, the choice kept; then run --sync-every auto takes it."""
    inv = loopback_pair(tmp_path / "two")  # a two-node bench on loopback
    root = tmp_path / "runs"
    job = ("--epochs", "1", "--max-steps", "24", "--eval-every", "8", "--holdout", "1000", "--target-accuracy", "0.3")
    r = edgetrain("bench", "lenet", "-i", str(inv), "--nodes", "1,2", "--repeat", "1", *job, "--sync-candidates", "1,2,4",
                  "--runs-dir", str(root), timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    [bench_dir] = [p for p in root.iterdir() if "-bench-" in p.name]
    body = json.loads((bench_dir / "bench.json").read_text())
    kept = {(c["sync_every"], c["sync_mode"]): c for c in body["sync_candidates"]}
    assert set(kept) == {(1, "grads"), (2, "grads"), (2, "weights"), (4, "grads"), (4, "weights")}
    assert all(0 < c["predicted"] <= 1 and c["nodes"] == 2 for c in kept.values())
    measured = {k for k, c in kept.items() if c["runs"]}
    # Each mode's best-predicted K (the most K: fewest syncs), and the N-loop's own every-step try at N = 2.
    assert measured == {(4, "grads"), (4, "weights"), (1, "grads")}, kept
    for (k, mode) in measured:
        for run_id in kept[(k, mode)]["runs"]:
            args = runs.find(root, run_id).record().program.args
            assert (k == 1 and "--sync-every" not in args) or (args[args.index("--sync-every") + 1] == str(k)), args
            assert (mode == "grads" and "--sync-mode" not in args) or args[args.index("--sync-mode") + 1] == mode, args
    choice = body["sync_choice"]
    assert (choice["sync_every"], choice["sync_mode"]) in measured and choice["nodes"] == 2
    # The points are the N-loop's: N = 2 has its one every-step try.
    assert [len(p["trials"]) for p in body["points"]] == [1, 1]
    assert f"(s) chose --sync-every {choice['sync_every']} --sync-mode {choice['sync_mode']} on 2 nodes" in r.stdout
    # (t): then each node timed alone, in turn: the rates --batch-by speed takes.
    assert [(t["nodes"], t["host"], t["status"]) for t in body["each_node"]] == [(1, "localhost", "completed"), (1, "loopback", "completed")]
    measured = speeds.from_bench(record.read(bench_dir / "bench.json"), root).measured
    assert measured == {t["host"]: t["images_per_sec"] for t in body["each_node"]} and all(v > 0 for v in measured.values())

    r = edgetrain("run", "lenet", "-i", str(inv), "--np", "2", "--epochs", "1", "--max-steps", "8", "--sync-every", "auto",
                  "--runs-dir", str(root), timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert (f"--sync-every auto: {choice['sync_every']} --sync-mode {choice['sync_mode']}, chosen by bench {bench_dir.name} "
            f"on 2 nodes by {choice['by']}") in r.stdout
    newest = max((run for run in runs.all_runs(root) if run.record().job == "lenet"), key=lambda run: run.id)
    args = newest.record().program.args
    assert args[args.index("--sync-every") + 1] == str(choice["sync_every"]) if choice["sync_every"] > 1 else "--sync-every" not in args
