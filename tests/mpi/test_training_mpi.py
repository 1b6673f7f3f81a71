"""Real multi-process training: MPICH's mpirun, Horovod, TensorFlow, on the real datasets."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from edgetrain.controller import launch
from edgetrain.shared import checkpoints, runs
from edgetrain.shared.learning_rate import anneal
from tests.conftest import ROOT, descendants, edgetrain, sigint_default


pytestmark = pytest.mark.mpi

DIGEST = re.compile(r"^final weights sha256 ([0-9a-f]{64})$", re.M)
RESUMED = re.compile(r"^resumed from .* \(epoch (\d+)\), weights sha256 ([0-9a-f]{64})$", re.M)


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """TMPDIR of the trained run."""
    return tmp_path_factory.mktemp("tmp")


@pytest.fixture(scope="module")
def trained(tmp_path_factory, scratch):
    """Two ranks, two short epochs of LeNet on MNIST through the CLI."""
    root = tmp_path_factory.mktemp("runs")
    result = edgetrain("run", "lenet", "--np", "2", "--epochs", "2", "--max-steps", "25", "--runs-dir", str(root),
                       env={"TMPDIR": str(scratch)})
    assert result.returncode == 0, result.stderr
    [run] = runs.all_runs(root)
    return root, run, result


def final_digests(run: runs.Run) -> dict[int, list[str]]:
    return {int(p.name.split(".")[1]): DIGEST.findall(p.read_text()) for p in run.logs()}


def test_loss_falls_and_progress_is_reported(trained):
    _, run, result = trained
    metrics = run.metrics()
    assert [m["epoch"] for m in metrics] == [1, 2]
    assert metrics[1]["loss"] < metrics[0]["loss"]
    assert metrics[1]["val_accuracy"] > 0.6
    assert all(m["images_per_sec"] > 0 and m["ranks"] == 2 for m in metrics)
    # The rate is scaled linearly by the ranks (--lr-scaling 1), and LeNet's schedule anneals it to
    # a tenth at the end of the run: here as it stood when the last execution of 8 steps began, at
    # step 24 of the second epoch's 25.
    assert metrics[1]["lr"] == pytest.approx(0.001 * 2 * anneal(1 + 24 / 25, 0.25, 2, 0.1))
    assert 0.001 * 2 * 0.1 < metrics[1]["lr"] < 0.001 * 2 * 0.102
    assert "epoch 2/2: loss" in result.stdout and f"run {run.id} completed" in result.stdout
    # rank 0 wrote TensorBoard's event files (`tensorboard --logdir runs/`), the other rank none
    assert list((run.path / "tensorboard").rglob("events.out.tfevents.*"))
    rec = run.record()
    assert rec.status == "completed" and rec.placement.np == 2
    assert rec.versions["mpich"] == "4.0.2"
    assert rec.versions["tensorflow"].startswith("2.15.") and rec.versions["horovod"] == "0.28.1"


def test_ranks_leave_no_temp_files(trained, scratch):
    # TensorFlow's autograph leaves a file per converted function when a rank skips atexit.
    assert sorted(p.name for p in scratch.iterdir()) == []


def test_weights_identical_on_every_rank(trained):
    _, run, _ = trained
    digests = final_digests(run)
    assert set(digests) == {0, 1}
    assert digests[0] and digests[0][0] == digests[1][0]


def test_only_rank_0_writes_checkpoints(trained):
    _, run, _ = trained
    assert sorted(p.name for p in run.checkpoints.iterdir()) == ["epoch-0001", "epoch-0002"]
    for ckpt in checkpoints.all_in(run.checkpoints):
        assert ckpt.manifest["rank"] == 0 and ckpt.job == "lenet"
        checkpoints.verify(ckpt)
    assert ckpt.manifest["metrics"] == run.metrics()[-1]


def test_collect_verifies_and_repeats_safely(trained, tmp_path):
    root, run, _ = trained
    first = edgetrain("collect", run.id, "--dest", str(tmp_path), "--runs-dir", str(root))
    assert first.returncode == 0, first.stderr
    copy = tmp_path / run.id
    assert (copy / "metrics.jsonl").read_text() == run.metrics_file.read_text()
    assert (copy / "rank.1.log").exists()
    again = edgetrain("collect", run.id, "--dest", str(tmp_path), "--runs-dir", str(root))
    assert again.returncode == 0 and " 0 files copied" in again.stdout.replace("\n", " ")
    damaged = copy / "checkpoints" / "epoch-0002" / "state.index"
    damaged.write_bytes(b"damaged")
    mend = edgetrain("collect", run.id, "--dest", str(tmp_path), "--runs-dir", str(root))
    assert mend.returncode == 0 and " 1 files copied" in mend.stdout.replace("\n", " ")
    checkpoints.verify(checkpoints.read(run.checkpoints / "epoch-0002"), base=copy / "checkpoints" / "epoch-0002")


def test_resume_continues_from_the_saved_epoch(trained):
    root, run, _ = trained
    before = final_digests(run)[0][-1]
    result = edgetrain("run", "lenet", "--np", "2", "--epochs", "3", "--max-steps", "25", "--resume", run.id, "--runs-dir", str(root))
    assert result.returncode == 0, result.stderr
    assert "resuming after epoch 2" in result.stdout
    [(epoch, restored)] = RESUMED.findall(run.log(0).read_text())
    assert int(epoch) == 2 and restored == before
    assert [m["epoch"] for m in run.metrics()] == [1, 2, 3]
    assert checkpoints.latest(run.checkpoints).epoch == 3
    attempts = run.record().attempts
    assert [a.resumed_from_epoch for a in attempts] == [None, 2]
    digests = final_digests(run)
    assert digests[0][-1] == digests[1][-1] != before


def test_a_resume_on_fewer_ranks_follows_them_and_its_checkpoint_says_so(trained):
    """A node lost: the run goes on with one rank instead of two, its rate, warmup and shards those
    of a fresh run on one rank (a smaller global batch, so a smaller linearly scaled rate)."""
    root, run, _ = trained
    done = checkpoints.latest(run.checkpoints).epoch
    result = edgetrain("run", "lenet", "--np", "1", "--epochs", str(done + 1), "--max-steps", "25", "--resume", run.id,
                       "--runs-dir", str(root))
    assert result.returncode == 0, result.stderr
    assert f"resuming on 1 ranks from epoch {done}, trained on 2" in " ".join(result.stdout.split())
    last = run.metrics()[-1]
    assert last["epoch"] == done + 1 and last["ranks"] == 1
    # Near LeNet's floor at the end of the run, of the rate scaled for one rank (as at step 24 of 25).
    assert last["lr"] == pytest.approx(0.001 * 1 * anneal(done + 24 / 25, 0.25, done + 1, 0.1))
    saved = json.loads((run.checkpoints / f"epoch-{done + 1:04d}" / checkpoints.MANIFEST).read_text())
    assert saved["metrics"]["ranks"] == 1
    assert [a.np for a in run.record().attempts][-2:] == [2, 1]


def test_fashion_job_trains(tmp_path):
    result = edgetrain("run", "fashion", "--np", "2", "--epochs", "1", "--max-steps", "8", "-o", "width=8",
                       "--runs-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    [run] = runs.all_runs(tmp_path)
    ckpt = checkpoints.latest(run.checkpoints)
    assert ckpt.job == "fashion" and ckpt.manifest["options"]["width"] == 8
    assert list(run.record().dataset) == ["fashion-mnist"]
    # BatchNorm statistics are averaged over ranks, so the whole model matches, not only the weights.
    digests = final_digests(run)
    assert digests[0] == digests[1] and len(digests[0]) == 1


def test_target_accuracy_stops_early(tmp_path):
    result = edgetrain("run", "lenet", "--np", "2", "--epochs", "5", "--max-steps", "20", "--target-accuracy", "0.5",
                       "--runs-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    [run] = runs.all_runs(tmp_path)
    metrics = run.metrics()
    assert len(metrics) < 5 and metrics[-1]["val_accuracy"] >= 0.5


def test_evaluations_within_an_epoch_time_the_target(tmp_path):
    result = edgetrain("run", "lenet", "--np", "2", "--epochs", "2", "--max-steps", "40", "--eval-every", "4",
                       "--eval-examples", "1000", "--target-accuracy", "0.75", "--runs-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    [run] = runs.all_runs(tmp_path)
    evals = run.evaluations()
    assert len(evals) >= 2, evals
    assert [e["step"] for e in evals] == list(range(4, 4 * len(evals) + 1, 4))
    seconds = [e["seconds"] for e in evals]
    assert 0 < seconds[0] and all(a < b for a, b in zip(seconds, seconds[1:]))
    for e in evals:
        assert e["epoch"] == 1 and e["images"] == e["step"] * 64 * 2 and e["examples"] == 1000 and e["ranks"] == 2
        assert 0 < e["eval_seconds"] < e["seconds"] and e["target_accuracy"] == 0.75
    # The training clock leaves every evaluation out (bench's img/s is read from it).
    for a, b in zip(evals, evals[1:]):
        assert 0 < b["train_seconds"] - a["train_seconds"] <= b["seconds"] - a["seconds"] - b["eval_seconds"] + 0.05
        # And the CPU clock of both ranks' processes (bench's img/CPU-s): it ran, and at most as fast as
        # this machine's cores allow over that wall time.
        cpu = b["train_cpu_seconds"] - a["train_cpu_seconds"]
        assert 0 < cpu <= (b["seconds"] - a["seconds"]) * (os.cpu_count() or 1) + 0.2, (a, b)
    *before, reached = evals
    assert reached["reached"] and reached["val_accuracy"] >= 0.75
    assert not any(e["reached"] or e["val_accuracy"] >= 0.75 for e in before)
    # It stopped within the first epoch, at that evaluation; the epoch's validation added no record.
    assert reached["step"] < 40 and [m["epoch"] for m in run.metrics()] == [1]
    assert run.test_score() is None  # validated on the test set itself: nothing is scored after
    assert f"target val_accuracy 0.75 reached at epoch 1 step {reached['step']}" in result.stdout
    shown = edgetrain("runs", "show", run.id, "--runs-dir", str(tmp_path), env={"COLUMNS": "300"})
    assert shown.returncode == 0, shown.stderr
    assert (f"reached 75% val accuracy at {reached['seconds']:.1f} s from the first step, {reached['images']:,} images, "
            f"epoch 1 step {reached['step']} ({len(evals)} evaluations took ") in shown.stdout


def test_a_held_out_validation_set_decides_the_stop_and_the_test_set_is_scored_once_after(tmp_path):
    result = edgetrain("run", "lenet", "--np", "2", "--epochs", "2", "--max-steps", "60", "--eval-every", "8", "--holdout", "2000",
                       "--target-accuracy", "0.75", "--runs-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    [run] = runs.all_runs(tmp_path)
    evals = run.evaluations()
    # Every evaluation scored the 2,000 held-out training examples, not the 10,000 test examples.
    assert evals and all(e["examples"] == 2000 for e in evals), evals
    reached = evals[-1]
    assert reached["reached"]
    test = run.test_score()
    assert test is not None and test["examples"] == 10_000 and 0.5 < test["test_accuracy"] <= 1.0, test
    assert (test["after_epoch"], test["step"]) == (reached["epoch"], reached["step"])
    assert sum('"kind": "test"' in line for line in run.metrics_file.read_text().splitlines()) == 1
    assert f", test accuracy {test['test_accuracy']:.4f} (10,000 test examples, scored once)" in result.stdout
    shown = edgetrain("runs", "show", run.id, "--runs-dir", str(tmp_path), env={"COLUMNS": "300"})
    assert f"test accuracy {test['test_accuracy']:.4f} on 10,000 test examples" in shown.stdout, shown.stdout


def test_fp16_allreduce_accumulated_batches_batch_size_and_tf_threads_train(tmp_path):
    result = edgetrain("run", "lenet", "--np", "2", "--epochs", "1", "--max-steps", "48", "--batch-size", "96", "--fp16-allreduce",
                       "--sync-every", "2", "--lr-scaling", "0.5", "--tf-threads", "3", "--runs-dir", str(tmp_path))
    assert result.returncode == 0, result.stderr
    [run] = runs.all_runs(tmp_path)
    [metrics] = run.metrics()
    assert metrics["val_accuracy"] > 0.6  # chance is 0.1
    # After warmup the rate counts every image an update averages, ranks x accumulated batches x
    # batch size in LeNet's batches of 64, here to the power 0.5; then LeNet's schedule, as it stood
    # when the last execution of 8 steps began, at step 40 of 48.
    assert metrics["lr"] == pytest.approx(0.001 * (2 * 2 * 96 / 64) ** 0.5 * anneal(40 / 48, 0.25, 1.0, 0.1))
    ckpt = checkpoints.latest(run.checkpoints)
    assert ckpt.manifest["options"] == {"batch_size": 96, "fp16_allreduce": True, "sync_every": 2}
    # Without the option each of the 2 ranks would get 1 thread (the node's cores divided among its ranks).
    assert [("3 TF threads" in log.read_text()) for log in run.logs()] == [True, True]
    digests = final_digests(run)
    assert digests[0] == digests[1] and len(digests[0]) == 1


def rank_says(root, rank: int, pattern: str, timeout: float = 120) -> re.Match:
    """The first match of ``pattern`` in a rank's log, once the rank has written it."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        logs = list(root.glob(f"*/rank.{rank}.log"))
        m = re.search(pattern, logs[0].read_text()) if logs else None
        if m:
            return m
        time.sleep(0.5)
    raise AssertionError(f"rank {rank} never wrote {pattern!r}")


def rank_pid(root, rank: int, timeout: float = 120) -> int:
    """The pid a rank logs when it starts."""
    return int(rank_says(root, rank, r"\(pid (\d+)", timeout).group(1))


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def long_run(root):
    cmd = [sys.executable, "-m", "edgetrain", "run", "lenet", "--np", "2", "--epochs", "20", "--runs-dir", str(root)]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                            preexec_fn=sigint_default)


def stop_and_wait(proc, sig: int, pid: int) -> tuple[str, float]:
    os.kill(pid, sig)
    sent = time.time()
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR1)  # the CLI prints its threads' stacks
        time.sleep(2)
        # mpirun runs in its own session: end it (and the ranks in its process group) with the CLI.
        for child in descendants(proc.pid):
            if os.getpgid(child) == child:
                os.killpg(child, signal.SIGKILL)
        proc.kill()
        _, err = proc.communicate()
        raise AssertionError(f"the CLI did not end within 60 s of signal {sig}; its stderr ends:\n{err[-8000:]}") from None
    return err, time.time() - sent


@pytest.mark.parametrize("when", [r"\(pid \d+", r"TF threads, TF .*Horovod"], ids=["starting", "training"])
def test_a_dying_rank_ends_the_run_and_is_named(tmp_path, when):
    """SIGKILL rank 1 - as the out-of-memory killer would - while it starts (importing TensorFlow,
    in hvd.init) or once it trains: the run must end promptly, naming rank 1 and the signal. Its
    keeper's record names it: Hydra may report rank 0, which it killed in turn (2 runs of 6 killed
    in hvd.init beside another training did, before the keeper)."""
    proc = long_run(tmp_path)
    pid = rank_pid(tmp_path, 1)
    rank_says(tmp_path, 1, when)
    time.sleep(3 if when.startswith("TF") else 1)
    err, took = stop_and_wait(proc, signal.SIGKILL, pid)
    assert proc.returncode == 1
    assert took < 30
    [run] = runs.all_runs(tmp_path)
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"edgetrain: error: run {run.id}: rank 1 on ") and "failed: killed by SIGKILL (signal 9) - " in last, last
    assert f"--resume {run.id}" in last
    assert run.record().status == "failed"


def test_ctrl_c_stops_every_rank(tmp_path):
    proc = long_run(tmp_path)
    pids = [rank_pid(tmp_path, 0), rank_pid(tmp_path, 1)]
    time.sleep(8)
    err, took = stop_and_wait(proc, signal.SIGINT, proc.pid)
    assert proc.returncode == 130 and took < 30
    [run] = runs.all_runs(tmp_path)
    assert err.strip().splitlines()[-1] == (
        f"edgetrain: error: run {run.id} interrupted - continue it with: "
        f"edgetrain run lenet --np 2 --epochs 20 --runs-dir {tmp_path} --resume {run.id}"
    )
    assert run.record().status == "interrupted"
    deadline = time.time() + 10
    while any(alive(p) for p in pids) and time.time() < deadline:
        time.sleep(0.2)
    assert not any(alive(p) for p in pids)


def test_a_live_run_cannot_be_resumed_twice_and_a_killed_controller_takes_its_ranks_along(tmp_path):
    cmd = [sys.executable, "-m", "edgetrain", "run", "lenet", "--np", "2", "--epochs", "500", "--max-steps", "5",
           "--runs-dir", str(tmp_path)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        pids = [rank_pid(tmp_path, 0), rank_pid(tmp_path, 1)]
        [run] = runs.all_runs(tmp_path)
        deadline = time.time() + 120
        while checkpoints.latest(run.checkpoints) is None and time.time() < deadline:
            time.sleep(0.5)
        second = edgetrain("run", "lenet", "--np", "2", "--epochs", "600", "--resume", run.id, "--runs-dir", str(tmp_path))
        line = second.stderr.strip().splitlines()[-1]
        assert second.returncode == 1 and line.startswith(f"edgetrain: error: run {run.id} is in use by pid {proc.pid} on "), second.stderr
        assert proc.poll() is None and all(alive(p) for p in pids)  # the first run goes on untouched
        assert runs.summarize(run).status == "running"
    finally:
        proc.kill()  # SIGKILL: no handler of ours runs
        proc.wait()
    deadline = time.time() + 15
    while any(alive(p) for p in pids) and time.time() < deadline:
        time.sleep(0.2)
    assert not any(alive(p) for p in pids), "ranks outlived their controller"
    assert runs.summarize(run).status == "abandoned"
    shown = edgetrain("runs", "show", run.id, "--runs-dir", str(tmp_path), env={"COLUMNS": "300"})
    assert f"--resume {run.id}" in shown.stdout
    done = checkpoints.latest(run.checkpoints).epoch
    resumed = edgetrain("run", "lenet", "--np", "2", "--epochs", str(done + 1), "--max-steps", "5", "--resume", run.id,
                        "--runs-dir", str(tmp_path))
    assert resumed.returncode == 0, resumed.stderr
    assert run.record().status == "completed" and checkpoints.latest(run.checkpoints).epoch == done + 1
    # Each attempt says what ended it, the killed one included.
    attempts = edgetrain("runs", "show", run.id, "--runs-dir", str(tmp_path), env={"COLUMNS": "300"}).stdout
    assert f"ranks; ended: {launch.ABANDONED}\n" in attempts and f"resumed from epoch {done}; ended: completed\n" in attempts, attempts


def test_a_second_run_on_the_host_runtime_is_told_what_already_trains_there(tmp_path):
    """Two `edgetrain run`s at once on one machine's host runtime (two users' run directories):
    the second names the first, whose ranks it would share the cores with, and both go on."""
    first = long_run(tmp_path / "alice")
    try:
        rank_pid(tmp_path / "alice", 1)
        [busy] = runs.all_runs(tmp_path / "alice")
        second = edgetrain("run", "lenet", "--np", "1", "--epochs", "1", "--max-steps", "2", "--runs-dir", str(tmp_path / "bob"))
        assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-2000:]
        assert re.search(rf"edgetrain: warning: \S+ already trains run {busy.id} \(2 ranks, user \w+\): the two runs share its "
                         "cores", second.stdout), second.stdout
        assert first.poll() is None  # the first run goes on
    finally:
        first.send_signal(signal.SIGINT)
        first.communicate(timeout=60)
    done = edgetrain("run", "lenet", "--np", "1", "--epochs", "1", "--max-steps", "2", "--runs-dir", str(tmp_path / "bob"))
    assert done.returncode == 0 and busy.id not in done.stdout, done.stdout  # ended: no longer named
