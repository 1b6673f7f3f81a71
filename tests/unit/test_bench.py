"""`edgetrain bench`: its bad inputs, its prediction, its advice and its plot. (It trains on this
machine in tests/mpi/test_bench.py, and measures for real on the testbed in tests/cluster/test_bench.py.)"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any
from dataclasses import replace

import pytest

from edgetrain.controller import speeds
from edgetrain.controller.bench import model, record, runner
from edgetrain.shared import jobs, runs
from edgetrain.shared.batches import BatchBy
from edgetrain.controller.program import JobOptions
from edgetrain.shared.errors import UsageError
from edgetrain.shared.sync import Sync, SyncMode
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
    ar = model.Allreduce(nodes=2, bytes=6_520_360, seconds=0.080, cpu_seconds=0.05, latency_seconds=0.010, run="r",
                         cycle_seconds=0.040)
    # One node: 64 images at 250 img/s, 256 ms a step; the allreduce adds 80 ms and half a 40 ms cycle
    # when nothing hides it, only the wait when the step hides it all.
    e = model.predict(64 / 250, ar)
    assert (e.low, e.high) == pytest.approx((0.256 / 0.356, 0.256 / 0.276))
    # Without a model (a script), the estimate hides half of the allreduce.
    assert e.expected == pytest.approx(0.256 / (0.256 + 0.100 - 0.040))
    # Accumulating two batches per allreduce halves what it adds to a step.
    assert model.predict(64 / 250, ar, Sync(2)).low == pytest.approx(0.256 / 0.306)
    # Syncing weights every 2 steps: the same share, none of it hidden behind a step (the models are
    # averaged between steps), so the estimate is the band's bottom and its top pays no hidden part.
    weights = model.predict(64 / 250, ar, Sync(2, "weights"))
    assert weights.expected == weights.low == pytest.approx(0.512 / (0.512 + 0.100))
    assert weights.high == pytest.approx(0.512 / (0.512 + 0.100))
    # A step cannot hide an allreduce longer than itself: the excess stays exposed.
    slow = model.Allreduce(nodes=2, bytes=6_520_360, seconds=0.400, cpu_seconds=0.05, latency_seconds=0.010, run="r",
                           cycle_seconds=0.040)
    assert model.predict(64 / 250, slow).high == pytest.approx(0.256 / (0.256 + 0.144 + 0.020))


def test_a_node_whose_training_fills_its_cpu_pays_for_communicating_even_when_the_allreduce_is_hidden():
    # 50 ms of CPU per allreduce, and 20 ms a second between allreduces (Horovod's cycle).
    ar = model.Allreduce(nodes=2, bytes=690_000, seconds=0.020, cpu_seconds=0.050, latency_seconds=0.001, run="r",
                         cycle_seconds=0.010, idle_cpu_per_second=0.020)
    step = 0.500
    assert ar.cpu_per_update(step) == pytest.approx(0.050 + 0.010)
    free = model.predict(step, ar)
    # An emulated Pi's training keeps 0.2 of a core busy: 60 ms of CPU there is 300 ms of its training.
    quota = model.predict(step, ar, cores=0.2)
    assert quota.low == pytest.approx(step / (step + 0.025 + 0.300))
    assert quota.expected == pytest.approx(step / (step + 0.025 - 0.010 + 0.300))
    # The band's top is the communication on CPU the training leaves idle: unchanged.
    assert quota.high == free.high == pytest.approx(step / (step + 0.005))
    # A Pi's training on four cores pays a twentieth of that; unknown cores, nothing.
    four = model.predict(step, ar, cores=4)
    assert four.expected == pytest.approx(step / (step + 0.015 + 0.015))
    assert quota.expected < four.expected < free.expected == pytest.approx(step / (step + 0.015))


def test_lenets_backprop_produces_its_dense_kernel_first_and_leaves_the_convolutions_to_hide_it():
    from edgetrain.controller import overlap

    lenet = jobs.get("lenet")
    assert lenet.gradient_bytes({}) == 4 * 1_630_090
    gradients = overlap.schedule(lenet.layers({}))
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
    ar = model.Allreduce(4, 4 * 1_630_090, 0.200, 0.05, 0.001, "r", "gloo", cycle)
    e = model.predict(step, ar, gradients=gradients)
    assert e.low < e.expected < e.high
    assert e.expected == pytest.approx(step / (step + long))


@pytest.mark.parametrize(("job", "options"), [("lenet", {}), ("fashion", {"depth": 2, "width": 16}), ("fashion", {"depth": 1, "width": 4})])
def test_a_jobs_spec_declares_the_layers_its_keras_model_has(job, options):
    """The controller knows a model by its spec (it imports no TensorFlow); the rank builds it. Each
    trainable layer, in Keras' order: its forward multiply-adds (a kernel's size at each output
    position) and its trainable parameters."""
    import math
    built = jobs.get(job).load().model(options)
    keras = [jobs.Layer(math.prod(int(d) for d in layer.output.shape[1:-1]) * int(layer.kernel.shape.num_elements())
                        if hasattr(layer, "kernel") else 0, sum(int(w.shape.num_elements()) for w in layer.trainable_weights))
             for layer in built.layers if layer.trainable_weights]
    assert list(jobs.get(job).layers(options)) == keras


def _run_with(path, records: list[dict]) -> runs.Run:
    run = runs.Run(path)
    run.path.mkdir()
    run.metrics_file.write_text("".join(json.dumps(r) + "\n" for r in records))
    return run


def test_time_to_the_target_is_read_one_way_for_runs_show_and_bench(tmp_path):
    # The ranks were told 0.97 (their mark); bench times a script's run to its own 0.98.
    evals = [{"kind": "eval", "epoch": 1, "step": 10 * k, "images": 640 * k, "seconds": 40.0 * k, "val_accuracy": acc,
              "target_accuracy": 0.97, **({"reached": True} if acc >= 0.97 else {})} for k, acc in ((1, 0.95), (2, 0.975), (3, 0.985))]
    run = _run_with(tmp_path / "r", evals)
    assert runs.first_reaching(run)["step"] == 20
    assert "reached 97% val accuracy at 80" in runs.time_to_target(run)
    assert runs.first_reaching(run, 0.98)["step"] == 30
    assert runs.first_reaching(run, 0.99) is None


def test_the_time_to_a_target_from_the_command_counts_the_last_attempts_launch_in(tmp_path):
    from edgetrain.shared import record
    run = runs.create(tmp_path / "runs", "lenet")
    attempts = [record.Attempt(started=record.now(), command=["edgetrain"], np=2, mpirun=["mpirun"], first_step_s=s) for s in (90.0, 35.5)]
    run.write(None, job="lenet", status=record.Status.STARTING, attempts=attempts)
    run.metrics_file.write_text("".join(json.dumps({"kind": "eval", "epoch": k, "step": 10 * k, "seconds": 50.0 * k, "images": 640 * k,
                                                    "val_accuracy": acc}) + "\n" for k, acc in ((1, 0.95), (2, 0.98))))
    assert runs.to_target(run, 0.97) == runs.ToTarget(100.0, 1280, 135.5)
    assert runs.to_target(run, 0.99) == runs.ToTarget(None, None, None)


def test_an_accuracy_a_rounding_below_the_target_reaches_it_and_one_example_below_does_not(tmp_path):
    # 5,940 of 6,000 is 99.0%; averaged over three ranks' 2,000 each it comes out a rounding below.
    averaged = sum(c / 2000 for c in (1981, 1979, 1980)) / 3
    assert averaged < 0.99 and runs.reaches(averaged, 0.99)
    assert runs.reaches(0.99, 0.99) and not runs.reaches(5939 / 6000, 0.99)
    evals = [{"kind": "eval", "epoch": 1, "step": 10 * k, "seconds": 40.0 * k, "val_accuracy": acc} for k, acc in ((1, 5939 / 6000), (2, averaged))]
    assert runs.first_reaching(_run_with(tmp_path / "r", evals), 0.99)["step"] == 20


def test_the_cores_a_runs_training_keeps_busy_come_from_its_last_evaluation(tmp_path):
    # Two ranks, one a node: 30 CPU-s in 60 s of training steps is a quarter of a core on each.
    evals = [{"kind": "eval", "epoch": 1, "step": 10 * k, "images": 640 * k, "seconds": 40.0 * k, "train_seconds": 30.0 * k,
              "eval_seconds": 5.0, "val_accuracy": 0.9, "ranks": 2, "train_cpu_seconds": 15.0 * k} for k in (1, 2)]
    assert runner.busy_cores_of(_run_with(tmp_path / "two", evals)) == pytest.approx(0.25)
    # A run stopped at its first evaluation has it too; a run without the CPU clock has none.
    assert runner.busy_cores_of(_run_with(tmp_path / "one", evals[:1])) == pytest.approx(0.25)
    unclocked = [{k: v for k, v in e.items() if k != "train_cpu_seconds"} for e in evals]
    assert runner.busy_cores_of(_run_with(tmp_path / "none", unclocked)) is None


def test_steady_rate_leaves_out_warm_up_and_evaluations(tmp_path):
    # A run stopped at its target inside epoch 1: that epoch's 200 img/s carries TensorFlow's tracing.
    evals = [{"kind": "eval", "epoch": 1, "step": 100 * k, "images": 6400 * k, "seconds": 40.0 * k + 5.0,
              "eval_seconds": 5.0, "val_accuracy": 0.9 + k / 100} for k in (1, 2, 3)]
    run = _run_with(tmp_path / "stopped", [*evals, {"epoch": 1, "images_per_sec": 200.0}])
    # Between the first and last evaluation: 12,800 images in 80 s, less the two later evaluations' 10 s.
    assert runner.steady_rate(run) == pytest.approx(12_800 / 70)
    one_eval = _run_with(tmp_path / "one-eval", [evals[0], {"epoch": 1, "images_per_sec": 200.0}])
    assert runner.steady_rate(one_eval) == 200.0


def test_steady_rate_counts_training_steps_only_when_the_records_say(tmp_path):
    # Two epochs: 30 s of training each, 5 s of checkpoint and callbacks between them that the
    # evaluations' clock counts and their train_seconds does not.
    evals = [{"kind": "eval", "epoch": 1, "step": 120, "images": 7680, "seconds": 40.0, "eval_seconds": 6.0,
              "train_seconds": 32.0, "val_accuracy": 0.95},
             {"kind": "eval", "epoch": 2, "step": 120, "images": 15360, "seconds": 81.0, "eval_seconds": 6.0,
              "train_seconds": 62.0, "val_accuracy": 0.97}]
    run = _run_with(tmp_path / "two-epochs", [*evals, {"epoch": 2, "images_per_sec": 256.0}])
    assert runner.steady_rate(run) == pytest.approx(7680 / 30)


def test_images_per_cpu_second_are_read_between_the_first_and_last_evaluation(tmp_path):
    evals = [{"kind": "eval", "epoch": 1, "step": 100 * k, "images": 6400 * k, "seconds": 40.0 * k, "eval_seconds": 5.0,
              "train_cpu_seconds": 70.0 * k, "val_accuracy": 0.9 + k / 100} for k in (1, 2, 3)]
    run = _run_with(tmp_path / "cpu", [*evals, {"epoch": 1, "images_per_sec": 200.0}])
    assert runner.cpu_rate(run) == pytest.approx(12_800 / 140)
    # Records without the CPU clock (a torch or tf-multiworker script, an older run): no figure, not a guess.
    for e in evals:
        del e["train_cpu_seconds"]
    assert runner.cpu_rate(_run_with(tmp_path / "none", evals)) is None


def _bench(target: str, runs_dir: Path, options: JobOptions | None = None, **bench: Any) -> runner.Bench:
    """A bench as `edgetrain bench TARGET` makes one, on this machine."""
    options = options or JobOptions()
    return runner.Bench(runner.configured(target, [], options, runs_dir=runs_dir), options, **bench)


def _body(rates: dict[int, float]) -> dict:
    one = rates[1]
    return {"points": [{"nodes": n, "images_per_sec": r, "efficiency": r / (n * one), "trials": []} for n, r in rates.items()]}


def _advice(body: dict, n_hosts: int) -> str | None:
    """What `edgetrain run` on ``n_hosts`` nodes says of a bench.json holding ``body``."""
    return record.advice(record.BenchRecord.from_json(body), n_hosts)


@pytest.mark.parametrize(("reference", "one_at_two"), [(runner.Reference.ALONE, 100.0), (runner.Reference.CONCURRENT, 85.0)])
def test_e_n_divides_by_one_node_alone_or_by_the_one_node_runs_made_beside_each_other(tmp_path, reference, one_at_two):
    b = _bench("lenet", runs_dir=tmp_path / "runs", reference=reference)
    b.nodes = [1, 2]

    def trial(n: int, ips: float, beside: int = 0) -> record.Trial:
        return record.Trial(n, f"run-{n}-{ips}", ips, None, None, "completed", beside=beside)

    b.trials = [trial(1, 100.0), trial(2, 180.0), trial(1, 80.0, beside=1), trial(1, 90.0, beside=1)]
    one, two = b.points()
    # The concurrent one-node runs are the reference at N = 2 only, and never a point of their own.
    assert [t.run for t in one.trials] == ["run-1-100.0"] and one.reference == 100.0 and one.efficiency == pytest.approx(1.0)
    assert two.reference == one_at_two and two.efficiency == pytest.approx(180.0 / (2 * one_at_two))


def test_advice_warns_only_when_the_extra_nodes_do_not_pay():
    assert _advice(_body({1: 231, 2: 165, 3: 160}), 2) is not None
    warning = _advice(_body({1: 231, 2: 165, 3: 160}), 3)
    assert "160 img/s" in warning and "231 img/s on 1" in warning
    assert _advice(_body({1: 250, 2: 450, 3: 640}), 3) is None
    assert _advice(_body({1: 250, 2: 450}), 3) is None  # never measured: nothing to say


def test_each_try_has_its_own_seed_the_same_at_every_n(tmp_path):
    b = _bench("lenet", runs_dir=tmp_path / "runs")

    def seed(n: int, attempt: int) -> str:
        args = list(b.program_for(n, attempt).args)
        return args[args.index("--seed") + 1]

    assert [seed(1, k) for k in (1, 2, 3)] == ["42", "43", "44"]
    assert seed(1, 2) == seed(b.nodes[-1], 2)
    b = _bench("lenet", options=JobOptions(seed=7), runs_dir=tmp_path / "runs")
    assert [seed(1, k) for k in (1, 2)] == ["7", "8"]


def test_each_try_records_what_it_trained_on_the_held_out_split_included(tmp_path):
    b = _bench("lenet", runs_dir=tmp_path / "runs", options=JobOptions(holdout=6000, seed=50))
    trained = b.program_for(3, 2, Sync(2, SyncMode.GRADS)).trained_with
    assert {k: trained[k] for k in ("seed", "holdout", "holdout_split", "sync_every", "sync_mode", "batch_size", "epochs",
                                    "lr_scaling")} == {
        "seed": 51, "holdout": 6000, "holdout_split": 2, "sync_every": 2, "sync_mode": "grads", "batch_size": 64,
        "epochs": 1, "lr_scaling": 1.0}
    assert json.loads(json.dumps(trained)) == trained  # as bench.json keeps it, with each try
    split0 = _bench("lenet", runs_dir=tmp_path / "runs", options=JobOptions(holdout=6000, holdout_split=0))
    assert split0.program_for(1).trained_with["holdout_split"] == 0


def test_the_cli_takes_the_first_tries_seed(tmp_path):
    # Parsed before anything runs: the error is the repeat's, not an unknown --seed.
    assert_one_line_error(edgetrain("bench", "lenet", "--seed", "7", "--repeat", "0", "--runs-dir", str(tmp_path)),
                          "--repeat 0 must be at least 1", code=2)


def test_jobs_are_evaluated_four_times_an_epoch_between_executions_and_never_just_before_its_end(tmp_path):
    # LeNet's epochs at 1-4 nodes of batch 64, and one shorter than four executions.
    for steps in (937, 468, 312, 234, 20):
        every = model.evaluation_interval(steps, 8)
        within = [k * every for k in range(1, steps // every + 1) if k * every < steps]
        # Rounded up: the last lands at most three executions closer to the end than a quarter.
        assert every % 8 == 0 and len(within) <= 3 and steps - within[-1] >= steps / 4 - 3 * 8, (steps, every)
    assert [model.evaluation_interval(s, 8) for s in (937, 312)] == [240, 80]  # not 232 (928, 9 steps before the end) or 72 (288)

    b = _bench("lenet", runs_dir=tmp_path / "runs")
    args = list(b.program_for(1).args)
    assert args[args.index("--eval-every") + 1] == "240"
    # With --holdout the epoch is what is left of the training set: 54,000 examples, 843 steps.
    b = _bench("lenet", runs_dir=tmp_path / "runs", options=JobOptions(holdout=6000))
    args = list(b.program_for(1).args)
    assert args[args.index("--eval-every") + 1] == str(model.evaluation_interval(843, 8)) != "240"


def test_an_epoch_cut_short_by_max_steps_is_evaluated_four_times_at_every_n(tmp_path):
    # fashion, batch 32: epochs of 1875 / 937 / 625 steps at 1 / 2 / 3 nodes, all cut to 200; by the
    # whole epoch only three nodes would have evaluated before the end (at 160), and E(3) would have
    # set a steady rate against warm-up-laden ones.
    b = _bench("fashion", runs_dir=tmp_path / "runs", options=JobOptions(max_steps=200))
    for n in (1, 2, 3):
        args = list(b.program_for(n).args)
        every = int(args[args.index("--eval-every") + 1])
        assert every == model.evaluation_interval(200, JobOptions().steps_per_execution) and 200 // every >= 3, (n, every)


def _candidate(k: int, mode: str, predicted: float, ips: float | None = None, seconds: float | None = None) -> model.SyncCandidate:
    return model.SyncCandidate(k, mode, 3, predicted, (predicted - 0.1, predicted + 0.05), ips, seconds)


def test_bench_measures_each_modes_best_predicted_k_and_chooses_by_time_to_target_then_by_img_s():
    predicted = [_candidate(1, "grads", 0.70), _candidate(2, "grads", 0.84), _candidate(4, "grads", 0.88),
                 _candidate(8, "grads", 0.88), _candidate(2, "weights", 0.80), _candidate(4, "weights", 0.86)]
    # The model predicts throughput, not how many images a mode needs: each mode's best is measured
    # (a tie goes to fewer syncs' K, the smaller).
    assert [(c.sync_every, c.sync_mode) for c in model.best_per_mode(predicted)] == [(4, "grads"), (4, "weights")]
    fast_but_late = _candidate(4, "grads", 0.88, ips=900.0, seconds=120.0)
    slow_but_soon = _candidate(4, "weights", 0.86, ips=850.0, seconds=100.0)
    never = _candidate(1, "grads", 0.70, ips=700.0)
    assert model.choose([fast_but_late, slow_but_soon, never]) == (slow_but_soon, "time to the target")
    no_target = [replace(fast_but_late, seconds_to_target=None), replace(slow_but_soon, seconds_to_target=None)]
    assert model.choose(no_target) == (no_target[0], "img/s (no try reached the target)")
    assert model.choose([replace(never, images_per_sec=None)]) is None


def test_bench_predicts_every_candidate_k_in_both_modes_from_one_nodes_step_and_the_allreduce(tmp_path):
    b = _bench("lenet", runs_dir=tmp_path / "runs", sync_candidates=[1, 2, 4])
    b.nodes = [1, 2]
    b.trials = [record.Trial(1, "one", 250.0, None, None, "completed")]
    ar = b.allreduce[2] = model.Allreduce(nodes=2, bytes=6_520_360, seconds=0.080, cpu_seconds=0.05, latency_seconds=0.010,
                                          run="r", cycle_seconds=0.040)
    found = b.predict_syncs(2)
    # Weights averaged every step would send what the gradients' allreduce does, later: not a candidate.
    assert [(c.sync_every, c.sync_mode) for c in found] == [(1, "grads"), (2, "grads"), (2, "weights"), (4, "grads"), (4, "weights")]
    for c in found:
        assert c.predicted == pytest.approx(model.predict(64 / 250, ar, Sync(c.sync_every, c.sync_mode), b.gradients).expected)
    grads = [c.predicted for c in found if c.sync_mode == "grads"]
    assert grads == sorted(grads) and grads[0] < grads[-1]  # fewer syncs, more of each step trains


def test_a_bench_chooses_only_for_the_built_in_jobs_and_among_counts_of_one_or_more(tmp_path):
    script = tmp_path / "train.py"
    script.write_text("print('hi')\n")
    r = edgetrain("bench", str(script), "--gradient-mb", "1", "--sync-candidates", "1,2", "--runs-dir", str(tmp_path / "runs"))
    assert_one_line_error(r, "--sync-candidates is for the built-in jobs", code=2)
    r = edgetrain("bench", "lenet", "--sync-candidates", "0,2", "--runs-dir", str(tmp_path / "runs"))
    assert_one_line_error(r, "--sync-candidates 0 must be at least 1", code=2)
    r = edgetrain("bench", "lenet", "--sync-candidates", "two", "--runs-dir", str(tmp_path / "runs"))
    assert_one_line_error(r, "--sync-candidates 'two' is not a list of --sync-every values", code=2)


def _bench_with_choice(root, name: str, choice: dict | None, inventory: str | None = None) -> None:
    d = root / name
    d.mkdir(parents=True)
    body = {**_body({1: 250, 3: 600}), "inventory": inventory, "sync_choice": choice}
    (d / "bench.json").write_text(json.dumps(body))


def test_run_sync_every_auto_takes_the_newest_benchs_choice_for_the_program_and_inventory_and_says_so(tmp_path):
    root = tmp_path / "runs"
    chose = {"sync_every": 4, "sync_mode": "weights", "nodes": 3, "by": "time to the target", "images_per_sec": 700.0,
             "seconds_to_target": 90.0}
    _bench_with_choice(root, "20261201-000000-bench-lenet-aaaa", {**chose, "sync_every": 2, "sync_mode": "grads"})
    _bench_with_choice(root, "20261202-000000-bench-lenet-bbbb", chose)
    _bench_with_choice(root, "20261203-000000-bench-lenet-cccc", None)  # newer, but it chose nothing
    _bench_with_choice(root, "20261204-000000-bench-lenet-dddd", {**chose, "sync_mode": "sideways"})  # damaged: passed over
    _bench_with_choice(root, "20261205-000000-bench-lenet-eeee", {**chose, "sync_every": 8}, inventory="/elsewhere")
    said: list[str] = []
    options = record.chosen_sync(JobOptions(sync_every=None), root, "lenet", None, 3, said.append)
    assert (options.sync_every, options.sync_mode) == (4, SyncMode.WEIGHTS)
    assert said == ["--sync-every auto: 4 --sync-mode weights, chosen by bench 20261202-000000-bench-lenet-bbbb on 3 nodes "
                    "by time to the target"]
    assert record.chosen_sync(JobOptions(sync_every=2), root, "lenet", None, 3, said.append).sync_every == 2  # not auto: as given
    with pytest.raises(UsageError, match="no bench of fashion on this machine in .* chose one"):
        record.chosen_sync(JobOptions(sync_every=None), root, "fashion", None, 3, said.append)
    # Through the CLI: the line, then the run's own first error (no ranks).
    r = edgetrain("run", "lenet", "--sync-every", "auto", "--np", "0", "--runs-dir", str(root))
    assert "--sync-every auto: 4 --sync-mode weights, chosen by bench 20261202-000000-bench-lenet-bbbb" in r.stdout, r.stdout
    assert_one_line_error(r, "--np 0", code=2)
    r = edgetrain("run", "fashion", "--sync-every", "auto", "--runs-dir", str(root))
    assert_one_line_error(r, "--sync-every auto takes the newest bench's choice, and no bench of fashion", code=2)


def test_advice_counts_the_best_k_the_bench_measured_and_warns_when_even_it_does_not_pay():
    body = _body({1: 231, 2: 165, 3: 160})
    assert _advice(body, 3) is not None
    paid = {**body, "sync_choice": {"sync_every": 4, "sync_mode": "grads", "nodes": 3, "by": "img/s", "images_per_sec": 560.0}}
    assert _advice(paid, 3) is None
    unpaid = {**body, "sync_choice": {**paid["sync_choice"], "images_per_sec": 200.0}}
    warning = _advice(unpaid, 3)
    assert "200 img/s" in warning and "with --sync-every 4 grads" in warning and "231 img/s on 1" in warning


def test_candidates_are_tried_beside_the_n_loops_try_at_every_n_and_the_choice_made_at_the_largest(tmp_path, monkeypatch):
    """(s)'s flow through the whole bench, with each try's training and the allreduce probe stood in
    for (a cluster is the testbed's): which settings it runs, in what order, and what bench.json keeps."""
    b = _bench("lenet", runs_dir=tmp_path / "runs", sync_candidates=[1, 2, 4], repeat=2)
    b.nodes, b.hosts = [1, 2, 3], b.hosts * 3  # this machine thrice: the inventory's one host stands for three nodes
    ran = []
    # Weights reach the target sooner in these tries, though accumulating trains faster.
    figures = {(1, "grads"): (250.0, 100.0), (4, "grads"): (470.0, 75.0), (4, "weights"): (450.0, 60.0)}

    def train(n, attempt, on=None, beside=0, sync=None, timing=False):
        k, mode = (sync.sync_every, sync.sync_mode.value) if sync else (1, "grads")
        ran.append((n, attempt, k, mode))
        ips, seconds = figures[(k, mode)]
        return record.Trial(n, f"run-{len(ran)}", ips * (n if k == 1 else n - 1), seconds + attempt - n, None, "completed",
                           seconds_to_target_from_launch=seconds + 9, sync_every=k, sync_mode=mode, seed=attempt)

    monkeypatch.setattr(b, "train", train)
    monkeypatch.setattr(b, "measure_allreduce", lambda n, nbytes: model.Allreduce(
        nodes=n, bytes=nbytes, seconds=0.040 * n, cpu_seconds=0.05, latency_seconds=0.010, run="r", cycle_seconds=0.040))
    points = b.run()
    # Each mode's best-predicted K right after the N-loop's own try, at every N > 1, in every try.
    each = [(1, "grads"), (4, "grads"), (4, "weights")]
    assert ran == [(n, a, k, m) for a in (1, 2) for n in (1, 2, 3) for (k, m) in (each[:1] if n == 1 else each)] + [(1, 1, 1, "grads")] * 3
    assert b.choice == record.SyncChoice(4, SyncMode.WEIGHTS, 3, "time to the target", 900.0, 58.5)
    body = json.loads((b.dir / "bench.json").read_text())
    assert body["sync_choice"] == {"sync_every": 4, "sync_mode": "weights", "nodes": 3, "by": "time to the target",
                                   "images_per_sec": 900.0, "seconds_to_target": 58.5}
    kept = {(c["sync_every"], c["sync_mode"], c["nodes"]): c for c in body["sync_candidates"]}
    assert set(kept) == {(k, m, n) for n in (2, 3) for k, m in ((1, "grads"), (2, "grads"), (2, "weights"), (4, "grads"), (4, "weights"))}
    assert kept[(4, "grads", 2)]["runs"] == ["run-3", "run-10"] and kept[(4, "grads", 3)]["runs"] == ["run-6", "run-13"]
    assert kept[(2, "grads", 3)]["runs"] == [] and kept[(2, "grads", 3)]["images_per_sec"] is None
    # The N-loop's own setting (every step) stands as a candidate too, with its tries.
    assert kept[(1, "grads", 3)]["runs"] == ["run-5", "run-12"] and kept[(1, "grads", 3)]["seconds_to_target"] == 98.5
    # The points are the N-loop's alone: the candidates' tries are not medians of any N.
    assert [[t.run for t in p.trials] for p in points] == [["run-1", "run-8"], ["run-2", "run-9"], ["run-5", "run-12"]]
    assert record.latest(tmp_path / "runs", "lenet", None, lambda b: b.sync_choice).sync_choice == b.choice


@pytest.mark.parametrize(("reference", "nodes", "timed"), [
    (runner.Reference.ALONE, [1, 2], True),
    (runner.Reference.ALONE, [1], False),  # the N-loop's one-node runs timed the only node
    (runner.Reference.CONCURRENT, [1, 2], False),  # its one-node runs side by side timed each node
])
def test_each_node_is_timed_alone_in_turn_after_the_loop_and_run_by_speed_takes_those_rates(tmp_path, monkeypatch, reference, nodes, timed):
    """(t): a bench on more than one node times each node's own rate for --batch-by speed, one node
    after another, each a short one-node run of the job; bench.json keeps these apart from the tries."""
    b = _bench("lenet", runs_dir=tmp_path / "runs", options=JobOptions(epochs=4), repeat=1, reference=reference)
    b.nodes, b.hosts = nodes, [replace(b.hosts[0], name=name) for name in ("pi5", "pi4")]
    rates = {None: 250.0, "pi5": 500.0, "pi4": 240.0}
    ran = []

    def train(n, attempt, on=None, beside=0, sync=None, timing=False):
        ran.append((n, on, timing))
        return record.Trial(n, f"run-{len(ran)}", rates[on] * (n - beside), None, None, "completed", beside=beside, host=on)

    monkeypatch.setattr(b, "train", train)
    monkeypatch.setattr(b, "measure_allreduce", lambda n, nbytes: model.Allreduce(n, nbytes, 0.1, 0.05, 0.01, "r"))
    b.run()
    bench = record.read(b.dir / "bench.json")
    if not timed:
        assert bench.each_node is None and not any(timing for *_, timing in ran)
        assert bench.batch_choice is None  # one node, or no rate of each node alone (the fake's beside runs train at 0 img/s)
        return
    assert ran == [(1, None, False), (2, None, False), (1, "pi5", True), (1, "pi4", True)]
    assert [t.run for t in bench.trials] == ["run-1", "run-2"] and [t.run for t in bench.each_node] == ["run-3", "run-4"]
    assert dict(speeds.from_bench(bench, tmp_path / "runs").measured) == {"pi5": 500.0, "pi4": 240.0}
    # From those rates: 740 img/s by speed against 2 x 240 equal.
    assert bench.batch_choice == b.batch_choice == model.BatchChoice(BatchBy.SPEED, 2, 740.0, 480.0)
    # (t)'s run: one epoch of the job's first steps, not to the target; a script would run as given.
    args = list(b.program_for(1, timing=True).args)
    assert args[args.index("--epochs") + 1] == "1" and args[args.index("--max-steps") + 1] == str(runner.TIMING_STEPS)
    assert "--target-accuracy" not in args and "--target-accuracy" in b.program_for(1).args


def test_sync_every_auto_is_bounded_by_the_steps_of_an_epoch_and_says_so(tmp_path):
    """Issue 80, item 9: a bench.json's sync_every of 10**12 was taken as it was (0.10 accuracy against 0.57)."""
    root = tmp_path / "runs"
    _bench_with_choice(root, "20261202-000000-bench-lenet-bbbb", {"sync_every": 10**12, "sync_mode": "weights", "nodes": 3, "by": "img/s"})
    said: list[str] = []
    options = record.chosen_sync(JobOptions(sync_every=None), root, "lenet", None, 3, said.append)
    # 60,000 MNIST examples over 3 ranks of 64: 312 steps an epoch.
    assert options.sync_every == record.steps_per_epoch("lenet", JobOptions(), 3) == 312
    assert said == ["--sync-every auto: 312 --sync-mode weights, chosen by bench 20261202-000000-bench-lenet-bbbb on 3 nodes by img/s "
                    "(it chose 1000000000000, more than the 312 steps of an epoch on 3 rank(s): clipped)"]
    assert record.chosen_sync(JobOptions(sync_every=None, max_steps=20), root, "lenet", None, 3, said.append).sync_every == 20


def test_a_bench_without_its_one_node_reference_still_advises_and_never_fails_a_run():
    """Issue 80, item 5: "efficiency": null (written when the reference is missing) ended every run
    of the job in a TypeError after its containers had started."""
    body = _body({1: 231, 2: 165, 3: 160})
    for p in body["points"]:
        p.update(trials=[], efficiency=None, reference=None)
    warning = _advice(body, 3)  # what run reads passes bench.json's schema
    assert warning == ("on 3 nodes this job trained at 160 img/s, against 231 img/s on 1 (edgetrain bench): "
                       "the extra nodes do not pay")


KEPT = Path(__file__).resolve().parents[2] / "docs" / "benches"


def test_a_damaged_field_is_refused_when_bench_json_is_read_and_such_a_bench_passed_over(tmp_path):
    root = tmp_path / "runs"
    _bench_with_choice(root, "20261201-000000-bench-lenet-aaaa", None)
    damaged = root / "20261202-000000-bench-lenet-bbbb"
    _bench_with_choice(root, damaged.name, None)
    body = json.loads((damaged / "bench.json").read_text())
    body["trials"] = [{"nodes": 1, "run": "r", "status": "completed", "images_per_sec": 250.0},
                      {"nodes": 3, "run": "s", "status": "completed", "images_per_sec": "fast"}]
    (damaged / "bench.json").write_text(json.dumps(body))
    with pytest.raises(ValueError, match=r"^trials\[1\]\.images_per_sec is a string, not a number$"):
        record.read(damaged / "bench.json")
    assert record.latest(root, "lenet", None).name == "20261201-000000-bench-lenet-aaaa"
    # Fields the record does not know (a newer bench's, anyone's) travel along unread: not damage.
    body["trials"][1]["images_per_sec"] = 600.0
    body["allreduce"] = [{"nodes": 3, "bytes": 8, "seconds": 0.1, "cpu_seconds": 0.1, "latency_seconds": 0.01, "run": "a", "new": 1}]
    body["trials"][0]["new"] = body["points"][0]["new"] = body["new"] = {"any": "thing"}
    body["path"] = "/etc"  # where a record was read from is the reader's to say
    (damaged / "bench.json").write_text(json.dumps(body))
    found = record.latest(root, "lenet", None)
    assert found.trials[1].images_per_sec == 600.0 and found.path == damaged / "bench.json"
    assert record.BenchRecord.from_json(body).path is None


def test_a_kept_bench_reads_into_its_record_and_writes_back_the_same_json(tmp_path):
    fields = [f for f in dataclasses.fields(record.BenchRecord) if f.metadata.get("written", True)]
    optional = {f.name for f in fields if not f.metadata.get("written_if_none", True)}  # a bench.json may lack them

    def written(body: dict) -> list[str]:
        return [f.name for f in fields if f.name in body or f.name not in optional]

    kept = [p for p in sorted(KEPT.rglob("*-bench-*.json")) if list(body := json.loads(p.read_text())) == written(body)]
    assert len(kept) >= 8  # every bench kept since bench.json took its present form
    for path in kept:
        bench = record.read(path)
        assert isinstance(bench.sync_choice, record.SyncChoice | None) and all(isinstance(p, record.Point) for p in bench.points)
        assert all(isinstance(t, record.Trial) for t in bench.trials) and bench.trials, path
        record.write(tmp_path, bench)
        assert (tmp_path / "bench.json").read_text() == path.read_text(), path
    # Older ones (before --sync-every) read too, with today's defaults for what they lack.
    older = [p for p in sorted(KEPT.rglob("*-bench-*.json")) if p not in kept]
    assert older and all(record.read(p).points for p in older)


@pytest.mark.parametrize(("rates", "chosen"), [
    ([500.0, 250.0, 250.0], BatchBy.SPEED),  # a Pi 5 beside two Pi 4s: 1,000 img/s against 3 x 250
    ([250.0, 250.0, 250.0], BatchBy.EQUAL),  # nothing to gain
    ([119.9, 100.0], BatchBy.EQUAL),  # 219.9 against 200: just under BY_SPEED_PAYS
    ([120.0, 100.0], BatchBy.SPEED),  # 220 against 200: at it
])
def test_batches_by_speed_are_chosen_where_they_beat_the_slowest_node_pacing_every_step_by_enough(rates, chosen):
    c = model.choose_batches(rates)
    assert (c.batch_by, c.nodes, c.by_speed, c.equal) == (chosen, len(rates), pytest.approx(sum(rates)), len(rates) * min(rates))
    assert model.BY_SPEED_PAYS == 0.10


def test_a_batch_choice_is_written_read_back_and_a_bench_without_one_still_reads(tmp_path):
    choice = model.BatchChoice(BatchBy.SPEED, 3, 1000.0, 750.0)
    written = record.BenchRecord(program="lenet", points=(), batch_choice=choice)
    record.write(tmp_path, written)
    body = json.loads((tmp_path / "bench.json").read_text())
    assert body["batch_choice"] == {"batch_by": "speed", "nodes": 3, "by_speed": 1000.0, "equal": 750.0}
    assert record.read(tmp_path / "bench.json").batch_choice == choice
    del body["batch_choice"]  # as in a bench from before (t) chose
    assert record.BenchRecord.from_json(body).batch_choice is None
    record.write(tmp_path, record.BenchRecord.from_json(body))
    assert "batch_choice" not in json.loads((tmp_path / "bench.json").read_text())
    kept = {"batch_by": "speed", "nodes": 3, "by_speed": 1000.0, "equal": 750.0}
    for damaged, said in (({**kept, "batch_by": "auto"}, "batch_choice.batch_by is not speed or equal"),
                          ({**kept, "equal": 0}, "not both positive")):
        with pytest.raises(ValueError, match=said):
            record.BenchRecord.from_json({**body, "batch_choice": damaged})
