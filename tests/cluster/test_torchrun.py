"""The DDP LeNet through edgetrain against the same script started by hand with torchrun in a
container on each node - the way a torch user runs it without edgetrain - on the emulated Pi 4
testbed, N = 1..3, one rank per node, every node warmed first (the image and torch read once),
interleaved so the machine's drift falls on both alike: the second epoch's img/s, the time from
the command to the first step (rank 0's first progress line as it comes) and the wall time; beside
them edgetrain's built-in Horovod LeNet (Keras, the same layers with "same" padding: 1.63 M
parameters to the DDP script's 0.84 M) for the same 2 x 100 steps of 64 images, its img/s from its
metrics and its first step from its run record (from the launch). edgetrain's console, each line
at its second, is kept in the run directory (console.txt): where its time went.

A measurement, reported rather than asserted (-m bench): ``pytest -m bench tests/cluster/test_torchrun.py -s``.
EDGETRAIN_TORCHRUN_N names the node counts raced, in order, a try each (default "1 2 3"; "3 3 3"
is three tries at three nodes).

With EDGETRAIN_TORCHRUN_TARGET (a held-out accuracy) the two launchers race the same script to it
instead: `--holdout 6000`, scored four times an epoch, at most EDGETRAIN_TORCHRUN_EPOCHS epochs (6),
the seed EDGETRAIN_TORCHRUN_SEED (44); the time to it from the command and from the first step, the
launchers taking turns at going first. Horovod's LeNet, another script, is left out of the race.
The emulation is the optimistic bracket (each node's communication threads on a core of their own,
idle nodes training stand-ins), or with EDGETRAIN_TESTBED_BRACKET=pessimistic the other (all of a
node in one quota, no stand-ins); see docs/scaling.md for what each favours.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest

from edgetrain.controller import images
from edgetrain.controller.bench.model import evaluation_interval
from edgetrain.shared import datasets
from edgetrain.shared import runs
from tests.conftest import ROOT

from .long_run import TEST_ACCURACY, TimedOutput, in_turns

pytestmark = [pytest.mark.cluster, pytest.mark.docker, pytest.mark.slow, pytest.mark.bench]

SCRIPT = ROOT / "examples" / "torch_ddp" / "train.py"
# 100 steps: an epoch long enough (15-40 s on the emulated nodes) that drift within it is small.
STEPS = 100
EPOCH = re.compile(r"epoch 2/\d+: loss [\d.]+, ([\d,]+) img/s on (\d+) ranks")
REACHED = re.compile(r"reached held-out accuracy [\d.]+ after ([\d,]+) images")
PORT = 29610
COUNTS = tuple(int(n) for n in os.environ.get("EDGETRAIN_TORCHRUN_N", "1 2 3").split())
TARGET = os.environ.get("EDGETRAIN_TORCHRUN_TARGET")
HOLDOUT, BATCH = 6000, 64  # BATCH: the script's own default
EPOCHS = "2" if TARGET is None else os.environ.get("EDGETRAIN_TORCHRUN_EPOCHS", "6")
FIRST_STEP = f"epoch 1/{EPOCHS} step 1/"  # rank 0's first progress line begins so
# torch 1.13 (the CUDA image's) can deadlock as a DDP script returns (docs/scaling-history.md); edgetrain keeps
# the process groups so it cannot, torchrun does not, and a hung rank would stall the race for half an hour.
HUNG_AFTER_S = 120


def script_args(n: int) -> list[str]:
    """The script's arguments at n ranks: 2 x STEPS steps, or the race to TARGET."""
    if TARGET is None:
        return ["--epochs", EPOCHS, "--steps-per-epoch", str(STEPS)]
    steps = -(-datasets.trained_on("mnist", HOLDOUT) // (BATCH * n))
    return ["--epochs", EPOCHS, "--holdout", str(HOLDOUT),
            "--eval-every", str(evaluation_interval(steps, 1)), "--target-accuracy", TARGET,
            "--seed", os.environ.get("EDGETRAIN_TORCHRUN_SEED", "44")]


@dataclass
class Timing:
    wall: float
    first_step: float  # seconds from the command to rank 0's first progress line
    rate: float  # the second epoch's img/s
    to_target: float | None = None  # seconds from the command to rank 0's line that the target was reached
    images: int | None = None  # the images trained on by then
    test_accuracy: float | None = None
    hung: bool = False  # a rank had not ended HUNG_AFTER_S after rank 0's last line (its containers removed)


def reached(said: TimedOutput, log: str, start: float) -> dict:
    """How long after ``start`` and after how many images the script said it reached the target,
    and its test accuracy."""
    found, test = REACHED.search(log), TEST_ACCURACY.search(log)
    return {"to_target": said.said("reached held-out accuracy") - start if found else None,
            "images": int(found.group(1).replace(",", "")) if found else None,
            "test_accuracy": float(test.group(1)) if test else None}


def steady_rate(log: str, n: int) -> float:
    """The second epoch's images per second, as the script's rank 0 printed it."""
    found = EPOCH.search(log)
    assert found and int(found.group(2)) == n, log[-3000:]
    return float(found.group(1).replace(",", ""))


def through_edgetrain(cluster, inventory: str, n: int) -> Timing:
    runs_before, start = cluster.run_ids(), time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "edgetrain", "run", str(SCRIPT), "--np", str(n), "--strategy", "torch",
                             "-i", inventory, "--hang-timeout", "120", "--", *script_args(n)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ, **cluster.env})
    said = TimedOutput(proc)
    proc.wait(timeout=1800)
    wall = time.monotonic() - start
    said.caught_up()
    assert proc.returncode == 0, "".join(said.out)[-3000:] + "".join(said.err)[-3000:]
    run_dir = cluster.runs / cluster.new_run(runs_before)
    (run_dir / "console.txt").write_text(said.console(start))
    first = said.said(FIRST_STEP)
    assert first is not None, "".join(said.out)[-3000:]
    log = (run_dir / "rank.0.log").read_text()
    return Timing(wall, first - start, steady_rate(log, n), **reached(said, log, start))


def through_horovod(cluster, inventory: str, n: int) -> Timing:
    """edgetrain's built-in LeNet under Horovod, for the same steps."""
    runs_before, start = cluster.run_ids(), time.monotonic()
    r = subprocess.run([sys.executable, "-m", "edgetrain", "run", "lenet", "--np", str(n), "-i", inventory, "--hang-timeout", "120",
                        "--epochs", "2", "--max-steps", str(STEPS)], capture_output=True, text=True, cwd=ROOT, env={**os.environ, **cluster.env},
                       timeout=1800)
    wall = time.monotonic() - start
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run = runs.Run(cluster.runs / cluster.new_run(runs_before))
    first = run.record().attempts[-1].first_step_s
    assert first is not None and run.metrics()[-1]["ranks"] == n, r.stdout[-3000:]
    return Timing(wall, first, run.metrics()[-1]["images_per_sec"])


def through_torchrun(cluster, n: int) -> Timing:
    """torchrun on each of the first n nodes, in the image, with the node's network and datasets: what
    a user types on every node (flags with underscores, which every torchrun since 1.13 takes, and
    --redirects/--tee, which 1.13's needed on Python 3.11)."""
    nodes = cluster.bed.state.nodes[:n]
    work = f"{cluster.home}/torchrun-bench"
    for node in nodes:
        subprocess.run(cluster.bed.ssh_argv(node) + [f"mkdir -p {work} && cat > {work}/train.py"], input=SCRIPT.read_text(),
                       text=True, check=True, timeout=60)
    procs, start = [], time.monotonic()
    for i, node in enumerate(nodes):
        cmd = [*node.docker_cli, "run", "--rm", "--name", f"torchrun-bench-{i}", "--network", "host",
               "-v", f"{work}:/work", "-v", f"{cluster.home}/datasets:/data:ro", "-w", "/work",
               "-e", "GLOO_SOCKET_IFNAME=eth0", "-e", "OMP_NUM_THREADS=1", images.TARGETS["amd64"].tag,
               "torchrun", "--nnodes", str(n), "--node_rank", str(i), "--nproc_per_node", "1",
               "--master_addr", nodes[0].address, "--master_port", str(PORT), "--redirects", "2", "--tee", "2",
               "train.py", *script_args(n), "--data", "/data/mnist"]
        procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    said = [TimedOutput(p) for p in procs]
    hung = False
    try:
        while any(p.poll() is None for p in procs):
            assert time.monotonic() - start < 1800, "".join(said[0].out)[-3000:]
            last = said[0].said("test accuracy")
            hung = last is not None and time.monotonic() - last > HUNG_AFTER_S
            if hung:
                break
            time.sleep(1)
    finally:
        for i, node in enumerate(nodes):
            cluster.docker(node.name, "rm", "-f", f"torchrun-bench-{i}", check=False)
    for s in said:
        s.caught_up()
    wall = time.monotonic() - start
    out = "".join(said[0].out)
    assert hung or [p.returncode for p in procs] == [0] * n, shlex.join(cmd) + "\n" + out[-3000:]
    first = said[0].said(FIRST_STEP)
    assert first is not None, out[-3000:]
    return Timing(wall, first - start, steady_rate(out, n), **reached(said[0], out, start), hung=hung)


def test_ddp_through_edgetrain_against_torchrun_by_hand(cluster, emulated, conditions, report):
    # One intra-op thread for both (torch's own default on the testbed's machine, which torchrun
    # keeps for one worker a node): the launchers are compared, not thread counts. edgetrain's
    # default, a node's cores per local rank, is two threads here, which an emulated node's quota
    # of about 0.15 core runs slower.
    inventory = cluster.docker_inventory("docker-one-slot.yml", head_slots=1,
                                         edgetrain_mpi_env={"UCX_TLS": "tcp,self", "OMP_NUM_THREADS": "1"})
    # Untimed, once on every node: the first container a node's engine starts reads the image and
    # torch from a cold disk, which would fall on whichever launcher first used that node (edgetrain,
    # at each N where a node joins).
    for node in cluster.bed.state.nodes[:max(COUNTS)]:
        cluster.docker(node.name, "run", "--rm", "--network", "none", images.TARGETS["amd64"].tag, "python3", "-c", "import torch")
    if TARGET is not None:
        race(cluster, inventory, conditions, report)
        return
    rows = []
    for n in COUNTS:
        et, tr, hv = through_edgetrain(cluster, inventory, n), through_torchrun(cluster, n), through_horovod(cluster, inventory, n)
        rows.append(f"N={n}: edgetrain {et.rate:.0f} img/s, first step {et.first_step:.1f} s, wall {et.wall:.1f} s; "
                    f"torchrun {tr.rate:.0f} img/s, first step {tr.first_step:.1f} s, wall {tr.wall:.1f} s; "
                    f"ratio {et.rate / tr.rate:.2f}x img/s, first step {et.first_step - tr.first_step:+.1f} s, wall {et.wall - tr.wall:+.1f} s; "
                    f"edgetrain's Horovod LeNet {hv.rate:.0f} img/s, first step {hv.first_step:.1f} s from the launch, wall {hv.wall:.1f} s")
        print(rows[-1], flush=True)
    report[f"torch DDP LeNet, {conditions}, 2 x {STEPS} steps: edgetrain vs torchrun by hand, and Horovod LeNet"] = "; ".join(rows)
    assert cluster.leftovers() == {}


def race(cluster, inventory: str, conditions: str, report) -> None:
    """The same script to TARGET through each launcher at every N in COUNTS, the launchers taking
    turns at going first so that the machine's drift does not always fall on the same one."""
    rows = []
    for i, n in enumerate(COUNTS):
        launchers = [("edgetrain", lambda: through_edgetrain(cluster, inventory, n)), ("torchrun", lambda: through_torchrun(cluster, n))]
        timed = in_turns(i, launchers)
        et, tr = timed["edgetrain"], timed["torchrun"]
        row = f"N={n}: " + "; ".join(
            f"{name} {t.rate:.0f} img/s, first step {t.first_step:.1f} s, "
            + (f"{TARGET} at {t.to_target:.1f} s ({t.to_target - t.first_step:.1f} s from the first step) after {t.images:,} images"
               if t.to_target is not None else f"{TARGET} not reached") + f", test {t.test_accuracy}, wall {t.wall:.1f} s" + (f" (hung after its last line; ended {HUNG_AFTER_S} s on)" if t.hung else "")
            for name, t in timed.items())
        if et.to_target is not None and tr.to_target is not None:
            row += (f"; edgetrain {tr.to_target / et.to_target:.2f}x torchrun's speed to {TARGET} from the command, "
                    f"{(tr.to_target - tr.first_step) / (et.to_target - et.first_step):.2f}x from the first step")
        rows.append(row)
        print(row, flush=True)
    report[f"torch DDP LeNet to {TARGET} held-out, {conditions}: edgetrain vs torchrun by hand"] = "; ".join(rows)
    assert cluster.leftovers() == {}
