"""Time to accuracy, edgetrain's LeNet against the seed recipe, interleaved on one cluster:
``python -m lab.seed_compare -i INVENTORY --nodes 1,3``.

One rank per node: both inventories are read through a copy whose every ``edgetrain_slots`` is 1
(a testbed's inventory gives its head node two). The seed script runs unchanged as
a user script (``edgetrain run seed_lenet.py``: the same mpirun in the same containers; its clock
starts at its own first step, so the launcher is not in its figure) and stops after the epoch
whose validation reaches the target; ``edgetrain run lenet`` runs at its defaults with the target,
evaluating four times an epoch. Both times count every evaluation.

A user script gets what edgetrain gives every launch on several CPU nodes (Gloo, a long Horovod
cycle); ``--seed-inventory`` runs the seed with another inventory, e.g. one whose
``edgetrain_mpi_env`` is Horovod's own defaults, as plain mpirun would give it
(``{HOROVOD_CONTROLLER: mpi, HOROVOD_CPU_OPERATIONS: mpi, HOROVOD_CYCLE_TIME: 1}``).

``--own``: the seed's own script instead (batch 32, ``steps_per_epoch=500`` on every rank, no
validation), on the training set less ``--holdout``, against ``edgetrain run lenet --holdout``, both
to ``--target`` on the held-out split, and the ratio split in three: the system (img/s, the seed's
Horovod settings and edgetrain's; the seed's under ``--seed-inventory`` from a short run, and its
time there derived from it), the evaluation cadence (the seed's script has none: it is judged off
its clock, and where a once-an-epoch check would first have seen the target is set against the
finer grid edgetrain evaluates on), and what is left, the schedule with the batch and edgetrain's
evaluations, which are on its clock. One line of JSON per run, then the split.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

from edgetrain.controller.bench import model, runner
from edgetrain.shared import datasets, runs
from edgetrain.controller.program import JobOptions

from .emulation import ROOT, SEED


def one_slot(inventory: str) -> str:
    """A copy of the inventory with one slot on every host, so N ranks land on N nodes."""
    def walk(node):
        if isinstance(node, dict):
            return {k: 1 if k == "edgetrain_slots" else walk(v) for k, v in node.items()}
        return node
    out = Path(tempfile.mkdtemp(prefix="seed-compare-")) / Path(inventory).name
    out.write_text(yaml.safe_dump(walk(yaml.safe_load(Path(inventory).read_text()))))
    return str(out)


def _edgetrain(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "edgetrain", *args], cwd=ROOT, capture_output=True, text=True, timeout=7200, check=False)


def seed(inv: str, n: int, target: float, epochs: int, runs_dir: str) -> dict:
    epochs_seen = [e for e in _seed_run(inv, n, runs_dir, ["--epochs", str(epochs), "--stop-at-accuracy", str(target)])
                   if e["event"] == "epoch"]
    hit = next((e for e in epochs_seen if e["val_accuracy"] >= target), None)
    return {"who": "seed", "nodes": n, "images_per_sec": round(epochs_seen[-1]["images_per_sec"], 1),
            "seconds_to_target": round(hit["seconds_from_first_step"], 1) if hit else None,
            "epochs": len(epochs_seen), "val_accuracy": [round(e["val_accuracy"], 4) for e in epochs_seen]}


def edgetrain(inv: str, n: int, target: float, epochs: int, runs_dir: str, extra: list[str], holdout: int | None = None) -> dict:
    # Four times an epoch on bench's grid: a quarter that is not a multiple of the steps per execution
    # would lower them to the common divisor (a quarter of 78 steps ran 2 steps per call, not 8).
    every = model.evaluation_interval(datasets.trained_on("mnist", holdout) // n // 64, JobOptions().steps_per_execution)
    r = _edgetrain("run", "lenet", "--np", str(n), "-i", inv, "--epochs", str(epochs), "--target-accuracy", str(target),
                   "--eval-every", str(every), "--runs-dir", runs_dir, *(["--holdout", str(holdout)] if holdout else []), *extra)
    if r.returncode != 0:
        raise SystemExit(f"edgetrain on {n} nodes failed:\n{r.stderr[-2000:]}")
    run = runs.all_runs(Path(runs_dir))[-1]
    hit = runs.first_reaching(run, target)
    return {"who": "edgetrain", "nodes": n, "images_per_sec": round(runner.steady_rate(run) or 0, 1),
            "seconds_to_target": round(hit["seconds"], 1) if hit else None, "images_to_target": hit and hit.get("images"),
            "run": run.id, "extra": extra}


OWN_BATCH, OWN_STEPS = 32, 500  # the seed's own script: Keras' default batch, steps_per_epoch=500 on every rank


def _own_args(steps: int = OWN_STEPS) -> list[str]:
    return ["--batch", str(OWN_BATCH), "--rank-steps", str(steps)]


def _seed_run(inv: str, n: int, runs_dir: str, args: list[str]) -> list[dict]:
    # The seed prints once an epoch, and an epoch of MPI polling on throttled nodes outlasts the
    # default no-output limit: a quiet epoch is not a hang here.
    r = _edgetrain("run", str(SEED), "--np", str(n), "-i", inv, "--dataset", "mnist", "--runs-dir", runs_dir,
                   "--hang-timeout", "3600", "--", *args)
    if r.returncode != 0:
        raise SystemExit(f"seed on {n} nodes failed:\n{r.stderr[-2000:]}")
    return [json.loads(line) for line in r.stdout.splitlines() if line.startswith('{"event": ')]


def own(inv: str, n: int, target: float, epochs: int, runs_dir: str, holdout: int) -> dict:
    """The seed's own script to the target on the held-out split, judged off its clock on the grid
    edgetrain evaluates on (a quarter of its epoch) and at each of its own epochs' ends, for at most
    the images of edgetrain's ``epochs``."""
    examples = datasets.trained_on("mnist", holdout)
    every = max(1, examples // 4 // (OWN_BATCH * n))
    its_epochs = -(-epochs * examples // (OWN_STEPS * OWN_BATCH * n))
    events = _seed_run(inv, n, runs_dir, [*_own_args(), "--holdout", str(holdout), "--judge-every", str(every),
                                          "--epochs", str(its_epochs), "--stop-at-accuracy", str(target)])
    judged = [e for e in events if e["event"] == "judged"]
    epochs_seen = [e for e in events if e["event"] == "epoch"]

    def first(rows: list[dict]) -> dict | None:
        return next((e for e in rows if e["held_out_accuracy"] >= target), None)
    fine, at_epoch_end = first(judged), first([e for e in judged if e["epoch_end"]])
    return {"who": "seed's own script", "nodes": n, "images_per_sec": round(_steady(epochs_seen), 1),
            "seconds_to_target_fine": fine and round(fine["seconds_from_first_step"], 1),
            "images_to_target_fine": fine and fine["images"],
            "seconds_to_target_epoch_end": at_epoch_end and round(at_epoch_end["seconds_from_first_step"], 1),
            "images_to_target_epoch_end": at_epoch_end and at_epoch_end["images"], "epochs": len(epochs_seen),
            "held_out_accuracy": [round(e["held_out_accuracy"], 4) for e in judged]}


def own_rate(inv: str, n: int, runs_dir: str, holdout: int, epochs: int = 3, steps: int = 100) -> dict:
    """The seed's own script's img/s alone, from a short run (its first epoch is the warm-up)."""
    events = _seed_run(inv, n, runs_dir, [*_own_args(steps), "--epochs", str(epochs), "--holdout", str(holdout)])
    return {"who": "seed's own script, --seed-inventory", "nodes": n,
            "images_per_sec": round(_steady([e for e in events if e["event"] == "epoch"]), 1), "rank_steps": steps}


def _steady(epochs: list[dict]) -> float:
    later = epochs[1:] or epochs
    return sum(e["images_per_sec"] for e in later) / len(later)


def split(edge: dict, seed_own: dict, seed_settings: dict | None) -> dict:
    """The seed's time to the target over edgetrain's, as the product of its factors (a missed
    target leaves the factors it needs unset)."""
    system = edge["images_per_sec"] / seed_own["images_per_sec"]
    out: dict = {"nodes": edge["nodes"], "recipe_img_s": round(system, 3)}
    if seed_settings:
        out["horovod_settings_img_s"] = round(seed_own["images_per_sec"] / seed_settings["images_per_sec"], 3)
    t_edge, fine, coarse = edge["seconds_to_target"], seed_own["seconds_to_target_fine"], seed_own["seconds_to_target_epoch_end"]
    if fine:
        out["cadence"] = coarse and round(coarse / fine, 3)
        out["schedule_and_rest"] = t_edge and round(fine / t_edge / system, 3)
    if coarse and t_edge:
        out["total_same_settings"] = round(coarse / t_edge, 3)
        if seed_settings:
            out["total_derived"] = round(out["total_same_settings"] * out["horovod_settings_img_s"], 3)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.seed_compare", description=__doc__)
    p.add_argument("-i", "--inventory", required=True)
    p.add_argument("--seed-inventory", help="the seed's inventory (default: --inventory)")
    p.add_argument("--nodes", default="1,3")
    p.add_argument("--target", type=float, default=0.985)
    p.add_argument("--epochs", type=int, default=6, help="at most")
    p.add_argument("--repeat", type=int, default=1)
    p.add_argument("--runs-dir", default="runs")
    p.add_argument("--own", action="store_true", help="the seed's own script, on a held-out split, the ratio split")
    p.add_argument("--holdout", type=int, default=6000, help="with --own: the split both are judged on")
    p.add_argument("extra", nargs="*", help="options for edgetrain run lenet (after --)")
    args = p.parse_args(argv)
    args.inventory = one_slot(args.inventory)
    args.seed_inventory = args.seed_inventory and one_slot(args.seed_inventory)
    for _ in range(args.repeat):
        for n in map(int, args.nodes.split(",")):
            if args.own:
                rows = (edgetrain(args.inventory, n, args.target, args.epochs, args.runs_dir, args.extra, args.holdout),
                        own(args.inventory, n, args.target, args.epochs, args.runs_dir, args.holdout),
                        own_rate(args.seed_inventory, n, args.runs_dir, args.holdout) if args.seed_inventory else None)
                for row in filter(None, rows):
                    print(json.dumps(row), flush=True)
                print(json.dumps({"split": split(*rows)}), flush=True)
                continue
            print(json.dumps(edgetrain(args.inventory, n, args.target, args.epochs, args.runs_dir, args.extra)), flush=True)
            print(json.dumps(seed(args.seed_inventory or args.inventory, n, args.target, args.epochs, args.runs_dir)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
