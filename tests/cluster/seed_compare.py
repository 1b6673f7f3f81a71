"""Time to accuracy, edgetrain's LeNet against the seed recipe, interleaved on one cluster:
``python -m tests.cluster.seed_compare -i INVENTORY --nodes 1,3``.

The inventory must give each node one slot (one rank per node). The seed script runs unchanged as
a user script (``edgetrain run seed_lenet.py``: the same mpirun in the same containers; its clock
starts at its own first step, so the launcher is not in its figure) and stops after the epoch
whose validation reaches the target; ``edgetrain run lenet`` runs at its defaults with the target,
evaluating four times an epoch. Both times count every evaluation.

A user script gets what edgetrain gives every launch on several CPU nodes (Gloo, a long Horovod
cycle); ``--seed-inventory`` runs the seed with another inventory, e.g. one whose
``edgetrain_mpi_env`` is Horovod's own defaults, as plain mpirun would give it
(``{HOROVOD_CONTROLLER: mpi, HOROVOD_CPU_OPERATIONS: mpi, HOROVOD_CYCLE_TIME: 1}``).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from edgetrain.controller import bench
from edgetrain.shared import runs
from edgetrain.controller.program import JobOptions

from .emulation import ROOT, SEED


def _edgetrain(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgetrain", *args], cwd=ROOT, capture_output=True, text=True, timeout=7200)


def seed(inv: str, n: int, target: float, epochs: int, runs_dir: str) -> dict:
    # The seed prints once an epoch, and an epoch of MPI polling on throttled nodes outlasts the
    # default no-output limit: a quiet epoch is not a hang here.
    r = _edgetrain("run", str(SEED), "--np", str(n), "-i", inv, "--dataset", "mnist", "--runs-dir", runs_dir,
                   "--hang-timeout", "3600", "--", "--epochs", str(epochs), "--stop-at-accuracy", str(target))
    if r.returncode != 0:
        raise SystemExit(f"seed on {n} nodes failed:\n{r.stderr[-2000:]}")
    epochs_seen = [json.loads(line) for line in r.stdout.splitlines() if line.startswith('{"event": "epoch"')]
    hit = next((e for e in epochs_seen if e["val_accuracy"] >= target), None)
    return {"who": "seed", "nodes": n, "images_per_sec": round(epochs_seen[-1]["images_per_sec"], 1),
            "seconds_to_target": round(hit["seconds_from_first_step"], 1) if hit else None,
            "epochs": len(epochs_seen), "val_accuracy": [round(e["val_accuracy"], 4) for e in epochs_seen]}


def edgetrain(inv: str, n: int, target: float, epochs: int, runs_dir: str, extra: list[str]) -> dict:
    # Four times an epoch on bench's grid: a quarter that is not a multiple of the steps per execution
    # would lower them to the common divisor (a quarter of 78 steps ran 2 steps per call, not 8).
    every = bench.evaluation_interval(60_000 // n // 64, JobOptions().steps_per_execution)
    r = _edgetrain("run", "lenet", "--np", str(n), "-i", inv, "--epochs", str(epochs), "--target-accuracy", str(target),
                   "--eval-every", str(every), "--runs-dir", runs_dir, *extra)
    if r.returncode != 0:
        raise SystemExit(f"edgetrain on {n} nodes failed:\n{r.stderr[-2000:]}")
    run = runs.all_runs(Path(runs_dir))[-1]
    hit = next((e for e in run.evaluations() if e["val_accuracy"] >= target), None)
    return {"who": "edgetrain", "nodes": n, "images_per_sec": round(bench.steady_rate(run) or 0, 1),
            "seconds_to_target": round(hit["seconds"], 1) if hit else None, "images_to_target": hit and hit.get("images"),
            "run": run.id, "extra": extra}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.cluster.seed_compare", description=__doc__)
    p.add_argument("-i", "--inventory", required=True)
    p.add_argument("--seed-inventory", help="the seed's inventory (default: --inventory)")
    p.add_argument("--nodes", default="1,3")
    p.add_argument("--target", type=float, default=0.985)
    p.add_argument("--epochs", type=int, default=6, help="at most")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--runs-dir", default="runs")
    p.add_argument("extra", nargs="*", help="options for edgetrain run lenet (after --)")
    args = p.parse_args(argv)
    for _ in range(args.repeat):
        for n in map(int, args.nodes.split(",")):
            print(json.dumps(edgetrain(args.inventory, n, args.target, args.epochs, args.runs_dir, args.extra)), flush=True)
            print(json.dumps(seed(args.seed_inventory or args.inventory, n, args.target, args.epochs, args.runs_dir)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
