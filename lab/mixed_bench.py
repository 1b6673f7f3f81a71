"""The mixed-cluster benchmark (issue 82): a Pi 5 beside two Pi 4s, with equal batches and with
``--batch-by speed``, against the Pi 5 alone and against three Pi 4s, on the testbed:

    sudo .venv/bin/python -m lab mixed-bench ID -i INVENTORY --seeds 60,61,62 --out docs/benches/mixed
    .venv/bin/python -m lab.mixed_bench             # the table from the kept JSONs
    .venv/bin/python -m lab.headline                # writes it in docs/scaling.md, with the other kept tables

ID is a testbed of three nodes provisioned as a container cluster with its images distributed
(tests/cluster's ``cluster`` fixture; EDGETRAIN_TESTBED_KEEP=1 keeps one), INVENTORY its docker
inventory; tests/cluster/test_mixed.py's opt-in bench does all of it in one command.

Each seed is one sitting, under the pessimistic emulation (a node's training and communication in
one quota, calibrated alone, no stand-ins) on the testbed's links:

- each board's quota calibrated, or its cached quota checked, once;
- the four configurations (SETUPS), each the LeNet job to the target on the held-out split, in an
  order rotated by the seed (``schedule``), so that the machine's drift within a sitting does not
  always fall on the same one; the three Pi 4s re-emulate node1 as a Pi 4 for their run, and the
  Pi 5 comes back for the next;
- each node timed alone (a short run, ``--timing-steps``) the first time it emulates a board in the
  sitting, right before the first configuration that needs it: the sum of a configuration's nodes'
  rates alone is what its efficiency divides by, and these measured rates, not the testbed's
  declared ones, are the speeds ``--batch-by speed`` sizes the batches by (each host's
  ``edgetrain_speed`` in the run's inventory, so the run says "from the inventory's edgetrain_speed").

Each run's time to the target is ``runs.first_reaching``'s, its img/s bench's steady rate (between
the first and the last evaluation). One JSON per seed in ``--out``; ``table`` pools them per seed
pair (lab.pooled: the geometric mean of the ratios and its 95% interval) against the issue's targets.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from edgetrain.controller.bench import model, runner
from edgetrain.shared import runs
from edgetrain.shared.batches import BatchBy
from edgetrain.shared.datasets import HOLDOUT_SPLIT, trained_on
from edgetrain.shared.job_options import BY_NAME
from edgetrain.shared.jobs import JOBS

from . import pooled
from .emulation import MODELS, Emulation, calibrate
from .protocol import TUNING_SEEDS
from .testbed import DEFAULT_ROOT, Testbed

ROOT = Path(__file__).resolve().parents[1]
KEPT = ROOT / "docs" / "benches" / "mixed"
JOB = JOBS["lenet"]
SPE = BY_NAME["steps_per_execution"].default

PI5, PI4 = "pi5", "pi4"
MIXED, HOMOGENEOUS = (PI5, PI4, PI4), (PI4, PI4, PI4)


@dataclass(frozen=True)
class Setup:
    """One configuration: each node's board while it runs, and how many nodes train (the first ones, one rank each)."""

    name: str
    boards: tuple[str, ...]
    nodes: int
    batch_by: BatchBy = BatchBy.EQUAL


PI5_ALONE = Setup("pi5 alone", MIXED, 1)
EQUAL = Setup("pi5 + 2 pi4, equal batches", MIXED, 3)
BY_SPEED = Setup("pi5 + 2 pi4, --batch-by speed", MIXED, 3, BatchBy.SPEED)
PI4S = Setup("3 pi4", HOMOGENEOUS, 3)
SETUPS = (PI5_ALONE, EQUAL, BY_SPEED, PI4S)
BY_NAME_OF = {s.name: s for s in SETUPS}


def schedule(seed: int) -> tuple[Setup, ...]:
    """The sitting's order: SETUPS rotated by the seed, so that consecutive seeds put each one at
    every position once in four."""
    k = seed % len(SETUPS)
    return SETUPS[k:] + SETUPS[:k]


@dataclass(frozen=True)
class Options:
    target: float = 0.99
    epochs: int = 4  # at most
    holdout: int = 6000
    holdout_split: int = HOLDOUT_SPLIT
    max_steps: int | None = None  # per epoch: for a short try of the pipeline, not for a figure
    timing_steps: int = 96  # a node's rate alone: steps timed after a warm-up of a quarter of them


# ---- on the testbed -------------------------------------------------------------------------

def inventory_for(given: Path, out: Path, hosts: dict[str, dict]) -> str:
    """A copy of the testbed's docker inventory with only ``hosts`` (in their order, the first the
    head, which holds rank 0), one slot each, each with its vars updated."""
    inv = yaml.safe_load(given.read_text())
    groups = inv["all"]["children"]["cluster"]["children"]
    known = groups["rpi"]["hosts"]
    picked = {name: {**known[name], **extra, "edgetrain_slots": 1} for name, extra in hosts.items()}
    head = next(iter(picked))
    groups["head"]["hosts"] = {head: picked[head]}
    groups["rpi"]["hosts"] = picked
    out.write_text(yaml.safe_dump(inv, sort_keys=False))
    return str(out)


def edgetrain(*args: str) -> None:
    r = subprocess.run([sys.executable, "-m", "edgetrain", *args], cwd=ROOT, capture_output=True, text=True, timeout=7200, check=False)
    if r.returncode != 0:
        raise SystemExit(f"edgetrain {' '.join(args[:4])} ... failed:\n{r.stdout[-1500:]}\n{r.stderr[-1500:]}")


def newest(runs_dir: Path) -> runs.Run:
    return runs.all_runs(runs_dir)[-1]


def rescore(path: Path, runs_dir: Path) -> list[str]:
    """A kept sitting's times to the target read again from its runs by today's ``runs.reaches``, the
    sitting's own kept under ``rescored``; what changed, a line each."""
    record = json.loads(path.read_text())
    changed, before = [], {}
    for r in record["runs"]:
        now = asdict(runs.to_target(runs.Run(runs_dir / r["run"]), record["options"]["target"]))
        old = {k: r[k] for k in now}
        if now != old:
            before[r["setup"]] = old
            changed.append(f"{path.name}: {r['setup']}: {old['seconds_to_target']} -> {now['seconds_to_target']} s")
            r.update(now)
    if before:
        record["rescored"] = {"why": "runs.reaches: an accuracy a rounding below the target counts as there", "as_run": before}
        path.write_text(json.dumps(record, indent=1) + "\n")
    return changed


class Sitting:
    """One seed's four configurations on a recorded testbed, and the nodes' rates alone."""

    def __init__(self, bed: Testbed, inventory: Path, seed: int, options: Options, runs_dir: Path, log: Callable[[str], None] = print):
        self.bed, self.given, self.seed, self.o, self.runs_dir, self.log = bed, inventory, seed, options, runs_dir, log
        self.nodes = [n.name for n in bed.state.nodes]
        if len(self.nodes) != len(MIXED):
            raise SystemExit(f"testbed {bed.state.id} has {len(self.nodes)} nodes: the mixed bench needs {len(MIXED)}")
        self.scratch = Path(tempfile.mkdtemp(prefix=f"mixed-bench-{seed}-"))
        self.boards: dict[str, Emulation] = {}
        self.alone: dict[tuple[str, str], dict] = {}  # (node, board) -> its timing
        self.emulating: tuple[str, ...] | None = None

    def calibrate(self) -> None:
        for m in dict.fromkeys(MIXED + HOMOGENEOUS):
            self.boards[m] = calibrate(MODELS[m], "edgetrain-calibration", model=m, cache=DEFAULT_ROOT / "calibration.json", comm=False, neighbours=0,
                                       log=self.log)

    def emulate(self, boards: tuple[str, ...]) -> None:
        if boards != self.emulating:
            self.bed.emulate([self.boards[b] for b in boards])
            self.emulating = boards

    def _inventory(self, name: str, hosts: dict[str, dict]) -> str:
        return inventory_for(self.given, self.scratch / name, hosts)

    def time_alone(self, node: str, board: str) -> dict:
        """The node's img/s training alone for ``timing_steps`` after a warm-up: bench's steady rate,
        between evaluations a quarter of the steps apart (the first ends the warm-up)."""
        every = max(SPE, self.o.timing_steps // 4 // SPE * SPE)
        inv = self._inventory(f"{node}.yml", {node: {"edgetrain_model": board}})
        start = time.monotonic()
        edgetrain("run", JOB.name, "--np", "1", "-i", inv, "--epochs", "1", "--max-steps", str(every + self.o.timing_steps),
                  "--eval-every", str(every), "--eval-examples", str(10 * JOB.batch_size), "--seed", str(self.seed),
                  "--holdout", str(self.o.holdout), "--holdout-split", str(self.o.holdout_split), "--runs-dir", str(self.runs_dir))
        run = newest(self.runs_dir)
        found = {"node": node, "board": board, "images_per_sec": runner.steady_rate(run), "run": run.id,
                 "wall_seconds": round(time.monotonic() - start, 1)}
        self.log(f"  {node} alone as a {board}: {found['images_per_sec'] or 0:,.0f} img/s ({found['wall_seconds']:.0f} s, run {run.id})")
        return found

    def rate_alone(self, node: str, board: str) -> float | None:
        if (node, board) not in self.alone:
            self.alone[node, board] = self.time_alone(node, board)
        return self.alone[node, board]["images_per_sec"]

    def run(self, setup: Setup, position: int) -> dict:
        self.emulate(setup.boards)
        placed = list(zip(self.nodes, setup.boards, strict=True))[:setup.nodes]
        rates = {node: self.rate_alone(node, board) for node, board in placed}
        hosts: dict[str, dict[str, Any]] = {node: {"edgetrain_model": board} for node, board in placed}
        if setup.batch_by is BatchBy.SPEED:
            for node, rate in rates.items():
                if not rate:
                    raise SystemExit(f"seed {self.seed}: {node} has no rate alone to size its batch by")
                hosts[node]["edgetrain_speed"] = round(rate)  # the inventory takes a whole number
        inv = self._inventory(f"setup{position}.yml", hosts)
        steps = trained_on(JOB.dataset, self.o.holdout) // (setup.nodes * JOB.batch_size)
        steps = min(steps, self.o.max_steps) if self.o.max_steps else steps
        start = time.monotonic()
        edgetrain("run", JOB.name, "--np", str(setup.nodes), "-i", inv, "--epochs", str(self.o.epochs), "--seed", str(self.seed),
                  "--target-accuracy", str(self.o.target), "--holdout", str(self.o.holdout), "--holdout-split", str(self.o.holdout_split),
                  "--eval-every", str(model.evaluation_interval(steps, SPE)), "--batch-by", setup.batch_by.value,
                  "--runs-dir", str(self.runs_dir), *(["--max-steps", str(self.o.max_steps)] if self.o.max_steps else []))
        wall = round(time.monotonic() - start, 1)
        run = newest(self.runs_dir)
        record = run.record()
        tested = run.test_score()
        found: dict[str, Any] = {
            "setup": setup.name, "position": position, "nodes": [n for n, _ in placed], "boards": [b for _, b in placed],
            "batch_by": setup.batch_by.value, "speeds": record.placement.speeds if record.placement else None,
            "speeds_from": record.placement.speeds_from if record.placement else None,
            "batches": record.placement.batches if record.placement else None,
            "alone_images_per_sec": [rates[n] for n, _ in placed],
            "images_per_sec": runner.steady_rate(run), **asdict(runs.to_target(run, self.o.target)),
            "test_accuracy": tested and tested.get("test_accuracy"), "status": run.status().value, "run": run.id,
            "wall_seconds": wall,
        }
        self.log(f"({position + 1}) {setup.name}: " + (f"{found['images_per_sec']:,.0f} img/s" if found["images_per_sec"] else "no img/s")
                 + (f", {self.o.target:.1%} at {found['seconds_to_target']:.0f} s" if found["seconds_to_target"] is not None
                    else f", {self.o.target:.1%} not reached")
                 + (f", batches {'/'.join(map(str, found['batches']))}" if found["batches"] else "") + f"  ({wall:.0f} s, run {run.id})")
        return found

    def sit(self, command: list[str]) -> dict:
        started = time.time()
        self.log(f"seed {self.seed}: {', '.join(s.name for s in schedule(self.seed))}")
        self.calibrate()
        done = [self.run(setup, i) for i, setup in enumerate(schedule(self.seed))]
        return {
            "seed": self.seed, "command": command, "testbed": self.bed.state.id, "link_mbit": self.bed.state.link_mbit,
            "bracket": "pessimistic", "options": asdict(self.o), "boards": {m: asdict(e) for m, e in self.boards.items()},
            "order": [s.name for s in schedule(self.seed)], "alone": list(self.alone.values()), "runs": done,
            "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)), "seconds": round(time.time() - started, 1),
        }


def bench(bed: Testbed, inventory: str, seeds: list[int], out: Path, options: Options, runs_dir: Path, command: list[str]) -> list[Path]:
    """Every seed's sitting on the testbed, one JSON each in ``out``; the nodes' emulation is given
    back as it was."""
    tuning = sorted(set(seeds) & set(TUNING_SEEDS))
    if tuning and options.holdout_split == HOLDOUT_SPLIT:
        raise SystemExit(f"seed {tuning[0]} is a tuning seed ({TUNING_SEEDS.start}-{TUNING_SEEDS.stop - 1}), and split "
                         f"{HOLDOUT_SPLIT} is kept for reported figures: report another seed")
    before = [Emulation(**n.emulation) if n.emulation else None for n in bed.state.nodes]
    out.mkdir(parents=True, exist_ok=True)
    written = []
    try:
        for seed in seeds:
            found = Sitting(bed, Path(inventory), seed, options, runs_dir).sit(command)
            path = out / f"{time.strftime('%Y%m%d-%H%M%S', time.gmtime())}-mixed-seed{seed}.json"
            path.write_text(json.dumps(found, indent=1) + "\n")
            print(f"seed {seed}: {path} ({found['seconds']:.0f} s)")
            written.append(path)
    finally:
        bed.emulate(before if all(before) else None)  # type: ignore[arg-type]  # all given, or none: a partial one goes whole
    return written


# ---- the table, from the kept JSONs: pure -----------------------------------------------------

@dataclass(frozen=True)
class Target:
    what: str
    ratio: float | None = None  # at least this many times sooner; None: shown, not judged


SOONER_THAN_ALONE = Target("`--batch-by speed` sooner than the Pi 5 alone", 1.3)
SOONER_THAN_EQUAL = Target("`--batch-by speed` sooner than equal batches", 1.2)
EQUAL_THAN_ALONE = Target("equal batches sooner than the Pi 5 alone")
EFFICIENCY = "`--batch-by speed`'s efficiency against three Pi 4s' E(3)"
EFFICIENCY_POINTS = 5.0  # at most this many points below the homogeneous E(3)


def by_setup(record: dict) -> dict[str, dict]:
    return {r["setup"]: r for r in record["runs"]}


def ratio(record: dict, slower: Setup, faster: Setup) -> float | None:
    """How many times sooner ``faster`` reached the target than ``slower`` in one sitting; None
    where either missed it (a miss, counted as one)."""
    runs_ = by_setup(record)
    a, b = runs_[slower.name]["seconds_to_target"], runs_[faster.name]["seconds_to_target"]
    return a / b if a and b else None


def efficiency(record: dict, setup: Setup) -> float | None:
    """A configuration's img/s over the sum of its nodes' img/s alone, in one sitting."""
    r = by_setup(record)[setup.name]
    alone = r["alone_images_per_sec"]
    return r["images_per_sec"] / sum(alone) if r["images_per_sec"] and alone and all(alone) else None


def step_split(record: dict, setup: Setup) -> tuple[float, float] | None:
    """A configuration's step in ms (its global batch over its img/s) and the part of it its slowest
    rank needs to compute its batch at its rate alone; the rest is the allreduce and the waiting for
    it. None where a rate is missing."""
    r = by_setup(record)[setup.name]
    alone = r["alone_images_per_sec"]
    batches = r.get("batches") or [JOB.batch_size] * len(alone)
    if not r["images_per_sec"] or not alone or not all(alone):
        return None
    return 1000 * sum(batches) / r["images_per_sec"], 1000 * max(b / a for b, a in zip(batches, alone, strict=True))


def steps_line(records: list[dict]) -> str:
    """Where a step of the mixed cluster went, by the sittings' means: what --batch-by speed cannot shrink."""
    said = []
    for setup, name in ((EQUAL, "equal batches"), (BY_SPEED, "by speed")):
        got = [s for s in (step_split(r, setup) for r in records) if s]
        if got:
            step, compute = (statistics.fmean(x) for x in zip(*got, strict=True))
            said.append(f"{name} {step:.0f} ms, its slowest rank computing {compute:.0f} ms of it")
    return ("A step of the mixed cluster (the sittings' mean): " + "; ".join(said) + ". The rest is the allreduce and the wait "
            "for it, which batches by speed do not shrink.") if said else ""


def prediction_line(records: list[dict]) -> str:
    """bench's predicted gain of batches by speed over equal ones (model.choose_batches, compute only)
    from each sitting's rates alone, against the img/s the sittings measured."""
    pairs = [(model.choose_batches(s["alone_images_per_sec"]).gain, s["images_per_sec"] / e["images_per_sec"] - 1)
             for s, e in ((by_setup(r)[BY_SPEED.name], by_setup(r)[EQUAL.name]) for r in records)
             if all(s["alone_images_per_sec"]) and s["images_per_sec"] and e["images_per_sec"]]
    if not pairs:
        return ""
    predicted, measured = (statistics.fmean(x) for x in zip(*pairs, strict=True))
    return (f"bench predicts from the nodes' rates alone (computing only) {predicted:+.0%} img/s by speed over "
            f"equal batches (the sittings' mean); the sittings measured {measured:+.0%}.")


def rescored_line(records: list[dict]) -> str:
    """Which times a sitting's own rule read otherwise (rescore)."""
    said = [f"seed {r['seed']}'s {setup}: {now['seconds_to_target']:.0f} s, "
            + (f"{old:.0f} s" if (old := was["seconds_to_target"]) is not None else "a miss") + " as it ran"
            for r in sorted(records, key=lambda r: r["seed"]) if "rescored" in r
            for setup, was in r["rescored"]["as_run"].items() for now in [by_setup(r)[setup]]]
    return ("Read again by today's rule (runs.reaches): " + "; ".join(said) + ".") if said else ""


def _seeds(n: int) -> str:
    return f"{n} seed{'s' if n != 1 else ''}"


def ratio_row(records: list[dict], target: Target, slower: Setup, faster: Setup) -> str:
    s = pooled.speedup([ratio(r, slower, faster) for r in records])
    n, wanted = len(records), target.ratio
    if s.mean is None or s.low is None or s.high is None:
        cell, met = f"not reached ({_seeds(n)})", False
    else:
        cell = (f"{s.mean:.2f}x ({s.low:.2f}-{s.high:.2f}; {_seeds(n)})" if s.reached > 1 else f"{s.mean:.2f}x ({_seeds(n)}, no interval)")
        cell += f", {s.missed} missed" if s.missed else ""
        met = wanted is not None and s.mean >= wanted and not s.missed
    if wanted is None:
        return f"| {target.what} | {cell} | - | - |"
    return f"| {target.what} | {cell} | >= {wanted}x | {'met' if met else 'missed'} |"


def efficiency_row(records: list[dict]) -> str:
    """The mean efficiency by speed and the mean E(3), and their per-sitting difference in points
    with its 95% t-interval."""
    pairs = [(efficiency(r, BY_SPEED), efficiency(r, PI4S)) for r in records]
    got = [(a, b) for a, b in pairs if a is not None and b is not None]
    wanted = f"at most {EFFICIENCY_POINTS:g} points below"
    if not got:
        return f"| {EFFICIENCY} | not measured ({_seeds(len(records))}) | {wanted} | missed |"
    diffs = [100 * (a - b) for a, b in got]
    mean = statistics.fmean(diffs)
    half = pooled.t95(len(diffs) - 1) * statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else None
    spread = f"{mean - half:+.1f} to {mean + half:+.1f}; " if half is not None else ""
    cell = (f"{statistics.fmean(a for a, _ in got):.0%} against {statistics.fmean(b for _, b in got):.0%}: {mean:+.1f} points "
            f"({spread}{_seeds(len(got))}{'' if half is not None else ', no interval'})")
    return f"| {EFFICIENCY} | {cell} | {wanted} | {'met' if mean >= -EFFICIENCY_POINTS else 'missed'} |"


def table(records: list[dict]) -> str:
    """docs/scaling.md's mixed-cluster table from the kept sittings (one per seed)."""
    if not records:
        return "Not yet measured: `python -m lab mixed-bench` writes its JSONs to docs/benches/mixed/."
    seeds = sorted(r["seed"] for r in records)
    o = records[0]["options"]
    head = (f"| A Pi 5 (assumed 2x a Pi 4) and two Pi 4s, pessimistic bracket, {records[0]['link_mbit']} Mbit/s, LeNet to "
            f"{o['target']:.1%} on held-out split {o['holdout_split']}"
            + (f", at most {o['max_steps']} steps an epoch (a try of the pipeline, not a figure)" if o["max_steps"] else "")
            + " | measured: geometric mean (95% interval; seeds) | target | |")
    rows = [ratio_row(records, SOONER_THAN_ALONE, PI5_ALONE, BY_SPEED), ratio_row(records, SOONER_THAN_EQUAL, EQUAL, BY_SPEED),
            ratio_row(records, EQUAL_THAN_ALONE, PI5_ALONE, EQUAL), efficiency_row(records)]
    lines = [line for line in (steps_line(records), prediction_line(records), rescored_line(records)) if line]
    return "\n".join([head, "|---|---|---|---|", *rows, "", *(x for line in lines for x in (line, "")),
                      f"Seeds, one sitting each: {', '.join(map(str, seeds))}."])


def kept(folder: Path = KEPT) -> list[dict]:
    """The kept sittings; one protocol: the same target, split and links in every one."""
    records = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
    protocol = {(r["options"]["target"], r["options"]["holdout_split"], r["link_mbit"], r["options"]["max_steps"]) for r in records}
    if len(protocol) > 1:
        raise SystemExit(f"{folder}: sittings of different protocols (target, split, link, max steps): {sorted(protocol, key=str)}")
    if len({r["seed"] for r in records}) != len(records):
        raise SystemExit(f"{folder}: a seed kept twice")
    return records


NAME = "mixed-cluster table"  # its markers in docs/scaling.md, which lab.headline writes and checks


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m lab.mixed_bench", description="the mixed-cluster table from the kept sittings")
    p.add_argument("--kept", type=Path, default=KEPT, help="the folder of sittings (one JSON per seed)")
    p.add_argument("--rescore", type=Path, metavar="RUNS_DIR", help="first read each sitting's times to the target again from its runs there")
    args = p.parse_args(argv)
    if args.rescore:
        print("\n".join(line for path in sorted(args.kept.glob("*.json")) for line in rescore(path, args.rescore)) or "nothing changed")
    print(table(kept(args.kept)))


if __name__ == "__main__":
    main()
