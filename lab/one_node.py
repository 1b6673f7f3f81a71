"""One node, edgetrain against the seed recipe, side by side: ``python -m lab.one_node``.

Both train LeNet at batch 64 on one rank of this machine (host runtime), interleaved, inside one
cgroup with an emulated Pi 4's calibrated quota (``--rate 250``) or with this machine's whole CPU
(``--rate full``); each prints its last epoch's training img/s (validation excluded in both). Extra
arguments after ``--`` go to ``edgetrain run`` (e.g. a tuning option).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from edgetrain.shared import runs

from .comm_core import comm_group, moving
from .cpugroup import CpuGroup
from .emulation import ROOT, SEED, calibrate
from .testbed import DEFAULT_ROOT


def _in_group(group: CpuGroup | None, cmd: list[str]) -> list[str]:
    return cmd if group is None else group.command(cmd)


def seed(group: CpuGroup | None, steps: int, epochs: int) -> float:
    out = subprocess.run(_in_group(group, [sys.executable, str(SEED), "--epochs", str(epochs), "--steps-per-epoch", str(steps)]),
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith('{"event": "epoch"')][-1]["images_per_sec"]


def edgetrain(group: CpuGroup | None, steps: int, epochs: int, runs_dir: Path, extra: list[str]) -> float:
    subprocess.run(_in_group(group, [sys.executable, "-m", "edgetrain", "run", "lenet", "--np", "1", "--epochs", str(epochs),
                                     "--max-steps", str(steps), "--runs-dir", str(runs_dir), *extra]),
                   cwd=ROOT, capture_output=True, text=True, check=True)
    return runs.all_runs(runs_dir)[-1].metrics()[-1]["images_per_sec"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.one_node", description=__doc__)
    p.add_argument("--rate", default="250", help="the emulated Pi's img/s (calibrated), or 'full' for no quota")
    p.add_argument("--pairs", type=int, default=3)
    p.add_argument("--steps", type=int, default=150, help="training steps an epoch")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--comm", choices=("pi-core", "shared"), default="pi-core",
                   help="the Horovod threads on a Pi core of their own, as on the testbed (comm_core.py), or in the quota")
    p.add_argument("extra", nargs="*", help="options for edgetrain run (after --)")
    args = p.parse_args(argv)
    group = None
    rows = []
    with contextlib.ExitStack() as stack:
        if args.rate != "full":
            pi = calibrate(float(args.rate), "edgetrain-calibration", cache=DEFAULT_ROOT / "calibration.json",
                           comm=args.comm == "pi-core", log=lambda line: print(line, file=sys.stderr))
            group = CpuGroup.mine("edgetrain-one-node")
            group.create()
            stack.callback(group.remove)
            group.limit(pi.quota_us, pi.period_us)
            if pi.comm_quota_us:
                stack.enter_context(moving([group]))
                comm_group(group).limit(pi.comm_quota_us, pi.period_us)
        with tempfile.TemporaryDirectory(prefix="edgetrain-one-node-") as tmp:
            for i in range(args.pairs):
                row = {"pair": i + 1, "rate": args.rate,
                       "edgetrain": round(edgetrain(group, args.steps, args.epochs, Path(tmp), args.extra), 1),
                       "seed": round(seed(group, args.steps, args.epochs), 1)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    e, s = statistics.median(r["edgetrain"] for r in rows), statistics.median(r["seed"] for r in rows)
    print(json.dumps({"median_edgetrain": e, "median_seed": s, "ratio": round(e / s, 3), "extra": args.extra}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
