"""Two torches on one emulated Pi 4, interleaved: ``python -m lab.torch_versions``.

The DDP LeNet example (examples/torch_ddp/train.py, batch 64, Gloo, one rank as torchrun would
start it) trains under each Python named with ``--python`` in turn, in one cgroup with the
calibrated quota of an emulated Pi 4 (the pessimistic bracket: everything the node runs, Gloo's
threads too, in that one quota), the order alternating from pair to pair so the machine's drift
falls on each alike. Each prints its second epoch's training img/s as the example reports it.
An interpreter given as ``PYTHON@N`` runs with OMP_NUM_THREADS=N; as ``PYTHON`` alone, with
torch's own thread default, as edgetrain's launch leaves one rank a node.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import signal
import socket
import statistics
import subprocess
import sys
import tempfile

from edgetrain.shared import datasets

from .cpugroup import CpuGroup
from .emulation import ROOT, calibrate
from .testbed import DEFAULT_ROOT

SCRIPT = ROOT / "examples" / "torch_ddp" / "train.py"
EPOCH = re.compile(r"epoch (\d+)/\d+: loss [\d.]+, ([\d,]+) img/s on 1 ranks")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(arm: str) -> tuple[str, dict[str, str]]:
    python, _, threads = arm.partition("@")
    return python, {"PATH": "/usr/bin:/bin", **({"OMP_NUM_THREADS": threads} if threads else {})}


def version(arm: str) -> str:
    python, env = _env(arm)
    return subprocess.run([python, "-c", "import torch; print(f'torch {torch.__version__}, {torch.get_num_threads()} threads')"],
                          env=env, capture_output=True, text=True, check=True).stdout.strip()


def train(group: CpuGroup, arm: str, script: str, steps: int, epochs: int) -> float:
    python, env = _env(arm)
    env.update({"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port())})
    data = datasets.locate("mnist").paths[0].parent
    with tempfile.TemporaryDirectory(prefix="edgetrain-torch-versions-") as cwd:  # the weights it saves go with it
        out = subprocess.run(group.command([python, script, "--epochs", str(epochs), "--steps-per-epoch", str(steps),
                                            "--data", str(data)]),
                             env=env, cwd=cwd, capture_output=True, text=True, check=True).stdout
    rates = [float(m.group(2).replace(",", "")) for m in EPOCH.finditer(out)]
    if len(rates) != epochs:
        raise RuntimeError(f"{python}: expected {epochs} epoch lines, got:\n{out}")
    return rates[-1]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.torch_versions", description=__doc__)
    p.add_argument("--python", action="append", required=True, help="an interpreter with torch, PYTHON or PYTHON@THREADS (give two or more)")
    p.add_argument("--rate", type=float, default=250.0, help="the emulated Pi's img/s (the seed LeNet, calibrated)")
    p.add_argument("--pairs", type=int, default=4)
    p.add_argument("--steps", type=int, default=100, help="training steps an epoch")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--script", default=str(SCRIPT), help="the script trained (torch 1.13 needs its backend named)")
    args = p.parse_args(argv)
    names = {py: version(py) for py in args.python}
    print(json.dumps({"torch": names}), flush=True)
    rows: dict[str, list[float]] = {py: [] for py in args.python}
    # A measurement stopped with SIGTERM still ends its processes and removes its group.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with contextlib.ExitStack() as stack:
        pi = calibrate(args.rate, "edgetrain-calibration", cache=DEFAULT_ROOT / "calibration.json", comm=False,
                       log=lambda line: print(line, file=sys.stderr))
        group = CpuGroup.mine("edgetrain-torch-versions")
        group.create()
        stack.callback(group.remove)
        stack.callback(group.kill)
        group.limit(pi.quota_us, pi.period_us)
        print(json.dumps({"quota_us": pi.quota_us, "period_us": pi.period_us}), flush=True)
        for i in range(args.pairs):
            order = args.python if i % 2 == 0 else list(reversed(args.python))
            for py in order:
                rows[py].append(train(group, py, args.script, args.steps, args.epochs))
            print(json.dumps({"pair": i + 1, **{names[py]: rows[py][-1] for py in args.python}}), flush=True)
    medians = {names[py]: statistics.median(r) for py, r in rows.items()}
    first = args.python[0]
    print(json.dumps({"median_img_s": medians,
                      "ratios_per_pair": {names[py]: [round(a / b, 3) for a, b in zip(rows[py], rows[first], strict=True)] for py in args.python[1:]}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
