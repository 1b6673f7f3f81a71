"""Benchmarks of container runs on a cluster: ``python -m edgetrain.bench -i INVENTORY``.

For each --np: ``edgetrain run`` (preflight, containers, MPI probe, training) timed from the call
to the first training step, and the same job started by a bare ``mpirun`` inside containers that
are already up, timed the same way. The difference is what edgetrain's checks cost; images/s
come from the runs' own metrics.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from . import containers, inventory, placement, preflight, progress, runs
from . import program as programs
from .program import JobOptions
from .remote import Nodes


def edgetrain_run(inv: Path, job: str, np: int, max_steps: int, runs_dir: Path) -> dict:
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "edgetrain", "run", job, "--np", str(np), "-i", str(inv),
                           "--epochs", "1", "--max-steps", str(max_steps), "--runs-dir", str(runs_dir)],
                          capture_output=True, text=True)
    total = time.monotonic() - start
    if proc.returncode != 0:
        raise SystemExit(f"edgetrain run --np {np} failed:\n{proc.stderr}")
    run_id = next(line.split()[1].rstrip(":") for line in proc.stdout.splitlines() if line.startswith("run "))
    info = runs.find(runs_dir, run_id).info()
    metrics = runs.find(runs_dir, run_id).metrics()[-1]
    return {"first_step_s": info["attempts"][-1]["first_step_s"], "total_s": round(total, 1),
            "images_per_sec": round(metrics["images_per_sec"], 1), "run": run_id}


def bare_mpirun(inv: Path, job: str, np: int, max_steps: int) -> float:
    """Seconds from ``mpirun`` (in already running containers) to the job's first training step."""
    program = programs.resolve(job, [], JobOptions(epochs=1, max_steps=max_steps))
    loaded = inventory.load(inv)
    plan = placement.plan(loaded, np)
    with Nodes() as nodes:
        reports = preflight.check_nodes(nodes, plan, program.datasets, loaded.source)
        preflight.require(reports)
        tag = f"bench-{int(time.time())}"
        dirs = {r.host.name: f"{r.runs_dir}/.{tag}" for r in reports}
        running = containers.Containers(nodes, plan, tag, dirs)
        running.start()
        try:
            worker = [containers.PYTHON, "-m", "edgetrain.worker", "--run-dir", containers.RUN_MOUNT,
                      "--data", containers.DATA_MOUNT, "--job-name", program.name, *program.worker_args()]
            start = time.monotonic()
            proc = subprocess.Popen(running.mpirun(worker), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            assert proc.stdout is not None
            for line in proc.stdout:
                event = progress.parse(line)
                if event and event["event"] == "step":
                    return time.monotonic() - start
            raise SystemExit(f"bare mpirun --np {np} ended without a training step")
        finally:
            running.remove()
            for r in reports:
                nodes.run(r.host, ["rm", "-rf", dirs[r.host.name]])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m edgetrain.bench", description=__doc__)
    p.add_argument("-i", "--inventory", type=Path, required=True)
    p.add_argument("--job", default="lenet")
    p.add_argument("--np", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--max-steps", type=int, default=100, help="training steps per run")
    p.add_argument("--runs-dir", type=Path, default=Path("runs"))
    args = p.parse_args(argv)
    for np in args.np:
        row = edgetrain_run(args.inventory, args.job, np, args.max_steps, args.runs_dir)
        row["bare_mpirun_first_step_s"] = round(bare_mpirun(args.inventory, args.job, np, args.max_steps), 1)
        print(json.dumps({"np": np, **row}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
