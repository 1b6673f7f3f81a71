"""This machine's disk fills during a run (the host runtime: the controller's run directory is
also the ranks'): the run ends, not hangs, in one line on stderr with a non-zero exit; no rank is
left; run.json keeps its last whole version; and once space is freed the run resumes from its
last good checkpoint, having lost at most the epoch in progress."""

from __future__ import annotations

import enum
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgetrain.shared import checkpoints, failures, runs
from edgetrain.shared.errors import EdgetrainError
from edgetrain.controller.inventory import Host
from edgetrain.controller.remote import Nodes
from tests.conftest import ROOT, assert_one_line_error, edgetrain, project_script


pytestmark = pytest.mark.mpi

SIZE_MB = 300  # roomy enough for a few LeNet checkpoints (~19 MB each) and the run's files
LOCAL = Host(name="localhost", address="localhost", arch="x86_64", slots=2, runtime="host", connection="local")


@pytest.fixture
def full_disk(tmp_path):
    """A tmpfs of the test's own for the runs directory, unmounted afterwards whatever happened."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    where = tmp_path / "runs"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={SIZE_MB}m", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


def fill(where: Path, leave: int = 0) -> Path:
    """Fill the file system to the last byte, then give ``leave`` bytes of it back."""
    filler = where / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        for size in (1024 * 1024, 4096, 1):
            try:
                while True:
                    os.write(fd, b"\0" * size)
            except OSError:
                pass
        if leave:
            os.ftruncate(fd, os.fstat(fd).st_size - leave)
    finally:
        os.close(fd)
    return filler


def ranks_of(run_id: str) -> list[int]:
    """Processes still running for this run (their command line names its run directory)."""
    found = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                if run_id.encode() in (proc / "cmdline").read_bytes():
                    found.append(int(proc.name))
            except OSError:
                continue
    return found


class Order(enum.Enum):
    """Which write meets the full disk first, and what the rank's failure leaves after it."""

    RANK_THEN_ROOM = "rank-then-room"  # rank 0's checkpoint, half written: its removal leaves room for run.json again
    RANK_THEN_FULL = "rank-then-full"  # rank 0's next write, with no byte left: run.json may not fit after it either
    CONTROLLER = "controller"  # this machine's run.json, as training starts: the rank has written nothing yet


# Whichever order, the same words: the only thing that differs is what was being written.
REPORT = "failed: the disk of its run directory on {host} is full (No space left on device) while writing "
# A script that says it is set up (its working copy made), waits for the disk to be filled, and then
# writes nothing for a while after training starts (no TensorBoard files, slow steps, a metrics line
# only at the epoch's end): run.json, which records what training started with, is the first of the
# run's files to meet the full disk. The script's own prints meet it before, and are dropped.
SET_UP = "set up, training in 5 s"
QUIET_START = f"""
import time
import numpy as np
import tensorflow as tf
import edgetrain.callbacks as et

class Slow(tf.keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        time.sleep(0.5)

print("{SET_UP}", flush=True)
time.sleep(5)
model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(1)])
model.compile("sgd", "mse")
model.fit(np.zeros((6400, 4), "float32"), np.zeros(6400, "float32"), batch_size=64, epochs=2, verbose=0,
          callbacks=[*et.callbacks(batch_size=64, tensorboard=False), Slow()])
"""


@pytest.mark.parametrize("order", list(Order), ids=[o.value for o in Order])
def test_this_machines_disk_full_mid_run_ends_it_in_one_line_whichever_write_meets_it_first(tmp_path, full_disk, order):
    if order is Order.CONTROLLER:
        program = [str(project_script(tmp_path, QUIET_START)), "--np", "2"]
    else:
        # 40 steps an epoch: seconds of training between the disk filling and the rank's next write.
        program = ["lenet", "--np", "2", "--epochs", "8", "--max-steps", "40"]
    cmd = [sys.executable, "-m", "edgetrain", "run", *program, "--runs-dir", str(full_disk)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        deadline = time.monotonic() + 300
        if order is Order.CONTROLLER:
            started = lambda: len([p for p in full_disk.glob("*/rank.*.log") if SET_UP in p.read_text()]) == 2  # noqa: E731
        else:
            started = lambda: list(full_disk.glob("*/checkpoints/epoch-0001"))  # noqa: E731
        while not started():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate(timeout=60)
            time.sleep(0.05)
        # Rank 0's checkpoints are ~19 MB: with 8 MB left, one is half written when the disk fills.
        filler = fill(full_disk, leave=8 * 1024 * 1024 if order is Order.RANK_THEN_ROOM else 0)
        filled = time.monotonic()
        out, err = proc.communicate(timeout=120)
        detected = time.monotonic() - filled
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    run_dir = next(p.parent for p in full_disk.glob("*/run.json"))
    rid = run_dir.name
    r = subprocess.CompletedProcess(cmd, proc.returncode, out, err)
    line = assert_one_line_error(r, f"run {rid} {REPORT.format(host=socket.gethostname())}",
                                 f" - free disk space there ({run_dir}), then resume with: ", f"--resume {rid}")
    writing = line.split(" while writing ", 1)[1].split(" - ", 1)[0]
    assert detected < 60, (detected, line)
    assert ranks_of(rid) == []
    # run.json is whole: the failure where it fitted after the rank's, else its last version before.
    info = json.loads((run_dir / "run.json").read_text())
    assert info["id"] == rid, info
    assert not list(run_dir.glob("*.tmp")) and not list((run_dir / "checkpoints").glob(".*"))
    good = max((int(p.name.split("-")[1]) for p in (run_dir / "checkpoints").glob("epoch-*")), default=0)
    if order is Order.CONTROLLER:
        assert (writing, info["status"], good) == ("run.json", "running", 0), (line, info["status"])
    elif order is Order.RANK_THEN_ROOM:
        assert (writing, info["status"]) == (f"checkpoints/epoch-{good + 1:04d}", "failed"), (line, info["status"])
    else:
        assert writing in (f"checkpoints/epoch-{good + 1:04d}", "metrics.jsonl") and info["status"] in ("running", "failed"), \
            (line, info["status"])

    filler.unlink()
    listed = edgetrain("runs", "list", "--runs-dir", str(full_disk))
    assert listed.returncode == 0 and rid in listed.stdout, listed.stdout + listed.stderr
    if order is not Order.RANK_THEN_ROOM:
        return  # resumed from a checkpoint below once; from none, a resume is a fresh start
    resumed = edgetrain("run", "lenet", "--np", "2", "--epochs", str(good + 1), "--max-steps", "10",
                        "--runs-dir", str(full_disk), "--resume", rid, timeout=600)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    info = json.loads((run_dir / "run.json").read_text())
    assert info["status"] == "completed" and info["attempts"][-1]["resumed_from_epoch"] == good
    print(f"this machine's disk full mid-run ({order.value}): ended in {detected:.1f} s, resumed from epoch {good}")


def test_this_machines_disk_full_before_mpirun_starts_leaves_no_partial_run(tmp_path, full_disk):
    """Full from the start: the run is refused in one line, and nothing half-made is left."""
    filler = fill(full_disk)
    before = sorted(p.name for p in full_disk.iterdir())
    r = edgetrain("run", "lenet", "--np", "2", "--epochs", "1", "--max-steps", "2", "--runs-dir", str(full_disk))
    assert_one_line_error(r, "No space left on device")
    assert sorted(p.name for p in full_disk.iterdir()) == before
    filler.unlink()


def test_logs_brought_home_onto_a_full_disk_leave_the_old_copies_whole(tmp_path, full_disk):
    """The end of a container run copies each node's logs and metrics into this machine's run
    directory: when they no longer fit, the copies already there stay whole (old, never partial)."""
    node = tmp_path / "node"
    node.mkdir()
    (node / "metrics.jsonl").write_text("".join(json.dumps({"epoch": e, "loss": 1.0 / e}) + "\n" for e in range(1, 2000)))
    (node / "rank.0.log").write_bytes(os.urandom(SIZE_MB * 1024 * 1024 // 2))
    here = full_disk / "run"
    here.mkdir()
    (here / "metrics.jsonl").write_text(json.dumps({"epoch": 1, "loss": 1.0}) + "\n")
    (here / "rank.0.log").write_text("rank 0/2 on node1\n")
    filler = full_disk / "filler"
    filler.write_bytes(b"\0" * (SIZE_MB * 1024 * 1024 * 2 // 3))
    before = {p.name: p.read_bytes() for p in here.iterdir()}
    with Nodes() as nodes, pytest.raises(EdgetrainError) as err:
        nodes.fetch(LOCAL, str(node), ["metrics.jsonl", "rank.*.log"], here)
    assert "No space left on device" in str(err.value) and "\n" not in str(err.value)
    assert {p.name: p.read_bytes() for p in here.iterdir()} == before  # nothing partial, no staging left
    filler.unlink()
    with Nodes() as nodes:
        assert nodes.fetch(LOCAL, str(node), ["metrics.jsonl", "rank.*.log"], here) == []
    assert (here / "metrics.jsonl").read_bytes() == (node / "metrics.jsonl").read_bytes()
    assert sorted(p.name for p in here.iterdir()) == ["metrics.jsonl", "rank.0.log"]


def test_a_metrics_line_that_meets_a_full_disk_is_named_in_the_failure_record(tmp_path, full_disk):
    fill(full_disk)
    with pytest.raises(OSError) as caught:
        runs.Run(full_disk).append_metrics([{"epoch": 1, "loss": 0.5}])
    assert failures.disk_full(caught.value, full_disk) == (
        "its run directory's disk is full (No space left on device) while writing metrics.jsonl",
        "free disk space on that node, then resume")


def test_a_checkpoint_manifest_that_meets_a_full_disk_is_named_in_the_failure_record(full_disk):
    # The job's files fit and the disk fills just after (the run's own writes meeting another's): the
    # manifest's write then fails in a flush, whose OSError carries no file name of its own.
    def save(where: Path) -> None:
        (where / "state").write_bytes(b"\0" * 4096)
        fill(full_disk)

    with pytest.raises(OSError) as caught:
        checkpoints.write(full_disk / "checkpoints", 2, "lenet", {"epoch": 2}, save)
    assert caught.value.filename is not None and caught.value.filename.endswith("/manifest.json")
    assert failures.disk_full(caught.value, full_disk) == (
        "its run directory's disk is full (No space left on device) while writing checkpoints/epoch-0002",
        "free disk space on that node, then resume")
    assert list((full_disk / "checkpoints").iterdir()) == []  # no half-assembled checkpoint is left
