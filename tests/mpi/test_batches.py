"""`edgetrain run --batch-by speed` on two real ranks (mpirun -n 2 on two local nodes declared 3 and
1 times as fast): a Keras/Horovod script (edgetrain.callbacks' plan) and a torch DDP script on Gloo
(edgetrain.ddp's plan and sampler) with batches 3 and 1 end K steps with the weights one process
gets training on the union of the ranks' batches - and, without the loss weight, do not; the LeNet
job sizes its batches alike; every run says each rank's batch. And the runs it refuses."""

from __future__ import annotations

import re

import pytest

from edgetrain.shared import runs
from tests.conftest import ROOT, assert_one_line_error, edgetrain, loopback_pair, project_script

pytestmark = pytest.mark.mpi

SCRIPTS = ROOT / "tests" / "scripts" / "batches"
STEPS = 5
RESULT = re.compile(r"^batches 3/1 weighted (\S+) unweighted (\S+)$", re.M)
DIGEST = re.compile(r"^final weights sha256 ([0-9a-f]{64})$", re.M)

def two_nodes(tmp_path):
    """This machine twice, declared 3 and 1 times as fast."""
    return loopback_pair(tmp_path / "two", (3, 1))


def test_lenet_by_speed_sizes_each_ranks_batch_and_says_so(tmp_path):
    root = tmp_path / "runs"
    r = edgetrain("run", "lenet", "--np", "2", "-i", str(two_nodes(tmp_path)), "--batch-by", "speed", "--epochs", "1", "--max-steps", "8",
                  "--steps-per-execution", "4", "--runs-dir", str(root))
    assert r.returncode == 0, r.stderr[-3000:]
    assert "--batch-by speed: from the inventory's edgetrain_speed: localhost 3, loopback 1" in r.stdout
    # The global batch stays 2 x 64; the steps are the global batch's count in the data, capped by --max-steps.
    assert "training lenet on 2 ranks, batches 96/32 by speed, 8 steps per epoch" in r.stdout, r.stdout
    [run] = runs.all_runs(root)
    where = run.record().placement
    assert where.speeds == [3.0, 1.0] and where.batches == [96, 32]
    digests = {p.name: DIGEST.findall(p.read_text()) for p in run.logs()}
    assert len({d for found in digests.values() for d in found}) == 1, digests  # one model on both ranks
    shown = edgetrain("runs", "show", run.id, "--runs-dir", str(root))
    assert "batches by speed (from the inventory's edgetrain_speed): rank 0 on localhost: 96, rank 1 on loopback: 32" in shown.stdout


@pytest.mark.parametrize(("args", "message"), [
    (("--np", "2"), "--batch-by speed needs each node's speed: no bench of lenet on this inventory timed localhost alone, "
                    "and localhost set no edgetrain_speed"),
    (("--np", "2", "--sync-every", "2", "--sync-mode", "weights"), "--sync-mode weights averages models"),
    (("--np", "2", "--strategy", "tf-multiworker", "--", "x"), "--strategy tf-multiworker splits one global batch itself"),
])
def test_a_run_by_speed_that_cannot_be_sized_is_one_line_and_starts_nothing(tmp_path, args, message):
    target = "lenet" if "tf-multiworker" not in args else str(project_script(tmp_path, "print('never')\n"))
    r = edgetrain("run", target, "--batch-by", "speed", *args, "--runs-dir", str(tmp_path / "runs"))
    assert_one_line_error(r, message, code=2)
    assert not runs.all_runs(tmp_path / "runs")


@pytest.mark.parametrize(("script", "strategy"), [("keras_exact.py", "horovod"), ("torch_exact.py", "torch")])
def test_uneven_batches_train_as_one_process_on_their_union(tmp_path, script, strategy):
    root = tmp_path / "runs"
    r = edgetrain("run", str(SCRIPTS / script), "--np", "2", "-i", str(two_nodes(tmp_path)), "--batch-by", "speed", "--strategy", strategy,
                  "--runs-dir", str(root), "--", str(STEPS))
    assert r.returncode == 0, r.stderr[-3000:]
    # The script's per-rank batch is 2: a global batch of 4, split 3 and 1 by the declared speeds.
    assert "on 2 ranks, batches 3/1 by speed" in r.stdout, r.stdout
    [run] = runs.all_runs(root)
    assert run.record().placement.batches == [3, 1]
    found = RESULT.search((run.path / "rank.0.log").read_text())
    assert found, (run.path / "rank.0.log").read_text()[-3000:]
    weighted, unweighted = float(found[1]), float(found[2])
    assert weighted < 1e-5, found[0]  # float tolerance: the union's update, step for step
    assert unweighted > 1e-2, found[0]  # the weight is what makes it so
