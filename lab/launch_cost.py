"""Benchmarks of what edgetrain's launch costs.

``python -m lab.launch_cost -i INVENTORY``: for each --np, ``edgetrain run`` of a built-in job
(preflight, containers, training) timed from the call to the first training step, and
the same job started by a bare ``mpirun`` inside containers that are already up, timed the same
way. The difference is what edgetrain's checks cost; images/s come from the runs' own metrics.

``python -m lab.launch_cost --script train.py --np 2 --repeat 3 -- ARGS``: a user's Keras script on
this machine, under ``edgetrain run`` and under a bare ``mpirun`` in a copy of its folder,
interleaved, each timed from the call to rank 0's first step (Keras' progress bar).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from edgetrain.controller import containers, inventory, placement, preflight, runtimes
from edgetrain.shared import datasets, mpi, progress, runs
from edgetrain.rank import worker
from edgetrain.controller import program as programs
from edgetrain.controller.program import JobOptions
from edgetrain.controller.remote import Nodes
from edgetrain.controller.strategies import STRATEGIES
from edgetrain.shared.strategies import DEFAULT


def edgetrain_run(inv: Path, job: str, np: int, max_steps: int, runs_dir: Path) -> dict:
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "edgetrain", "run", job, "--np", str(np), "-i", str(inv),
                           "--epochs", "1", "--max-steps", str(max_steps), "--runs-dir", str(runs_dir)],
                          capture_output=True, text=True, check=False)
    total = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit(f"edgetrain run --np {np} failed:\n{proc.stderr}")
    run_id = next(line.split()[1].rstrip(":") for line in proc.stdout.splitlines() if line.startswith("run "))
    attempt = runs.find(runs_dir, run_id).record().attempts[-1]
    metrics = runs.find(runs_dir, run_id).metrics()[-1]
    return {"first_step_s": attempt.first_step_s, "total_s": round(total, 1),
            "images_per_sec": round(metrics["images_per_sec"], 1), "run": run_id}


def bare_mpirun(inv: Path, job: str, np: int, max_steps: int) -> float:
    """Seconds from ``mpirun`` (in already running containers) to the job's first training step."""
    program = programs.resolve(job, [], JobOptions(epochs=1, max_steps=max_steps))
    loaded = inventory.load(inv)
    plan = placement.plan(loaded, np)
    with Nodes() as nodes:
        reports = preflight.check_nodes(nodes, plan, program.datasets, loaded.source)
        strategy = STRATEGIES[DEFAULT]  # what the worker below runs
        preflight.require(reports, strategy.needs, strategy.loads)
        tag = f"bench-{int(time.time())}"
        dirs = {r.host.name: f"{r.runs_dir}/.{tag}" for r in reports}
        running = containers.Containers(nodes, plan, tag, dirs)
        running.start()
        try:
            token = progress.new_token()
            # edgetrain's own worker command, as its launch builds it for a run in containers.
            worker = runtimes.worker_command(containers.PYTHON, runtimes.IN_CONTAINER, strategy, program, token,
                                             strategy.worker_args(plan, strategy.default_port))
            start = time.monotonic()
            proc = subprocess.Popen(running.mpirun(worker), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            assert proc.stdout is not None
            for line in proc.stdout:
                if any(isinstance(e, dict) and e["event"] == "step" for e in progress.parse(line, token)):
                    return time.monotonic() - start
            raise SystemExit(f"bare mpirun --np {np} ended without a training step")
        finally:
            running.remove()
            for r in reports:
                nodes.run(r.host, ["rm", "-rf", dirs[r.host.name]])


def _first_keras_step(cmd: list[str], cwd: Path, env: dict) -> tuple[float, int]:
    """Seconds from starting ``cmd`` to the first Keras progress line of rank 0, and its exit code."""
    start = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, errors="replace")
    assert proc.stdout is not None
    first = None
    for line in proc.stdout:
        if first is None and any(isinstance(e, dict) and e["event"] == "keras" for e in progress.parse(line, None)):
            first = time.monotonic() - start
    code = proc.wait()
    if first is None:
        raise SystemExit(f"{shlex.join(cmd)} showed no training step (exit {code})")
    return first, code


def script_first_step(script: Path, np: int, args: list[str], repeat: int) -> list[dict]:
    """A user script under ``edgetrain run`` and under a bare ``mpirun``, interleaved."""
    rows = []
    with tempfile.TemporaryDirectory(prefix="edgetrain-bench-") as tmp:
        home, runs_dir, copy = Path(tmp) / "home", Path(tmp) / "runs", Path(tmp) / "project"
        shutil.copytree(script.parent, copy)
        data = Path(tmp) / "data"
        for name in datasets.DATASETS:
            found = datasets.locate(name)
            (data / name).mkdir(parents=True)
            for p in found.paths:
                (data / name / p.name).symlink_to(p.resolve())
        worker.link_datasets(data, home / ".keras")
        bare_env = {**os.environ, "HOME": str(home), "TF_CPP_MIN_LOG_LEVEL": "1"}
        for i in range(repeat):
            # edgetrain draws Keras' bar itself; it records when the first step came, counted from the
            # start of its launch (after the CLI's own imports, about a second).
            subprocess.run([sys.executable, "-m", "edgetrain", "run", str(script), "--np", str(np), "--runs-dir", str(runs_dir),
                            "--", *args], stdin=subprocess.DEVNULL, capture_output=True, check=True)
            edge = runs.all_runs(runs_dir)[-1].record().attempts[-1].first_step_s

            bare, _ = _first_keras_step([mpi.mpirun_path(), "-n", str(np), sys.executable, str(copy / script.name), *args],
                                        copy, bare_env)
            rows.append({"try": i + 1, "np": np, "edgetrain_run_s": round(edge, 1) if edge is not None else None, "bare_mpirun_s": round(bare, 1)})
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.launch_cost", description=__doc__)
    p.add_argument("-i", "--inventory", type=Path)
    p.add_argument("--script", type=Path, help="time a user's Keras script on this machine instead")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("args", nargs="*", help="the script's arguments (after --)")
    p.add_argument("--job", default="lenet")
    p.add_argument("--np", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--max-steps", type=int, default=100, help="training steps per run")
    p.add_argument("--runs-dir", type=Path, default=Path("runs"))
    args = p.parse_args(argv)
    if args.script is not None:
        for np in args.np:
            for row in script_first_step(args.script, np, args.args, args.repeat):
                print(json.dumps(row), flush=True)
        return 0
    if args.inventory is None:
        p.error("give -i INVENTORY (a container cluster) or --script")
    for np in args.np:
        row = edgetrain_run(args.inventory, args.job, np, args.max_steps, args.runs_dir)
        row["bare_mpirun_first_step_s"] = round(bare_mpirun(args.inventory, args.job, np, args.max_steps), 1)
        print(json.dumps({"np": np, **row}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
