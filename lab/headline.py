"""The headline of README.md and docs/scaling.md (and the mixed-cluster and storm tables) as code: ``python -m lab.headline`` writes its tables
between their markers from the kept benches (docs/benches/), and ``python -m lab.headline --check``
names every table and every figure of the sentences around them that the benches do not give
(tests/unit/test_headline.py runs the check). The pooling is lab.pooled's, the model bench's.

A cell is the speedup over one node training alone, from the same bench and seed (the one-node
runs side by side were made in some sittings only, so no cell uses them): its geometric mean, its
95% interval and its seeds, for every recipe; nothing is bold. A figure of a sentence is a
``Claim``: the words around it, with the figure recomputed from the benches, must be in the file.
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from edgetrain.controller import overlap, program as programs
from edgetrain.controller.bench import model
from edgetrain.shared.datasets import HOLDOUT_SPLIT
from edgetrain.shared.job_options import BY_NAME
from edgetrain.shared.sync import Sync
from lab import mixed_bench, pooled, storm
from lab.protocol import TUNING_SEEDS

ROOT = Path(__file__).resolve().parent.parent
KEPT = ROOT / "docs" / "benches"
README = ROOT / "README.md"
SCALING = ROOT / "docs" / "scaling.md"
CLI = ROOT / "docs" / "cli.md"


@dataclass(frozen=True)
class Link:
    name: str
    benches: tuple[str, ...]  # kept benches, by name (docs/benches/NAME.json), one seed each
    targets: dict[int, float] = field(compare=False)  # issue 66's, from the first step, by N
    # The split its benches held out: these predate bench.json's record of it (trials[].options),
    # and ran with --holdout-split's default of the time, 1; a bench that records another is refused.
    split: int = 1


ONE_GBIT = Link("1 Gbit/s", ("20261204-030940-bench-lenet-4e53", "20261204-065736-bench-lenet-9f74",
                             "20261204-154752-bench-lenet-bc22"), {2: 1.8, 3: 2.6, 4: 3.4})
LINKS = (ONE_GBIT, Link("300 Mbit/s", ("20261204-115655-bench-lenet-214f",), {2: 1.6, 3: 2.2}),
         Link("100 Mbit/s", ("20261204-185003-bench-lenet-0096",), {2: 1.2, 3: 1.5}))
TUNING = "tuning/20261204-021724-bench-lenet-8631"  # seed 10: the --sync-every candidates chosen on it
FASHION = "fashion/20261204-171729-bench-fashion-9bd5"

EVERY_STEP, SYNC_2, WEIGHTS_2 = (1, "grads"), (2, "grads"), (2, "weights")
RECIPES = ((SYNC_2, "`--sync-every 2`"), (EVERY_STEP, "every step"))
CLOCKS = (("seconds_to_target", "from the first step"), ("seconds_to_target_from_launch", "from the command"))
NODES = (2, 3, 4)


@functools.cache
def body(name: str) -> dict:
    return pooled.read(KEPT / f"{name}.json")[1]


@functools.cache
def pairs_of(link: Link) -> tuple[pooled.Pair, ...]:
    return tuple(p for name in link.benches for p in pooled.pairs(body(name), name))


def at(link: Link, sync: tuple[int, str], n: int) -> list[pooled.Pair]:
    return [p for p in pairs_of(link) if p.sync == sync and p.nodes == n]


def seeds(count: int) -> str:
    return f"{count} seed{'s' if count != 1 else ''}"


def speedup(link: Link, sync: tuple[int, str], n: int, key: str = "seconds_to_target") -> pooled.Speedup:
    return pooled.speedup([p.ratio(key) for p in at(link, sync, n)])


def cell(link: Link, sync: tuple[int, str], n: int, key: str = "seconds_to_target") -> str:
    """A table's cell: the geometric mean (95% interval; seeds), a miss counted."""
    tries = at(link, sync, n)
    if not tries:
        return "-"
    s = speedup(link, sync, n, key)
    if not s.reached:
        return f"not reached ({seeds(len(tries))})"
    figure = (f"{s.mean:.2f}x ({s.low:.2f}-{s.high:.2f}; {seeds(len(tries))})" if s.reached > 1
              else f"{s.mean:.2f}x ({seeds(len(tries))}, no interval)")
    return figure + (f", {s.missed} missed" if s.missed else "")


def _row(label: str, cells: list[str]) -> str:
    return f"| {label} | " + " | ".join(cells) + " |"


def readme_table() -> str:
    head = ("| LeNet to 99.0% at 1 Gbit/s, sooner than one node from the first step: geometric mean "
            "(95% interval; seeds) | " + " | ".join(f"{n} nodes" for n in NODES) + " |")
    rows = [_row(label, [cell(ONE_GBIT, sync, n) for n in NODES]) for sync, label in RECIPES]
    return "\n".join([head, "|---" * (len(NODES) + 1) + "|", *rows])


def scaling_table() -> str:
    head = ("| LeNet to 99.0%, sooner than one node: geometric mean (95% interval; seeds) | "
            + " | ".join(f"{n} nodes" for n in NODES) + " |")
    rows = [_row(f"{link.name}, {label}, {clock}", [cell(link, sync, n, key) for n in NODES])
            for link in LINKS for sync, label in RECIPES for key, clock in CLOCKS]
    return "\n".join([head, "|---" * (len(NODES) + 1) + "|", *rows, "",
                      "Seeds, one bench and one try each: " + "; ".join(f"{link.name} {_seeds_of(link)}" for link in LINKS) + "."])


def _seeds_of(link: Link) -> str:
    """Which seeds a link's cells pool: one list, or a list per N where they differ."""
    by_n = {n: sorted(p.seed for p in at(link, EVERY_STEP, n)) for n in NODES if at(link, EVERY_STEP, n)}
    if len({tuple(v) for v in by_n.values()}) == 1:
        return _listed(next(iter(by_n.values())))
    return ", ".join(f"{_listed(v)} at {n} nodes" for n, v in by_n.items())


def _listed(found: list[int]) -> str:
    return ", ".join(map(str, found[:-1])) + f" and {found[-1]}" if len(found) > 1 else str(found[0])


# -- the figures of the sentences ---------------------------------------------------------------

def _span(values: list[float], fmt: str) -> str:
    return f"{min(values):{fmt}}-{max(values):{fmt}}"


def sync_gain() -> str:
    """How much more img/s --sync-every 2 trained than every step, per bench and N, lowest to highest."""
    return f"trained {_gains()} more img/s than every step"


def _gains() -> str:
    gains = []
    for link in LINKS:
        for n in NODES:
            rates = {(p.bench, p.sync): p.many["images_per_sec"] for p in pairs_of(link) if p.nodes == n}
            gains += [rates[(b, SYNC_2)] / rates[(b, EVERY_STEP)] - 1 for b, sync in rates if sync == SYNC_2 and (b, EVERY_STEP) in rates]
    return _span([100 * g for g in gains], ".0f") + "%"


def weights_misses() -> str:
    tries = [p for link in LINKS for p in pairs_of(link) if p.sync == WEIGHTS_2]
    missed = [p for p in tries if p.ratio("seconds_to_target") is None]
    at_3 = [p for p in tries if p.nodes == 3]
    missed_3 = [p for p in missed if p.nodes == 3]
    which = f"all {len(at_3)}" if len(missed_3) == len(at_3) else f"{len(missed_3)} of {len(at_3)}"
    return f"missed 99.0% within four epochs in {len(missed)} of {len(tries)} tries ({which} at 3 nodes)"


def tuning_k4() -> str:
    (t,) = [t for t in body(TUNING)["trials"] if (t["nodes"], t["sync_every"], t["sync_mode"]) == (3, 4, "grads")]
    return f"{'missed' if t['seconds_to_target'] is None else 'reached'} it at 3 nodes on tuning seed {t['seed']}"


def targets_at_3() -> str:
    """Issue 66's target at 3 nodes, the one N with three seeds, against both recipes' intervals."""
    three = [n for n in NODES if all(len(at(ONE_GBIT, sync, n)) >= 3 for sync, _ in RECIPES)]
    which = "the one N with three seeds" if three == [3] else f"N = {three} with three seeds or more"
    target, got = ONE_GBIT.targets[3], [speedup(ONE_GBIT, sync, 3) for sync, _ in RECIPES]
    below = all(s.mean is not None and s.mean < target for s in got)
    held = all(s.low is not None and s.high is not None and s.low <= target <= s.high for s in got)
    return (f"at 3 nodes, {which}, `--sync-every 2` gave {cell(ONE_GBIT, SYNC_2, 3)} and every step "
            f"{cell(ONE_GBIT, EVERY_STEP, 3)}: {'both below' if below else 'not both below'} the {target}x target, "
            f"{'and both intervals hold it' if held else 'and not both intervals hold it'}")


def slow_targets() -> str:
    """The slower links' cells against issue 66's targets, every recipe."""
    cells = [(link, sync, n) for link in LINKS[1:] for sync, _ in RECIPES for n in link.targets]
    below = all((speedup(*c).mean or 0) < c[0].targets[c[2]] for c in cells)
    counts = sorted({len(at(*c)) for c in cells})
    return (f"at 300 and 100 Mbit/s, {' or '.join(map(seeds, counts))} each, "
            + ("every cell is below its target" if below else "not every cell is below its target"))


def _step_ms(link: Link) -> list[float]:
    """One node's step alone, from its img/s and the batch (bench's step t)."""
    return sorted({1e3 * _batch(p.bench) / p.one["images_per_sec"] for p in pairs_of(link)})


def _batch(name: str) -> int:
    args = body(name)["args"]
    return int(args[args.index("--batch-size") + 1])


def _allreduce_ms(link: Link) -> list[float]:
    return [1e3 * a["seconds"] for name in link.benches for a in body(name)["allreduce"]]


def wire_1g() -> str:
    (size,) = {a["bytes"] for name in ONE_GBIT.benches for a in body(name)["allreduce"]}
    return (f"LeNet's {size / 1e6:.1f} MB allreduce takes {_span(_allreduce_ms(ONE_GBIT), '.1f')} ms against one node's "
            f"step of {_span(_step_ms(ONE_GBIT), '.0f')} ms")


def wire_300() -> str:
    link = LINKS[1]
    return f"at 300 Mbit/s the wire ({_span(_allreduce_ms(link), '.0f')} ms an allreduce, one node's step {_step_ms(link)[0]:.0f} ms)"


def wire_100() -> str:
    link = LINKS[2]
    return (f"at 100 Mbit/s the wire again ({' / '.join(f'{ms:.0f}' for ms in _allreduce_ms(link))} ms an allreduce at 2 / 3 "
            f"nodes, one node's step {_step_ms(link)[0]:.0f} ms)")


def model_error() -> str:
    """The model's E(N) against each 100 Mbit/s try's, both against one node alone, in points."""
    link = LINKS[-1]
    (name,) = link.benches
    predicted = {(c["nodes"], c["sync_every"], c["sync_mode"]): c["predicted"] for c in body(name)["sync_candidates"]}
    off = [abs(predicted[(p.nodes, p.sync[0], p.sync[1])] - p.efficiency) * 100 for p in pairs_of(link)]
    return f"within {max(off):.1f} points of every 100 Mbit/s try"


def model_k4() -> str:
    """What bench's model predicts at 100 Mbit/s for an allreduce every 4 accumulated batches: N x E(N)."""
    (name,) = LINKS[-1].benches
    b = body(name)
    program = programs.resolve(b["program"], [], programs.JobOptions())
    assert program.job is not None  # the headline benches are of a built-in job
    layers = program.job.layers(program.checkpoint_options)
    (one,) = {p.one["images_per_sec"] for p in pairs_of(LINKS[-1])}  # its one seed's one-node try: bench's step t
    step = _batch(name) / one
    found = [a["nodes"] * model.predict(step, model.Allreduce(**a), Sync(4), overlap.schedule(layers), b["busy_cores"]).expected
             for a in b["allreduce"]]
    return f"puts an allreduce every 4 batches at N x E(N) {' / '.join(f'{x:.2f}x' for x in found)} there"


def slow_every_step() -> str:
    """At 100 Mbit/s, every step against one node, and what bench predicted before training (N x E(N))."""
    link = LINKS[-1]
    (name,) = link.benches
    measured = [m for n in (2, 3) if (m := speedup(link, EVERY_STEP, n).mean) is not None]
    predicted = [n * body(name)["predicted_efficiency"][str(n)] for n in (2, 3)]
    said = "predicted it before training" if all(x < 1 for x in predicted) else "did not predict it"
    return (f"every step made 2 and 3 nodes {'slower' if all(x < 1 for x in measured) else 'not slower'} than one "
            f"({' / '.join(f'{x:.2f}x' for x in measured)}); bench {said}")


def fashion() -> str:
    found = {p.sync: p.efficiency for p in pooled.pairs(body(FASHION), FASHION) if p.nodes == 3}
    return f"{found[SYNC_2]:.0%} with `--sync-every 2`, {found[EVERY_STEP]:.0%} every step"


@dataclass(frozen=True)
class Claim:
    path: Path
    figure: Callable[[], str]  # the words around a figure, with the figure recomputed


CLAIMS = (
    Claim(README, sync_gain),
    Claim(README, slow_every_step),
    Claim(SCALING, sync_gain),
    Claim(SCALING, weights_misses),
    Claim(SCALING, tuning_k4),
    Claim(SCALING, targets_at_3),
    Claim(SCALING, wire_1g),
    Claim(SCALING, wire_300),
    Claim(SCALING, wire_100),
    Claim(SCALING, slow_targets),
    Claim(SCALING, model_error),
    Claim(SCALING, model_k4),
    Claim(SCALING, slow_every_step),
    Claim(SCALING, fashion),
)

# Each generated block sits between these lines of its file.
BEGIN = "<!-- {}: written by python -m lab.headline from docs/benches/; edit that, not this -->"
END = "<!-- end of {} -->"
BLOCKS = ((README, "headline table", readme_table), (SCALING, "headline table", scaling_table),
          (SCALING, mixed_bench.NAME, lambda: mixed_bench.table(mixed_bench.kept())),
          (CLI, "storm table", lambda: storm.docs_table(json.loads(storm.REPORTED.read_text()))))


def block(text: str, name: str) -> re.Match | None:
    return re.search(re.escape(BEGIN.format(name)) + r"\n(.*?)\n" + re.escape(END.format(name)), text, re.S)


def tuning_refusal(bench_args: list[str]) -> str | None:
    """Why a bench of these arguments (`edgetrain bench`'s) would break the protocol, or None: tuning
    seeds on the split kept for reported benches would let tuning see it."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--seed", type=int, default=BY_NAME["seed"].default)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--holdout", type=int)
    p.add_argument("--holdout-split", type=int, default=HOLDOUT_SPLIT)
    a = p.parse_known_args(bench_args)[0]
    tried = set(range(a.seed, a.seed + a.repeat)) & set(TUNING_SEEDS)
    if a.holdout and a.holdout_split == HOLDOUT_SPLIT and tried:
        return (f"seed {min(tried)} is a tuning seed ({TUNING_SEEDS.start}-{TUNING_SEEDS.stop - 1}) and split {HOLDOUT_SPLIT} is "
                f"kept for reported benches - tune with --holdout-split 1, or report a seed outside {TUNING_SEEDS.start}-"
                f"{TUNING_SEEDS.stop - 1}")
    return None


def protocol() -> list[str]:
    """Every headline bench's seeds outside the tuning range, and the same split within a row where recorded."""
    problems = []
    for link in LINKS:
        for p in pairs_of(link):
            if p.seed in TUNING_SEEDS:
                problems.append(f"{p.bench}: seed {p.seed} is a tuning seed ({TUNING_SEEDS.start}-{TUNING_SEEDS.stop - 1})")
        for name in link.benches:
            splits = {t["options"].get("holdout_split") for t in body(name)["trials"] if t.get("options")} - {link.split}
            if splits:
                problems.append(f"{name}: held out split {sorted(splits)[0]}, and its row pools split {link.split}")
    return problems


def check(read: Callable[[Path], str] = Path.read_text) -> list[str]:
    """Where the text (as ``read`` gives each file) and the kept benches disagree, one line each; none
    when they agree."""
    problems = protocol()
    for path, name, make in BLOCKS:
        found = block(read(path), name)
        want = make()
        if found is None:
            problems.append(f"{path.relative_to(ROOT)}: no {name} between its markers")
        elif found.group(1) != want:
            problems.append(f"{path.relative_to(ROOT)}: the {name} is not what the benches give; python -m lab.headline "
                            f"writes it:\n{want}\n  the file has:\n{found.group(1)}")
    for claim in CLAIMS:
        want = claim.figure()
        if want not in " ".join(read(claim.path).split()):
            problems.append(f"{claim.path.relative_to(ROOT)}: the benches give \"{want}\" ({claim.figure.__name__}), "
                            "and the file does not say it")
    return problems


def write() -> None:
    for path, name, make in BLOCKS:
        text = path.read_text()
        found = block(text, name)
        if found is None:
            raise SystemExit(f"{path}: no {name} markers ({BEGIN.format(name)} ... {END.format(name)})")
        path.write_text(text[:found.start(1)] + make() + text[found.end(1):])


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m lab.headline", description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="write nothing: list where the text and the benches disagree")
    if not p.parse_args().check:
        write()
    problems = check()
    print("\n".join(problems) or "README.md, docs/scaling.md and docs/cli.md say what docs/benches/ gives")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
