"""Time to accuracy pooled over benches and seeds: ``python -m lab.pooled BENCH.json...``.

The protocol docs/scaling.md follows asks for several seeds over several sessions, and one bench is
one session. Each try is paired with the one-node try of the same bench and seed (the same
trajectory at every N, the same hour of this machine), so what is pooled is each pair's ratio, not
times from different hours. Per N: the time to the target from the first step and from the command,
the speedup over one node (the geometric mean of the pairs, with a 95% t-interval on their
logarithms), E(N) against the one node alone and the throughput it gives (N x E(N)), the images
each try trained on to reach the target, and the test accuracy scored once after training. A pair
where either try missed the target counts as a miss and is shown as such, not left out. The tries
of a bench's --sync-every candidates (bench --sync-candidates) are paired with the same one-node
tries, in a table of their own per setting.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import statistics
from dataclasses import dataclass
from pathlib import Path

# Student's t, two-sided 95%, by degrees of freedom: enough for the few seeds a session affords.
T95 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262, 10: 2.228,
       12: 2.179, 15: 2.131, 20: 2.086, 30: 2.042}


def t95(df: int) -> float:
    return T95[max(k for k in T95 if k <= df)]  # the next smaller df's: the interval errs wide


@dataclass(frozen=True)
class Pair:
    bench: str
    seed: int
    nodes: int
    one: dict  # the one-node trial
    many: dict  # the trial at ``nodes``
    sync: tuple[int, str] = (1, "grads")  # how the trial at ``nodes`` talked: --sync-every, --sync-mode

    def ratio(self, key: str) -> float | None:
        a, b = self.one.get(key), self.many.get(key)
        return a / b if a and b else None

    @property
    def efficiency(self) -> float | None:
        a, b = self.one.get("images_per_sec"), self.many.get("images_per_sec")
        return b / (self.nodes * a) if a and b else None


def pairs(body: dict, name: str) -> list[Pair]:
    """Every multi-node try of the bench, its N-loop's and its --sync-every candidates', paired by
    seed with the N-loop's one-node try."""
    own = (body.get("sync_every", 1), body.get("sync_mode", "grads"))
    alone = [t for t in body["trials"] if t.get("beside", 0) == 0 and t["status"] == "completed"]
    if any(t.get("seed") is None for t in alone):
        raise SystemExit(f"{name}: its trials name no seed (a script's bench, or one from before they recorded it)")
    ones = {t["seed"]: t for t in alone if t["nodes"] == 1 and _sync(t, own) == own}
    return [Pair(name, t["seed"], t["nodes"], ones[t["seed"]], t, _sync(t, own))
            for t in alone if t["nodes"] > 1 and t["seed"] in ones]


def _sync(trial: dict, own: tuple[int, str]) -> tuple[int, str]:
    return trial.get("sync_every", own[0]), trial.get("sync_mode", own[1])


def interval(values: list[float]) -> tuple[float, float, float]:
    """The geometric mean of ratios and its 95% interval (the mean itself, twice, from one value)."""
    logs = [math.log(v) for v in values]
    mean = statistics.fmean(logs)
    half = t95(len(logs) - 1) * statistics.stdev(logs) / math.sqrt(len(logs)) if len(logs) > 1 else 0.0
    return math.exp(mean), math.exp(mean - half), math.exp(mean + half)


@dataclass(frozen=True)
class Speedup:
    """Pairs' ratios pooled: the geometric mean and its 95% interval over the pairs that reached the
    target (one pair: the mean, and no interval), and how many missed it."""

    reached: int
    missed: int
    mean: float | None = None
    low: float | None = None
    high: float | None = None


def speedup(found: list[float | None]) -> Speedup:
    got = [v for v in found if v is not None]
    return Speedup(len(got), len(found) - len(got), *interval(got)) if got else Speedup(0, len(found))


def _ratio_cell(found: list[float | None]) -> str:
    s = speedup(found)
    if not s.reached:
        return "not reached"
    cell = f"{s.mean:.2f}x ({s.low:.2f}-{s.high:.2f})" if s.reached > 1 else f"{s.mean:.2f}x"
    return cell + (f", {s.missed} missed" if s.missed else "")


def _seconds_cell(values: list[float | None]) -> str:
    got = sorted(v for v in values if v is not None)
    if not got:
        return "-"
    return f"{statistics.median(got):.0f} ({got[0]:.0f}-{got[-1]:.0f})" if len(got) > 1 else f"{got[0]:.0f}"


def table(all_pairs: list[Pair]) -> str:
    rows = ["| N | tries | seconds to target, first step / command: median (range) | speedup from the first step (95% interval) "
            "| from the command | E(N), mean (range) | N x E(N) | thousand images to target: median (range) | test accuracy (range) |",
            "|---|---|---|---|---|---|---|---|---|"]
    ones = list({(p.bench, p.seed): p.one for p in all_pairs}.values())
    rows.append(f"| 1 | {len(ones)} | {_seconds_cell([t['seconds_to_target'] for t in ones])} / "
                f"{_seconds_cell([t['seconds_to_target_from_launch'] for t in ones])} | - | - | - | 1 | "
                f"{_images_cell(ones)} | {_accuracy_cell(ones)} |")
    for n in sorted({p.nodes for p in all_pairs}):
        at = [p for p in all_pairs if p.nodes == n]
        eff = [p.efficiency for p in at if p.efficiency is not None]
        rows.append(f"| {n} | {len(at)} | {_seconds_cell([p.many['seconds_to_target'] for p in at])} / "
                    f"{_seconds_cell([p.many['seconds_to_target_from_launch'] for p in at])} | "
                    f"{_ratio_cell([p.ratio('seconds_to_target') for p in at])} | "
                    f"{_ratio_cell([p.ratio('seconds_to_target_from_launch') for p in at])} | "
                    + (f"{statistics.fmean(eff):.0%} ({min(eff):.0%}-{max(eff):.0%}) | {n * statistics.fmean(eff):.2f}x" if eff else "- | -")
                    + f" | {_images_cell([p.many for p in at])} | {_accuracy_cell([p.many for p in at])} |")
    return "\n".join(rows)


def tables(all_pairs: list[Pair]) -> str:
    """One table per way the multi-node tries talked, every-step first."""
    out = []
    for sync in sorted({p.sync for p in all_pairs}):
        out.append(f"--sync-every {sync[0]} --sync-mode {sync[1]}:\n" + table([p for p in all_pairs if p.sync == sync]))
    return "\n\n".join(out)


def _images_cell(trials: list[dict]) -> str:
    """Thousands of images to the target; a try that missed it is counted, as a miss."""
    got = sorted(t["images_to_target"] / 1000 for t in trials if t.get("images_to_target"))
    missed = len(trials) - len(got)
    if not got:
        return "not reached"
    cell = f"{statistics.median(got):.0f} ({got[0]:.0f}-{got[-1]:.0f})" if len(got) > 1 else f"{got[0]:.0f}"
    return cell + (f", {missed} missed" if missed else "")


def _accuracy_cell(trials: list[dict]) -> str:
    got = [t["test_accuracy"] for t in trials if t.get("test_accuracy") is not None]
    return f"{min(got):.2%}-{max(got):.2%}" if got else "-"


def read(path: Path) -> tuple[str, dict]:
    """A bench's name and bench.json body, from the file or the bench directory holding it."""
    path = path / "bench.json" if path.is_dir() else path
    name = path.parent.name if path.name == "bench.json" else path.stem  # a kept copy is named after its bench
    return name, json.loads(path.read_text())


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m lab.pooled", description=__doc__.splitlines()[0])
    p.add_argument("benches", nargs="+", type=Path, help="bench.json files, or the bench directories holding them")
    args = p.parse_args()
    found: list[Pair] = []
    for path in args.benches:
        name, body = read(path)
        found += pairs(body, name)
        print(f"{name}: {shlex.join(body['command'])}")
    if not found:
        raise SystemExit("no tries to pair: each bench needs a completed one-node try of the same seed")
    print(tables(found))


if __name__ == "__main__":
    main()
