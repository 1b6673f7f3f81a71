"""python -m lab up|emulate|cpu|bench|slurm|slurm-burst|mixed-bench|storm|status|down: drive the testbed by hand (needs root)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from . import mixed_bench, slurm_burst, storm
from .bench import DEFAULT_SIZES, allreduce_bandwidth, line_rate_mb_s
from .comm_core import training_share_bound
from .emulation import DEFAULT_PERIOD_US, Emulation, calibrate, machine_cores, overcommit, parse_profile
from .testbed import DEFAULT_ROOT, Testbed


COMM_CHOICES = {"pi-core": True, "shared": False}
COMM_HELP = ("pi-core (default): the nodes' communication threads on a Pi core's worth of CPU of their own; "
             "shared: in the node's quota with its training (see comm_core.py)")


ALONE_HELP = ("calibrate with no other node training beside the calibration, and let idle nodes idle "
              "(by default idle nodes train a stand-in: emulated nodes share this machine's cores and caches)")


PROFILES_HELP = ("pi4 (250 LeNet img/s), pi4-slow (150), pi4-fast (400), pi5 (500: assumed twice a Pi 4, not measured) "
                 "or MODEL:IMG_PER_SEC (a measured board's figure); one for every node, or one per node, comma-separated, "
                 "for a mixed cluster (pi5,pi4,pi4); each calibrated on this machine")


def boards(spec: str, nodes: int, period_us: int, comm: str = "pi-core", alone: bool = False) -> list[Emulation]:
    """The calibrated quota of each node's board (measured once per machine and rate, then read
    from the cache): ``spec`` one profile for every node, or one per node, comma-separated."""
    profiles = spec.split(",")
    if len(profiles) not in (1, nodes):
        raise SystemExit(f"{len(profiles)} profiles ({spec}) for {nodes} nodes: give one, or one per node")
    try:
        wanted = [parse_profile(p) for p in profiles]
    except ValueError as e:
        raise SystemExit(str(e)) from None
    made: dict[tuple[str, float], Emulation] = {}
    try:
        for model, rate in wanted:
            if (model, rate) not in made:
                made[model, rate] = calibrate(rate, "edgetrain-calibration", model=model, period_us=period_us,
                                              cache=DEFAULT_ROOT / "calibration.json", comm=COMM_CHOICES[comm],
                                              neighbours=0 if alone else nodes - 1, log=lambda line: print(line, file=sys.stderr))
    except RuntimeError as e:  # the search did not converge
        raise SystemExit(str(e)) from None
    return [made[w] for w in wanted] * (nodes // len(wanted))


def emulate(bed: Testbed, emulation: list[Emulation] | None) -> None:
    """``bed.emulate``, its inventory rewritten to name each node's board and speed, saying so where
    this machine cannot give every node its CPU at once."""
    bed.emulate(emulation)
    bed.write_inventory()
    overcommitted = emulation and overcommit(emulation, machine_cores())
    if overcommitted:
        print(f"warning: {overcommitted}", file=sys.stderr)


def cpu_window(bed: Testbed, seconds: float) -> dict[str, dict[str, float]]:
    """Cores each node's groups used over ``seconds``, the share of periods its quota throttled, and
    (communication split off) at most what that communication would have taken from training on a Pi."""
    before = bed.cpu_stat()
    time.sleep(seconds)
    after = bed.cpu_stat()
    emulations = {n.name: n.emulation or {} for n in bed.state.nodes}
    out = {}
    for node, a in after.items():
        emulation = emulations[node]
        b = before[node]
        row = {"cores": (a["usage_ns"] - b["usage_ns"]) / 1e9 / seconds,
               "throttled": (a["nr_throttled"] - b["nr_throttled"]) / max(1, a["nr_periods"] - b["nr_periods"])}
        if "comm_usage_ns" in a:
            comm = (a["comm_usage_ns"] - b["comm_usage_ns"]) / 1e9
            row["comm_cores"] = comm / seconds
            row["comm_throttled"] = (a["comm_nr_throttled"] - b["comm_nr_throttled"]) / max(1, a["comm_nr_periods"] - b["comm_nr_periods"])
            if emulation.get("comm_quota_us"):
                row["training_share_bound"] = training_share_bound(comm, seconds, emulation["comm_quota_us"] / emulation["period_us"])
        out[node] = {k: round(v, 4) for k, v in row.items()}
    return out


def load(tid: str) -> Testbed:
    """A recorded testbed, or one line naming the ones there are."""
    if tid not in Testbed.recorded():
        raise SystemExit(f"no testbed {tid!r} under {DEFAULT_ROOT} (recorded: {', '.join(Testbed.recorded()) or 'none'})")
    return Testbed.load(tid)


def _up_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-n", "--nodes", type=int, help="how many (default: one per --emulate profile where several are given, else 3)")
    parser.add_argument("--no-shape", action="store_true", help="leave the links unshaped")
    parser.add_argument("--docker", action="store_true", help="start a Docker engine in every node")
    parser.add_argument("--emulate", metavar="PROFILES", help="give the nodes a Raspberry Pi's CPU: " + PROFILES_HELP)
    parser.add_argument("--period-us", type=int, default=DEFAULT_PERIOD_US, help="CFS period of the emulated nodes' quota")
    parser.add_argument("--comm", choices=COMM_CHOICES, default="pi-core", help=COMM_HELP)
    parser.add_argument("--alone", action="store_true", help=ALONE_HELP)


def _up(args: argparse.Namespace, argv: list[str]) -> int:
    nodes = args.nodes or (len(args.emulate.split(",")) if args.emulate and "," in args.emulate else 3)
    emulation = boards(args.emulate, nodes, args.period_us, args.comm, args.alone) if args.emulate else None
    bed = Testbed.create(nodes, shape=not args.no_shape, docker=args.docker)
    emulate(bed, emulation)
    print(json.dumps(bed.status(), indent=2))
    return 0


def _emulate_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id")
    parser.add_argument("profile", help=PROFILES_HELP + "; or off")
    parser.add_argument("--period-us", type=int, default=DEFAULT_PERIOD_US)
    parser.add_argument("--comm", choices=COMM_CHOICES, default="pi-core", help=COMM_HELP)
    parser.add_argument("--alone", action="store_true", help=ALONE_HELP)


def _emulate(args: argparse.Namespace, argv: list[str]) -> int:
    bed = load(args.id)
    emulate(bed, None if args.profile == "off" else boards(args.profile, len(bed.state.nodes), args.period_us, args.comm, args.alone))
    print(json.dumps({n.name: n.emulation for n in bed.state.nodes}))
    return 0


def _down_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("ids", nargs="*", help="testbed ids (default: every recorded testbed whose maker has ended, "
                        "so a running test session keeps its own)")


def _down(args: argparse.Namespace, argv: list[str]) -> int:
    for tid in args.ids or Testbed.recorded():
        bed = load(tid)
        if not args.ids and bed.state.in_use:
            print(f"kept {tid}: in use by pid {bed.state.owner_pid} (name it to remove it anyway)")
            continue
        bed.down()
        print(f"removed {tid}")
    return 0


def _id_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id")


def _slurm(args: argparse.Namespace, argv: list[str]) -> int:
    bed = load(args.id)
    bed.slurm_up()
    print(" ".join(f"{k}={v}" for k, v in bed.state.slurm_env.items()))
    return 0


def _slurm_burst_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id")
    parser.add_argument("-i", "--inventory", required=True, help="the testbed's docker inventory, one slot a node")
    parser.add_argument("--seed", type=int, default=1, help="draws who submits what, of how many nodes, and which job loses a node")


def _slurm_burst(args: argparse.Namespace, argv: list[str]) -> int:
    load(args.id)
    return slurm_burst.run_on(args.id, args.inventory, args.seed)


def _mixed_bench_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id")
    parser.add_argument("-i", "--inventory", required=True, help="the testbed's docker inventory")
    parser.add_argument("--seeds", default="60,61,62", help="one sitting each; each rotates the order of the configurations")
    parser.add_argument("--out", type=Path, required=True, help=f"where each seed's JSON goes (the kept ones: {mixed_bench.KEPT.relative_to(mixed_bench.ROOT)})")
    parser.add_argument("--runs-dir", type=Path, default=Path("runs"))
    defaults = mixed_bench.Options()
    parser.add_argument("--target", type=float, default=defaults.target, help="validation accuracy on the held-out split")
    parser.add_argument("--epochs", type=int, default=defaults.epochs, help="at most")
    parser.add_argument("--holdout-split", type=int, default=defaults.holdout_split)
    parser.add_argument("--max-steps", type=int, help="steps an epoch at most: a short try of the pipeline (its JSONs pool with no others)")
    parser.add_argument("--timing-steps", type=int, default=defaults.timing_steps, help="steps each node's rate alone is timed over")


def _mixed_bench(args: argparse.Namespace, argv: list[str]) -> int:
    bed = load(args.id)
    options = mixed_bench.Options(target=args.target, epochs=args.epochs, holdout_split=args.holdout_split, max_steps=args.max_steps,
                                  timing_steps=args.timing_steps)
    mixed_bench.bench(bed, args.inventory, [int(s) for s in args.seeds.split(",")], args.out, options, args.runs_dir,
                      ["python", "-m", "lab", *argv])
    return 0


def _storm_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id")
    parser.add_argument("-i", "--inventory", required=True, help="the testbed's docker inventory, one slot a node, a short lease")
    parser.add_argument("--seed", type=int, default=1, help="draws the faults, their nodes and moments; the run's seed too")
    parser.add_argument("--minutes", type=float, default=30.0, help="about how long the storm lasts (its run trains 60%% of it undisturbed)")
    parser.add_argument("--faults", type=int, default=10)
    parser.add_argument("--max-steps", type=int, default=100, help="the run's steps an epoch")
    parser.add_argument("--compare", action="store_true", help="then the same seed's run undisturbed: held-out accuracy within 0.5 points")
    parser.add_argument("--out", type=Path, help="keep the storm's figures there as JSON (docs/benches/storm/)")


def _storm(args: argparse.Namespace, argv: list[str]) -> int:
    load(args.id)
    return storm.run_on(args.id, args.inventory, args.seed, args.minutes, args.faults, args.max_steps, args.compare, args.out)


def _no_arguments(parser: argparse.ArgumentParser) -> None:
    pass


def _status(args: argparse.Namespace, argv: list[str]) -> int:
    print(json.dumps([Testbed.load(t).status() for t in Testbed.recorded()], indent=2))
    print(f"(state under {DEFAULT_ROOT})", file=sys.stderr)
    return 0


def _cpu_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id")
    parser.add_argument("--over", type=float, default=30.0, metavar="SECONDS")


def _cpu(args: argparse.Namespace, argv: list[str]) -> int:
    bed = load(args.id)
    print(json.dumps(cpu_window(bed, args.over), indent=2))
    return 0


def _bench_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("id")
    parser.add_argument("--python", default=sys.executable, help="interpreter with mpi4py, on the shared filesystem")
    parser.add_argument("--mib", type=int, nargs="+", default=[s >> 20 for s in DEFAULT_SIZES], help="message sizes")


def _bench(args: argparse.Namespace, argv: list[str]) -> int:
    bed = load(args.id)
    link = f"tbf {bed.state.link_mbit} Mbit/s" if bed.state.link_mbit else "unshaped"
    print(f"MPI_Allreduce, 2 ranks on {bed.state.nodes[0].name} and {bed.state.nodes[1].name}, UCX_TLS=tcp,self, links {link}")
    for row in allreduce_bandwidth(bed, python=args.python, sizes=[m << 20 for m in args.mib]):
        print(f"{row['bytes'] >> 20:6d} MiB  {row['seconds'] * 1e3:8.1f} ms  {row['mb_per_s']:6.1f} MB/s"
              f"  {100 * row['mb_per_s'] / line_rate_mb_s(bed):3.0f}% of {line_rate_mb_s(bed):.0f} MB/s")
    return 0


@dataclass(frozen=True)
class Command:
    help: str
    arguments: Callable[[argparse.ArgumentParser], None]
    # Given the parsed arguments and the command line after "python -m lab" (a bench records it).
    run: Callable[[argparse.Namespace, list[str]], int]


# In the order --help lists them.
COMMANDS = {
    "up": Command("create a testbed and print its id and inventory", _up_arguments, _up),
    "emulate": Command("change (or, with 'off', lift) the CPU emulation of a testbed", _emulate_arguments, _emulate),
    "down": Command("tear down testbeds recorded on this machine", _down_arguments, _down),
    "slurm": Command("start Slurm's daemons in a testbed site.yml provisioned, and print SLURM_CONF", _id_argument, _slurm),
    "slurm-burst": Command("three users submit twelve short jobs to a provisioned testbed's Slurm at once, "
                           "one node is set down mid-burst; checks and times the queue's drain (slurm_burst.py)",
                           _slurm_burst_arguments, _slurm_burst),
    "mixed-bench": Command("a Pi 5 beside two Pi 4s, by equal batches and by speed, against the Pi 5 alone "
                           "and three Pi 4s, LeNet to the target, one sitting and one JSON a seed (mixed_bench.py)",
                           _mixed_bench_arguments, _mixed_bench),
    "storm": Command("one long run on a provisioned testbed through a seeded schedule of faults; "
                     "checks that nothing was lost and reports what each fault cost (storm.py)", _storm_arguments, _storm),
    "status": Command("show recorded testbeds", _no_arguments, _status),
    "cpu": Command("each node's CPU over a window: training and communication threads, throttling", _cpu_arguments, _cpu),
    "bench": Command("mpi4py allreduce bandwidth between two nodes of a provisioned testbed", _bench_arguments, _bench),
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    for name, command in COMMANDS.items():
        command.arguments(sub.add_parser(name, help=command.help))
    args = p.parse_args(argv)
    return COMMANDS[args.cmd].run(args, argv if argv is not None else sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
