"""--sync-every K on real ranks (edgetrain.shared.sync): two Horovod ranks through the CLI, the
allreduces counted in Horovod's own timeline, the weights compared rank by rank; torch's DDP the
same way through edgetrain.ddp."""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

import pytest

from edgetrain.shared import checkpoints, runs
from lab.timeline import load
from tests.conftest import ROOT, edgetrain

pytestmark = pytest.mark.mpi

SCRIPTS = ROOT / "tests" / "scripts"
DIGEST = re.compile(r"^final weights sha256 ([0-9a-f]{64})$", re.M)
STEP = re.compile(r"^step (\d+) digest ([0-9a-f]{64})$", re.M)


def allreduces(timeline: Path) -> Counter:
    """Collectives rank 0's Horovod ran, by the tensor's name: each ALLREDUCE activity is one."""
    events = load(timeline)
    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and "name" in e.get("args", {})}
    return Counter(names.get(e.get("pid")) for e in events if e.get("ph") == "B" and e.get("name") == "ALLREDUCE")


def gradient_allreduces(counted: Counter) -> Counter:
    """Per gradient (Horovod's DistributedOptimizer names them ..._grads_0, ..._grads_1_0, ...), how often it was allreduced."""
    return Counter({int(m.group(1) or 0): n for name, n in counted.items() if name and (m := re.search(r"_grads(?:_(\d+))?_0$", name))})


def weight_syncs(counted: Counter) -> set[int]:
    """How often each tensor of SyncWeights' grouped allreduce went (one count per tensor)."""
    return {n for name, n in counted.items() if name and name.startswith("HorovodGroupedAllreduce_")}


def lenet(tmp_path: Path, name: str, *options: str) -> tuple[runs.Run, Counter]:
    root = tmp_path / name
    timeline = tmp_path / f"{name}.timeline.json"
    r = edgetrain("run", "lenet", "--np", "2", "--epochs", "1", "--max-steps", "16", "--steps-per-execution", "4",
                  "--runs-dir", str(root), *options, env={"HOROVOD_TIMELINE": str(timeline)})
    assert r.returncode == 0, r.stderr
    [run] = runs.all_runs(root)
    digests = {int(p.name.split(".")[1]): DIGEST.findall(p.read_text()) for p in run.logs()}
    assert digests[0] and digests[0] == digests[1], digests  # both ranks end on one model
    return run, allreduces(timeline)


def test_accumulating_k_batches_allreduces_each_gradient_once_per_k_batches(tmp_path):
    _, every = lenet(tmp_path, "k1")
    run, fourth = lenet(tmp_path, "k4", "--sync-every", "4")
    # LeNet's 8 gradients, 16 steps: 16 allreduces each, then 4.
    assert gradient_allreduces(every) == Counter({i: 16 for i in range(8)}), every
    assert gradient_allreduces(fourth) == Counter({i: 4 for i in range(8)}), fourth
    assert not weight_syncs(every) and not weight_syncs(fourth)
    assert checkpoints.latest(run.checkpoints).manifest["options"]["sync_every"] == 4


def test_syncing_weights_allreduces_no_gradient_and_the_model_once_per_k_batches(tmp_path):
    run, counted = lenet(tmp_path, "weights", "--sync-every", "4", "--sync-mode", "weights")
    assert not gradient_allreduces(counted), counted
    # 16 steps: 4 syncs, none more at the validation or the epoch's end (nothing changed since step 16).
    assert weight_syncs(counted) == {4}, counted
    [metrics] = run.metrics()
    assert metrics["val_accuracy"] > 0.3  # it learned (chance is 0.1)
    # The rate is one rank's at LeNet's own batch: scaled by neither the 2 ranks nor K (after the warmup, none).
    assert metrics["lr"] <= 0.001 + 1e-9


def test_syncing_weights_every_evaluation_is_a_sync_too(tmp_path):
    # K = 4, an evaluation every 6 steps (Keras then reports every 2): syncs after steps 4, 6 (the
    # evaluation's), 10, 12 (the evaluation's, 2 updates after the last) and 16.
    run, counted = lenet(tmp_path, "evals", "--sync-every", "4", "--sync-mode", "weights", "--eval-every", "6")
    assert weight_syncs(counted) == {5}, counted
    assert [e["step"] for e in run.evaluations()] == [6, 12, 16]


def rank_steps(run: runs.Run) -> dict[int, dict[int, str]]:
    return {int(p.name.split(".")[1]): {int(s): d for s, d in STEP.findall(p.read_text())} for p in run.logs()}


@pytest.mark.parametrize("outer", [[], ["--outer-lr", "0.7", "--outer-momentum", "0.9"]], ids=["average", "diloco"])
def test_syncing_weights_the_ranks_agree_after_each_sync_and_differ_between(tmp_path, outer):
    r = edgetrain("run", str(SCRIPTS / "sync_every.py"), "--np", "2", "--runs-dir", str(tmp_path), "--", "--every", "4",
                  "--steps", "12", *outer)
    assert r.returncode == 0, r.stderr
    steps = rank_steps(runs.all_runs(tmp_path)[0])
    assert sorted(steps[0]) == sorted(steps[1]) == list(range(1, 13))
    agree = [s for s in range(1, 13) if steps[0][s] == steps[1][s]]
    assert agree == [4, 8, 12], agree
    assert len(set(steps[0].values())) == 12  # every local step moved rank 0's model


def test_accumulating_gradients_the_ranks_always_agree_and_the_model_moves_every_k(tmp_path):
    r = edgetrain("run", str(SCRIPTS / "sync_every.py"), "--np", "2", "--runs-dir", str(tmp_path), "--", "--every", "4",
                  "--steps", "12", "--mode", "grads")
    assert r.returncode == 0, r.stderr
    steps = rank_steps(runs.all_runs(tmp_path)[0])
    assert steps[0] == steps[1]
    moved = [s for s in range(2, 13) if steps[0][s] != steps[0][s - 1]]
    assert moved == [4, 8, 12], moved


RESUMED = re.compile(r"^resumed from .* \(epoch (\d+)\), weights sha256 ([0-9a-f]{64})$", re.M)


def test_a_run_syncing_weights_checkpoints_at_a_sync_with_its_outer_momentum_and_resumes_from_it(tmp_path):
    import tensorflow as tf

    diloco = ("--sync-every", "4", "--sync-mode", "weights", "--outer-lr", "0.7", "--outer-momentum", "0.9")
    first = edgetrain("run", "lenet", "--np", "2", "--epochs", "1", "--max-steps", "14", *diloco, "--runs-dir", str(tmp_path))
    assert first.returncode == 0, first.stderr
    [run] = runs.all_runs(tmp_path)
    [saved] = DIGEST.findall(run.log(0).read_text())
    ckpt = checkpoints.latest(run.checkpoints)
    assert ckpt.manifest["options"] == {"batch_size": 64, "sync_every": 4, "sync_mode": "weights", "outer_lr": 0.7,
                                        "outer_momentum": 0.9}
    # 14 steps: syncs at 4, 8 and 12, and the epoch's last two steps synced before its validation;
    # the outer momentum is in the checkpoint, and not zero.
    state = str(ckpt.path / "state")
    momentum = [name for name, _ in tf.train.list_variables(state) if name.startswith("sync/momentum/")]
    assert momentum and any(abs(tf.train.load_variable(state, name)).max() > 0 for name in momentum)

    refused = edgetrain("run", "lenet", "--np", "2", "--epochs", "2", "--max-steps", "14", "--resume", run.id, "--runs-dir", str(tmp_path))
    assert refused.returncode == 2 and "--outer-momentum 0.9 (asked None)" in refused.stderr, refused.stderr
    resumed = edgetrain("run", "lenet", "--np", "2", "--epochs", "2", "--max-steps", "14", *diloco, "--resume", run.id,
                        "--runs-dir", str(tmp_path))
    assert resumed.returncode == 0, resumed.stderr
    # Both ranks had rank 0's checkpointed model at the epoch's end: the resume starts from it.
    [(epoch, restored)] = RESUMED.findall(run.log(0).read_text())
    assert int(epoch) == 1 and restored == saved
    digests = {int(p.name.split(".")[1]): DIGEST.findall(p.read_text()) for p in run.logs()}
    assert digests[0][-1] == digests[1][-1] != saved
    assert [m["epoch"] for m in run.metrics()] == [1, 2]


TORCH_SCRIPT = str(SCRIPTS / "torch" / "sync_every.py")
TORCH_STEP = re.compile(r"^step (\d+) digest ([0-9a-f]{64}) hooks (\d+) calls (\d+)$", re.M)


def torch_steps(tmp_path: Path, *args: str) -> tuple[runs.Run, dict[int, dict[int, tuple[str, int, int]]]]:
    """Per rank, per step: the parameters' digest, DDP's bucket allreduces and all_reduce calls so far."""
    r = edgetrain("run", TORCH_SCRIPT, "--np", "2", "--strategy", "torch", "--runs-dir", str(tmp_path), "--", *args, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    [run] = runs.all_runs(tmp_path)
    return run, {int(p.name.split(".")[1]): {int(s): (d, int(h), int(c)) for s, d, h, c in TORCH_STEP.findall(p.read_text())}
                 for p in run.logs()}


def test_torch_accumulating_k_batches_runs_ddps_allreduce_once_per_k(tmp_path):
    _, every = torch_steps(tmp_path / "k1", "--every", "1", "--steps", "12")
    _, fourth = torch_steps(tmp_path / "k4", "--every", "4", "--steps", "12")
    # The tiny model is one DDP bucket: one allreduce a step, then one per 4 steps, none by hand.
    assert [every[0][s][1:] for s in range(1, 13)] == [(s, s) for s in range(1, 13)]
    assert [fourth[0][s][1:] for s in range(1, 13)] == [(s // 4, s // 4) for s in range(1, 13)]
    assert fourth[0] == fourth[1]  # the ranks agree at every step
    moved = [s for s in range(2, 13) if fourth[0][s][0] != fourth[0][s - 1][0]]
    assert moved == [4, 8, 12], moved


def test_torch_syncing_weights_leaves_ddp_quiet_and_averages_once_per_k(tmp_path):
    _, steps = torch_steps(tmp_path, "--every", "4", "--mode", "weights", "--steps", "12")
    assert [steps[0][s][1:] for s in range(1, 13)] == [(0, s // 4) for s in range(1, 13)]
    agree = [s for s in range(1, 13) if steps[0][s][0] == steps[1][s][0]]
    assert agree == [4, 8, 12], agree


def test_torch_syncing_weights_with_an_outer_step_checkpoints_its_momentum_and_resumes_from_it(tmp_path):
    import torch

    diloco = ("--every", "4", "--mode", "weights", "--outer-lr", "0.7", "--outer-momentum", "0.9", "--steps", "6")
    run, _ = torch_steps(tmp_path, *diloco, "--epochs", "1")
    # 6 steps: a sync at 4, and the 2 after it synced by save() before the checkpoint.
    ended = re.findall(r"^end digest (\S+)$", run.log(0).read_text(), re.M)
    assert ended and ended == re.findall(r"^end digest (\S+)$", run.log(1).read_text(), re.M)
    ckpt = checkpoints.latest(run.checkpoints)
    state = torch.load(ckpt.path / "state.pt", weights_only=True)
    assert state["sync"]["momentum"] and any(m.abs().max() > 0 for m in state["sync"]["momentum"])
    r = edgetrain("run", TORCH_SCRIPT, "--np", "2", "--strategy", "torch", "--runs-dir", str(tmp_path), "--resume", run.id,
                  "--", *diloco, "--epochs", "2", timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    for rank in (0, 1):
        assert f"start 1 digest {ended[0]}" in run.log(rank).read_text()
