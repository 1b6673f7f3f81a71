"""`edgetrain bench`: its bad inputs, its prediction, its advice and its plot. (It trains on this
machine in tests/mpi/test_bench.py, and measures for real on the testbed in tests/cluster/test_bench.py.)"""

from __future__ import annotations

import json

import pytest

from edgetrain.controller import bench
from edgetrain.shared import runs
from edgetrain.controller.program import JobOptions
from edgetrain.shared.sync import Sync
from tests.conftest import assert_one_line_error, edgetrain, snapshot


@pytest.mark.parametrize(("args", "message"), [
    (["--nodes", "0"], "--nodes 0 is not between 1 and the 1 hosts"),
    (["--nodes", "1-3"], "--nodes 3 is not between 1 and the 1 hosts"),
    (["--nodes", "two"], "--nodes 'two' is not a list of node counts"),
    (["--repeat", "0"], "--repeat 0 must be at least 1"),
    (["--gradient-mb", "-1"], "--gradient-mb -1.0 must be a positive number"),
    (["--gradient-mb", "nan"], "--gradient-mb nan must be a positive number"),
    (["--target-accuracy", "98.5"], "--target-accuracy 98.5 must be a fraction"),
    (["--epochs", "0"], "--epochs 0 must be at least 1"),
    (["--strategy", "torch"], "the built-in job lenet trains with horovod, not --strategy torch"),
    (["--strategy", "tf-ps"], "bench cannot time --strategy tf-ps's communication"),
    (["--strategy", "nccl"], "unknown --strategy 'nccl'"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, args, message):
    runs = tmp_path / "runs"
    runs.mkdir()
    before = snapshot(runs)
    assert_one_line_error(edgetrain("bench", "lenet", *args, "--runs-dir", str(runs)), message, code=2)
    assert snapshot(runs) == before


def test_a_script_needs_its_gradient_size(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    runs = tmp_path / "runs"
    assert_one_line_error(edgetrain("bench", str(script), "--runs-dir", str(runs)), "--gradient-mb", code=2)
    assert not runs.exists() or not any(runs.iterdir())


def test_prediction_is_a_band_from_nothing_hidden_to_the_whole_allreduce_hidden():
    ar = bench.Allreduce(nodes=2, bytes=6_520_360, seconds=0.080, cpu_seconds=0.05, latency_seconds=0.010, run="r",
                         cycle_seconds=0.040)
    # One node: 64 images at 250 img/s, 256 ms a step; the allreduce adds 80 ms and half a 40 ms cycle
    # when nothing hides it, only the wait when the step hides it all.
    e = bench.predict(64 / 250, ar)
    assert (e.low, e.high) == pytest.approx((0.256 / 0.356, 0.256 / 0.276))
    # Without a model (a script), the estimate hides half of the allreduce.
    assert e.expected == pytest.approx(0.256 / (0.256 + 0.100 - 0.040))
    # Accumulating two batches per allreduce halves what it adds to a step.
    assert bench.predict(64 / 250, ar, Sync(2)).low == pytest.approx(0.256 / 0.306)
    # Syncing weights every 2 steps: the same share, none of it hidden behind a step (the models are
    # averaged between steps), so the estimate is the band's bottom and its top pays no hidden part.
    weights = bench.predict(64 / 250, ar, Sync(2, "weights"))
    assert weights.expected == weights.low == pytest.approx(0.512 / (0.512 + 0.100))
    assert weights.high == pytest.approx(0.512 / (0.512 + 0.100))
    # A step cannot hide an allreduce longer than itself: the excess stays exposed.
    slow = bench.Allreduce(nodes=2, bytes=6_520_360, seconds=0.400, cpu_seconds=0.05, latency_seconds=0.010, run="r",
                           cycle_seconds=0.040)
    assert bench.predict(64 / 250, slow).high == pytest.approx(0.256 / (0.256 + 0.144 + 0.020))


def test_a_node_whose_training_fills_its_cpu_pays_for_communicating_even_when_the_allreduce_is_hidden():
    # 50 ms of CPU per allreduce, and 20 ms a second between allreduces (Horovod's cycle).
    ar = bench.Allreduce(nodes=2, bytes=690_000, seconds=0.020, cpu_seconds=0.050, latency_seconds=0.001, run="r",
                         cycle_seconds=0.010, idle_cpu_per_second=0.020)
    step = 0.500
    assert ar.cpu_per_update(step) == pytest.approx(0.050 + 0.010)
    free = bench.predict(step, ar)
    # An emulated Pi's training keeps 0.2 of a core busy: 60 ms of CPU there is 300 ms of its training.
    quota = bench.predict(step, ar, cores=0.2)
    assert quota.low == pytest.approx(step / (step + 0.025 + 0.300))
    assert quota.expected == pytest.approx(step / (step + 0.025 - 0.010 + 0.300))
    # The band's top is the communication on CPU the training leaves idle: unchanged.
    assert quota.high == free.high == pytest.approx(step / (step + 0.005))
    # A Pi's training on four cores pays a twentieth of that; unknown cores, nothing.
    four = bench.predict(step, ar, cores=4)
    assert four.expected == pytest.approx(step / (step + 0.015 + 0.015))
    assert quota.expected < four.expected < free.expected == pytest.approx(step / (step + 0.015))


def test_lenets_backprop_produces_its_dense_kernel_first_and_leaves_the_convolutions_to_hide_it():
    from edgetrain.controller import overlap, program as programs

    model = bench.model_of(programs.resolve("lenet", [], programs.JobOptions()))
    assert bench.gradient_bytes(model) == 4 * 1_630_090
    gradients = overlap.schedule(model)
    # Backprop order: Dense(10), Dense(512), then the two convolutions; multiply-adds per example
    # 5,120 / 1,605,632 / 3,612,672 / 225,792, the first convolution without its input's gradient.
    forward = 5_120 + 1_605_632 + 3_612_672 + 225_792
    total = forward + 2 * (5_120 + 1_605_632 + 3_612_672) + 225_792
    assert [g.ready for g in gradients] == pytest.approx(
        [(forward + 2 * 5_120) / total, (forward + 2 * (5_120 + 1_605_632)) / total,
         (total - 225_792) / total, 1.0])
    assert [g.share for g in gradients] == pytest.approx(
        [5_130 / 1_630_090, 1_606_144 / 1_630_090, 18_496 / 1_630_090, 320 / 1_630_090])
    step, cycle = 0.256, 0.010
    # The Dense kernel's allreduce starts half a cycle after its gradient, at 54% of the step: an
    # allreduce shorter than the 46% left hides whole but for the small convolution gradients
    # queued behind it; a longer one sticks out by its excess.
    dense = gradients[1]
    short = overlap.exposed(step, gradients, transfer=0.050, cycle=cycle)
    assert short == pytest.approx(cycle / 2 + 0.050 * gradients[3].share)
    long = overlap.exposed(step, gradients, transfer=0.200, cycle=cycle)
    queued = sum(g.share for g in gradients[1:])
    assert long == pytest.approx(dense.ready * step + cycle / 2 + 0.200 * queued - step)
    # The estimate lies inside the band, and follows the hidden share.
    ar = bench.Allreduce(4, 4 * 1_630_090, 0.200, 0.05, 0.001, "r", "gloo", cycle)
    e = bench.predict(step, ar, gradients=gradients)
    assert e.low < e.expected < e.high
    assert e.expected == pytest.approx(step / (step + long))


def _run_with(path, records: list[dict]) -> runs.Run:
    run = runs.Run(path)
    run.path.mkdir()
    run.metrics_file.write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


def test_the_cores_a_runs_training_keeps_busy_come_from_its_last_evaluation(tmp_path):
    # Two ranks, one a node: 30 CPU-s in 60 s of training steps is a quarter of a core on each.
    evals = [{"kind": "eval", "epoch": 1, "step": 10 * k, "images": 640 * k, "seconds": 40.0 * k, "train_seconds": 30.0 * k,
              "eval_seconds": 5.0, "val_accuracy": 0.9, "ranks": 2, "train_cpu_seconds": 15.0 * k} for k in (1, 2)]
    assert bench.busy_cores_of(_run_with(tmp_path / "two", evals)) == pytest.approx(0.25)
    # A run stopped at its first evaluation has it too; a run without the CPU clock has none.
    assert bench.busy_cores_of(_run_with(tmp_path / "one", evals[:1])) == pytest.approx(0.25)
    unclocked = [{k: v for k, v in e.items() if k != "train_cpu_seconds"} for e in evals]
    assert bench.busy_cores_of(_run_with(tmp_path / "none", unclocked)) is None


def test_steady_rate_leaves_out_warm_up_and_evaluations(tmp_path):
    # A run stopped at its target inside epoch 1: that epoch's 200 img/s carries TensorFlow's tracing.
    evals = [{"kind": "eval", "epoch": 1, "step": 100 * k, "images": 6400 * k, "seconds": 40.0 * k + 5.0,
              "eval_seconds": 5.0, "val_accuracy": 0.9 + k / 100} for k in (1, 2, 3)]
    run = _run_with(tmp_path / "stopped", [*evals, {"epoch": 1, "images_per_sec": 200.0}])
    # Between the first and last evaluation: 12,800 images in 80 s, less the two later evaluations' 10 s.
    assert bench.steady_rate(run) == pytest.approx(12_800 / 70)
    one_eval = _run_with(tmp_path / "one-eval", [evals[0], {"epoch": 1, "images_per_sec": 200.0}])
    assert bench.steady_rate(one_eval) == 200.0


def test_steady_rate_counts_training_steps_only_when_the_records_say(tmp_path):
    # Two epochs: 30 s of training each, 5 s of checkpoint and callbacks between them that the
    # evaluations' clock counts and their train_seconds does not.
    evals = [{"kind": "eval", "epoch": 1, "step": 120, "images": 7680, "seconds": 40.0, "eval_seconds": 6.0,
              "train_seconds": 32.0, "val_accuracy": 0.95},
             {"kind": "eval", "epoch": 2, "step": 120, "images": 15360, "seconds": 81.0, "eval_seconds": 6.0,
              "train_seconds": 62.0, "val_accuracy": 0.97}]
    run = _run_with(tmp_path / "two-epochs", [*evals, {"epoch": 2, "images_per_sec": 256.0}])
    assert bench.steady_rate(run) == pytest.approx(7680 / 30)


def test_images_per_cpu_second_are_read_between_the_first_and_last_evaluation(tmp_path):
    evals = [{"kind": "eval", "epoch": 1, "step": 100 * k, "images": 6400 * k, "seconds": 40.0 * k, "eval_seconds": 5.0,
              "train_cpu_seconds": 70.0 * k, "val_accuracy": 0.9 + k / 100} for k in (1, 2, 3)]
    run = _run_with(tmp_path / "cpu", [*evals, {"epoch": 1, "images_per_sec": 200.0}])
    assert bench.cpu_rate(run) == pytest.approx(12_800 / 140)
    # Records without the CPU clock (a torch or tf-multiworker script, an older run): no figure, not a guess.
    for e in evals:
        del e["train_cpu_seconds"]
    assert bench.cpu_rate(_run_with(tmp_path / "none", evals)) is None


def _body(rates: dict[int, float]) -> dict:
    one = rates[1]
    return {"points": [{"nodes": n, "images_per_sec": r, "efficiency": r / (n * one)} for n, r in rates.items()]}


@pytest.mark.parametrize(("reference", "one_at_two"), [(bench.Reference.ALONE, 100.0), (bench.Reference.CONCURRENT, 85.0)])
def test_e_n_divides_by_one_node_alone_or_by_the_one_node_runs_made_beside_each_other(tmp_path, reference, one_at_two):
    b = bench.Bench(bench.BenchRequest("lenet", runs_dir=tmp_path / "runs", reference=reference))
    b.nodes = [1, 2]

    def trial(n: int, ips: float, beside: int = 0) -> bench.Trial:
        return bench.Trial(n, f"run-{n}-{ips}", ips, None, None, "completed", beside=beside)

    b.trials = [trial(1, 100.0), trial(2, 180.0), trial(1, 80.0, beside=1), trial(1, 90.0, beside=1)]
    one, two = b.points()
    # The concurrent one-node runs are the reference at N = 2 only, and never a point of their own.
    assert [t.run for t in one.trials] == ["run-1-100.0"] and one.reference == 100.0 and one.efficiency == pytest.approx(1.0)
    assert two.reference == one_at_two and two.efficiency == pytest.approx(180.0 / (2 * one_at_two))


def test_advice_warns_only_when_the_extra_nodes_do_not_pay():
    assert bench.advice(_body({1: 231, 2: 165, 3: 160}), 2) is not None
    warning = bench.advice(_body({1: 231, 2: 165, 3: 160}), 3)
    assert "160 img/s" in warning and "231 img/s on 1" in warning
    assert bench.advice(_body({1: 250, 2: 450, 3: 640}), 3) is None
    assert bench.advice(_body({1: 250, 2: 450}), 3) is None  # never measured: nothing to say


def test_each_try_has_its_own_seed_the_same_at_every_n(tmp_path):
    b = bench.Bench(bench.BenchRequest("lenet", runs_dir=tmp_path / "runs"))

    def seed(n: int, attempt: int) -> str:
        args = list(b.program_for(n, attempt).args)
        return args[args.index("--seed") + 1]

    assert [seed(1, k) for k in (1, 2, 3)] == ["42", "43", "44"]
    assert seed(1, 2) == seed(b.nodes[-1], 2)
    b = bench.Bench(bench.BenchRequest("lenet", options=JobOptions(seed=7), runs_dir=tmp_path / "runs"))
    assert [seed(1, k) for k in (1, 2)] == ["7", "8"]


def test_the_cli_takes_the_first_tries_seed(tmp_path):
    # Parsed before anything runs: the error is the repeat's, not an unknown --seed.
    assert_one_line_error(edgetrain("bench", "lenet", "--seed", "7", "--repeat", "0", "--runs-dir", str(tmp_path)),
                          "--repeat 0 must be at least 1", code=2)


def test_jobs_are_evaluated_four_times_an_epoch_between_executions_and_never_just_before_its_end(tmp_path):
    # LeNet's epochs at 1-4 nodes of batch 64, and one shorter than four executions.
    for steps in (937, 468, 312, 234, 20):
        every = bench.evaluation_interval(steps, 8)
        within = [k * every for k in range(1, steps // every + 1) if k * every < steps]
        # Rounded up: the last lands at most three executions closer to the end than a quarter.
        assert every % 8 == 0 and len(within) <= 3 and steps - within[-1] >= steps / 4 - 3 * 8, (steps, every)
    assert [bench.evaluation_interval(s, 8) for s in (937, 312)] == [240, 80]  # not 232 (928, 9 steps before the end) or 72 (288)

    b = bench.Bench(bench.BenchRequest("lenet", runs_dir=tmp_path / "runs"))
    args = list(b.program_for(1).args)
    assert args[args.index("--eval-every") + 1] == "240"
    # With --holdout the epoch is what is left of the training set: 54,000 examples, 843 steps.
    b = bench.Bench(bench.BenchRequest("lenet", runs_dir=tmp_path / "runs", options=JobOptions(holdout=6000)))
    args = list(b.program_for(1).args)
    assert args[args.index("--eval-every") + 1] == str(bench.evaluation_interval(843, 8)) != "240"


def test_an_epoch_cut_short_by_max_steps_is_evaluated_four_times_at_every_n(tmp_path):
    # fashion, batch 32: epochs of 1875 / 937 / 625 steps at 1 / 2 / 3 nodes, all cut to 200; by the
    # whole epoch only three nodes would have evaluated before the end (at 160), and E(3) would have
    # set a steady rate against warm-up-laden ones.
    b = bench.Bench(bench.BenchRequest("fashion", runs_dir=tmp_path / "runs", options=JobOptions(max_steps=200)))
    for n in (1, 2, 3):
        args = list(b.program_for(n).args)
        every = int(args[args.index("--eval-every") + 1])
        assert every == bench.evaluation_interval(200, JobOptions().steps_per_execution) and 200 // every >= 3, (n, every)
