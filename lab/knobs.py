"""A communication setting against the default, interleaved: ``python -m lab.knobs``.

``python -m lab.knobs -i INVENTORY --np 3 --set HOROVOD_CYCLE_TIME=5,10,20 --repeat 2 -- --epochs 1 --max-steps 200``:
for each try, ``edgetrain run lenet`` once for every value, in turn (values interleaved, so each try
shares this machine's hour), on a copy of the inventory whose ``edgetrain_mpi_env`` sets the
variable to that value - the way a user would set it. Per value, the median steady img/s
(edgetrain.controller.bench.runner.steady_rate) and images per CPU-second over every rank's process
(cpu_rate: where communicating costs a node CPU, it falls). ``--reference`` adds a one-node run
per try, for E(N). The figures, with every run's id, go to ``knobs.json`` in the runs
directory's newest ``*-knobs`` folder.

A NAME that begins with ``-`` is the script's own option instead, given after edgetrain run's
``--``: ``--job examples/torch_ddp/train.py --set=--bucket-cap-mb=1,5,25 -- --strategy torch --
--epochs 2``. A script that records no evaluations (edgetrain.ddp's Progress does) is read by
the last ``N img/s`` its rank 0 printed, its last epoch's as the DDP example prints it.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
from pathlib import Path

import yaml

from edgetrain.controller.bench.runner import cpu_rate, steady_rate
from edgetrain.shared import runs


def with_env(text: str, name: str, value: str) -> str:
    """The inventory with ``name=value`` in every ``edgetrain_mpi_env`` it sets (in the top group's vars if none)."""
    inv = yaml.safe_load(text)
    found = []

    def walk(node):
        if isinstance(node, dict):
            for k, v in node.items():
                if k == "edgetrain_mpi_env" and isinstance(v, dict):
                    found.append(v)
                else:
                    walk(v)

    walk(inv)
    if not found:
        found.append(inv["all"].setdefault("vars", {}).setdefault("edgetrain_mpi_env", {}))
    for env in found:
        env[name] = value
    return yaml.safe_dump(inv, sort_keys=False)


def with_option(args: list[str], name: str, value: str) -> list[str]:
    """edgetrain run's arguments with ``name value`` last among the script's (after its ``--``)."""
    return [*args, *([] if "--" in args else ["--"]), name, value]


def logged_rate(run: runs.Run) -> float | None:
    """The last ``N img/s`` rank 0 printed."""
    log = run.log(0)
    found = re.findall(r"([\d,.]+) img/s", log.read_text(errors="replace")) if log.exists() else []
    return float(found[-1].replace(",", "")) if found else None


def one_run(inventory: Path, job: str, np: int, args: list[str], root: Path) -> dict:
    before = {p.name for p in root.iterdir()} if root.exists() else set()
    proc = subprocess.run([sys.executable, "-m", "edgetrain", "run", job, "--np", str(np), "-i", str(inventory),
                           "--runs-dir", str(root), *args], capture_output=True, text=True, check=False)
    new = sorted(p for p in root.iterdir() if p.name not in before and runs.Run(p).info_file.exists())
    if proc.returncode != 0 or not new:
        raise SystemExit(f"edgetrain run failed ({proc.returncode}): {proc.stderr.strip()[-2000:]}")
    run = runs.Run(new[-1])
    rate = steady_rate(run) or logged_rate(run)
    return {"run": run.id, "np": np, "images_per_sec": rate, "images_per_cpu_second": cpu_rate(run)}


def _median(values: list[float | None]) -> float | None:
    got = [v for v in values if v is not None]
    return statistics.median(got) if got else None


def _figure(value: float | None) -> str:
    """A measured figure, or "-" where the run gave none (it failed, or kept no CPU time)."""
    return f"{value:,.0f}" if value else "-"


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m lab.knobs", description=__doc__.splitlines()[0])
    p.add_argument("-i", "--inventory", type=Path, required=True)
    p.add_argument("--job", default="lenet")
    p.add_argument("--np", type=int, required=True, help="ranks, one a node")
    p.add_argument("--set", required=True, metavar="NAME=V1,V2,..", help="the rank environment variable and its values")
    p.add_argument("--reference", action="store_true", help="also one node's run per try, for E(N)")
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--runs-dir", type=Path, default=runs.default_root())
    p.add_argument("args", nargs="*", help="after --: edgetrain run's job options, the same for every run")
    a = p.parse_args()
    name, _, values = a.set.partition("=")
    values = [v for v in values.split(",") if v]
    if not name or not values:
        raise SystemExit("--set NAME=V1,V2,.. names a variable and at least one value")
    out = a.runs_dir / runs.new_id(f"knobs-{name.lower().lstrip('-')}")
    out.mkdir(parents=True)
    text = a.inventory.read_text()
    inventories, options = {}, {}
    for v in values:
        if name.startswith("-"):
            inventories[v], options[v] = a.inventory, with_option(a.args, name, v)
        else:
            inventories[v], options[v] = out / f"inventory-{v}.yml", a.args
            inventories[v].write_text(with_env(text, name, v))
    tries: list[dict] = []
    for attempt in range(1, a.repeat + 1):
        if a.reference:
            tries.append({**one_run(a.inventory, a.job, 1, a.args, a.runs_dir), "value": None, "try": attempt})
            print(f"try {attempt}: 1 node {_figure(tries[-1]['images_per_sec'])} img/s", flush=True)
        for v in values:
            tries.append({**one_run(inventories[v], a.job, a.np, options[v], a.runs_dir), "value": v, "try": attempt})
            print(f"try {attempt}: {name}={v} {_figure(tries[-1]['images_per_sec'])} img/s, "
                  f"{_figure(tries[-1]['images_per_cpu_second'])} img/CPU-s  ({tries[-1]['run']})", flush=True)
            (out / "knobs.json").write_text(json.dumps({"set": name, "np": a.np, "args": a.args, "tries": tries}, indent=2) + "\n")
    one = _median([t["images_per_sec"] for t in tries if t["value"] is None])
    print(f"| {name} | tries | img/s at {a.np} nodes, median (range) | E({a.np}) | img/CPU-s |\n|---|---|---|---|---|")
    for v in values:
        at = [t for t in tries if t["value"] == v]
        ips = sorted(t["images_per_sec"] for t in at if t["images_per_sec"])
        med = statistics.median(ips) if ips else None
        cpu = _median([t["images_per_cpu_second"] for t in at])
        print(f"| {v} | {len(at)} | " + (f"{med:,.0f} ({ips[0]:,.0f}-{ips[-1]:,.0f})" if ips else "-") + " | "
              + (f"{med / (a.np * one):.0%}" if med and one else "-") + f" | {_figure(cpu)} |")
    print(f"kept: {out / 'knobs.json'}")


if __name__ == "__main__":
    main()
