"""Raspberry Pi emulation: a CPU quota per testbed node, calibrated on this machine.

Each node's sshd (so everything Hydra starts there) and its Docker engine's containers live in a
cgroup-v1 ``cpu`` group of the node's own (``/sys/fs/cgroup/cpu/<testbed>-nN``); emulating a Pi
writes that group's CFS quota. What a quota is worth depends on the machine, so it is calibrated,
not assumed:

Method: one process of the seed-style LeNet recipe (``seed_lenet.py --calibrate``, batch 64, one
rank) warms up unthrottled in a group of its own, then trains fixed numbers of steps while the
quota is moved (search_quota): a bracket on the quota, narrowed until the median of three
measurements lands within 3% of the target - or within what the spread of this machine's
measurements allows, up to 10% - or until the bracket is narrower than 2% of the quota. img/s is
not proportional to the quota: machines of one kind that train at nearly the same speed unthrottled
have needed quotas half as large again as each other for the same rate (a CFS quota costs
TensorFlow's threads more on some), so a slower machine gets a larger quota, not a lower rate. The
kernel's smallest quota is 1 ms, so a rate that needs less at the requested period (below about
147 img/s at 10 ms here) is calibrated at a period twice as long, and the period used is recorded
with the quota. Results are kept per machine (CPU model, core count, period, TensorFlow) in
``<testbed root>/calibration.json``, so a later ``up --emulate`` reuses them; a real Pi's figure replaces the target with one number.

A mixed cluster (a Pi 5 beside Pi 4s) is nodes calibrated to different rates, each as above: the
rate is all that tells the boards apart here.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from .comm_core import comm_cores, comm_group, copy_rate_mb_s, moving
from . import standin
from .cpugroup import CpuGroup, own_cap

SEED = Path(__file__).with_name("seed_lenet.py")
ROOT = Path(__file__).resolve().parents[1]

# img/s of one Pi 4 training LeNet at batch 64 (the seed recipe): the default board.
PI4_RATE = 250.0
# ASSUMED, not measured: no Pi 5 was measured here. A Pi 5 (Cortex-A76 at 2.4 GHz) is commonly
# measured at 2-3x a Pi 4's CPU throughput; its emulation takes the low end, twice a Pi 4's rate.
# Its communication threads get the same Pi core's worth as a Pi 4's (comm_core.py): no faster
# copy was measured either. A real Pi 5's figure replaces it (pi5:IMG_PER_SEC).
PI5_OVER_PI4 = 2.0
# The boards a node can emulate: the model an inventory names (edgetrain_model), and its default rate.
MODELS = {"pi4": PI4_RATE, "pi5": PI5_OVER_PI4 * PI4_RATE}
# Named profiles, by rate; any model's own name is one too.
RATES = {**MODELS, "pi4-slow": 150.0, "pi4-fast": 400.0}
DEFAULT_PERIOD_US = 10_000
# How long a calibration holds: this machine's speed drifts 10-20% an hour, and a suite that read
# a quota cached seven hours before found the machine training a fifth slower than calibrated.
CACHE_SECONDS = 2 * 3600
# The kernel refuses a CFS quota below 1 ms (EINVAL), so a short period cannot carry a small quota.
MIN_QUOTA_US = 1_000


@dataclass
class Emulation:
    profile: str  # the board and its rate: "pi4:250", "pi4:150", "pi5:500"
    images_per_sec: float
    period_us: int
    quota_us: int
    # The communication threads' own quota, a Pi core's worth (comm_core.py); None: they share quota_us.
    comm_quota_us: int | None = None
    # Other nodes training beside the calibration (standin.py): the testbed keeps its idle nodes busy.
    neighbours: int = 0

    @property
    def model(self) -> str:
        """The board emulated, as an inventory names it (``edgetrain_model``)."""
        return self.profile.partition(":")[0]

    @property
    def cores(self) -> float:
        return self.quota_us / self.period_us

    @property
    def comm_cores(self) -> float | None:
        return self.comm_quota_us / self.period_us if self.comm_quota_us else None

    @property
    def asked(self) -> float:
        """The cores a node may use at once: training its quota and communication its own group's."""
        return self.cores + (self.comm_cores or 0)


def overcommit(boards: Sequence[Emulation], cores: float) -> str | None:
    """Why nodes emulating ``boards`` (one each) cannot all have their CPU at once on ``cores``
    cores, or None when they can. A node training may use its quota and its communication group's
    together (idle nodes train stand-ins under the optimistic bracket); beyond the machine's cores
    the nodes wait for each other, and every figure at more nodes leans low, by more than the
    brackets differ (a fashion bench at 3 nodes that asked 2.7 of 2 cores measured E(N) 21-27
    points under its prediction, and under the pessimistic bracket's)."""
    asked = sum(b.asked for b in boards)
    if asked <= cores:
        return None
    kinds = list({b.profile: b for b in boards}.values())
    each = "; ".join((f"{b.model}: " if len(kinds) > 1 else "") + f"{b.cores:.3f} each"
                     + (f" + {b.comm_cores:.3f} for communication" if b.comm_cores else "") for b in kinds)
    return f"{len(boards)} emulated nodes ask {asked:.2f} of this machine's {cores:g} cores ({each}): figures at more nodes lean low"


def parse_profile(spec: str) -> tuple[str, float]:
    """The board and its img/s: ``pi4`` (250), ``pi4-slow`` (150), ``pi4-fast`` (400), ``pi5``
    (500, assumed: PI5_OVER_PI4), or ``MODEL:RATE`` for a measured board's figure (``pi4:230``)."""
    if spec in RATES:
        return spec.partition("-")[0], RATES[spec]
    name, _, rate = spec.partition(":")
    if name not in MODELS:
        raise ValueError(f"unknown emulation {spec!r}: use {', '.join(RATES)} or MODEL:IMG_PER_SEC ({', '.join(MODELS)})")
    try:
        value = float(rate)
    except ValueError:
        value = 0.0
    if not 1 <= value <= 100_000:
        raise ValueError(f"{spec!r}: the rate must be a Pi's img/s (e.g. {name}:{MODELS[name]:g})")
    return name, value


def _machine_key(period_us: int, comm: bool, neighbours: int) -> str:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.machine())
    # The figure is TensorFlow's speed: another version recalibrates.
    tf = next((v for v in (_version("tensorflow-cpu"), _version("tensorflow")) if v), "?")
    split = ", communication on a core of its own" if comm else ""
    busy = f", {neighbours} nodes training beside it" if neighbours else ""
    # A suite run in a capped group (lab/capped.py) is a slower machine: its quotas are its own.
    cap = own_cap()
    capped = f", capped at {cap:.2f} cores" if cap else ""
    return f"{model} x{len(os.sched_getaffinity(0))}, period {period_us} us, TF {tf}{split}{busy}{capped}"


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


class SeedMeter:
    """One process of the seed recipe (``seed_lenet.py --calibrate``) in a cpu group of its own.

    Entering starts it and waits for its warm-up epoch (unthrottled); ``measure()`` trains one epoch
    of ``steps`` steps and returns its img/s under whatever quota ``limit`` set meanwhile. With
    ``comm_cores``, its communication threads move to a group of their own, as on an emulated node;
    with ``neighbours``, that many stand-ins (standin.py) train beside it, each in a group of its own
    under the same quota, as the other nodes of a testbed do.
    """

    def __init__(self, group_name: str, steps: int, python: str = sys.executable, comm_cores: float | None = None,
                 neighbours: int = 0):
        self.group, self.steps, self.python = CpuGroup.mine(group_name), steps, python
        self.beside = [CpuGroup.mine(f"{group_name}-beside{i + 1}") for i in range(neighbours)]
        self.comm_cores = comm_cores
        self.proc: subprocess.Popen | None = None
        self._stack = contextlib.ExitStack()

    def limit(self, quota_us: int, period_us: int) -> None:
        for g in [self.group, *self.beside]:
            g.limit(quota_us, period_us)
            if self.comm_cores:
                comm_group(g).limit(round(self.comm_cores * period_us), period_us)

    def __enter__(self) -> SeedMeter:
        try:
            for g in [self.group, *self.beside]:
                g.create()
                self._stack.callback(g.remove)
            if self.comm_cores:
                self._stack.enter_context(moving([self.group, *self.beside]))
            for g in self.beside:
                self._stack.callback(standin.stop, [standin.start(g, self.python)])
            self.proc = subprocess.Popen([self.python, str(SEED), "--calibrate", "--steps-per-epoch", str(self.steps)],
                                         cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                         text=True)
            self.group.move(self.proc.pid)
            self._next_event()  # ready: the warm-up epoch is done
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        if self.proc is not None:
            standin.stop([self.proc])
        self._stack.close()

    def _next_event(self) -> dict:
        assert self.proc is not None and self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith("{"):
                return json.loads(line)
        raise RuntimeError("the seed process measuring img/s ended early")

    def measure(self) -> float:
        assert self.proc is not None and self.proc.stdin is not None
        self.proc.stdin.write("measure\n")
        self.proc.stdin.flush()
        return self._next_event()["images_per_sec"]


def machine_cores() -> float:
    """The cores the emulated nodes share: this process's CPUs, or fewer where a group above it caps them."""
    cores = len(os.sched_getaffinity(0))
    cap = own_cap()
    return min(cores, cap) if cap else cores


def measurement_steps(target: float) -> int:
    """About 10 s of training per measurement at the target rate."""
    return max(20, int(target * 10 / 64))


# The search (search_quota): land within 3% of the target where the machine's noise allows; where
# measurements wander more, within what their spread allows, up to 10%. Noisier than that, a
# calibration would mean nothing and fails, naming the spread.
TOLERANCE = 0.03
MAX_TOLERANCE = 0.10
# A bracket this narrow (a share of its quota) is as fine as a quota need be: it ends the search
# whatever the noise does to the last measurement.
RESOLUTION = 0.02
MAX_STEPS = 16
MEASUREMENTS = 3  # a step's rate is their median: single ones wander by several percent here
NOISE_POINTS = 6  # steps before the noise is known well enough to give up on it (12 degrees of freedom)


@dataclass(frozen=True)
class Point:
    """The rates measured at one quota."""

    quota_us: int
    period_us: int
    rates: tuple[float, ...]
    # Not measured here: the target bracketed between two quotas closer than RESOLUTION, with their rates.
    bracketed: bool = False

    @property
    def cores(self) -> float:
        return self.quota_us / self.period_us

    @property
    def rate(self) -> float:
        return statistics.median(self.rates)

    @property
    def spread(self) -> float:
        """max - min over the median: how far this machine's measurements wander at one setting."""
        return (max(self.rates) - min(self.rates)) / self.rate


class CalibrationError(RuntimeError):
    pass


def noise(points: list[Point]) -> float:
    """The pooled relative standard deviation of every step's measurements about their step's mean."""
    steps = [p for p in points if len(p.rates) >= MEASUREMENTS]
    freedom = sum(len(p.rates) - 1 for p in steps)
    if not freedom:
        return 0.0
    return math.sqrt(sum((r / statistics.fmean(p.rates) - 1) ** 2 for p in steps for r in p.rates) / freedom)


def needed_tolerance(points: list[Point]) -> float:
    """Twice the standard error of a step's median (about 0.67 of the noise for three), at least TOLERANCE."""
    return max(TOLERANCE, 2 * 0.67 * noise(points))


def quota_at(cores: float, period_us: int, max_cores: float) -> tuple[int, int]:
    """(quota, period) for a share of the cores: the period doubled until the quota is one the kernel takes."""
    cores = min(cores, max_cores)
    while cores * period_us < MIN_QUOTA_US:
        period_us *= 2  # a slow Pi: the same share of a core over a longer period
    return max(MIN_QUOTA_US, round(cores * period_us)), period_us


def fair_share(cores: float, neighbours: int) -> float:
    """One process's share of the cores beside ``neighbours`` as busy: what its unthrottled rate
    was measured on, and the most a quota can give it. Above the share the processes contend for
    the cores, and a step measures the contention: on a machine where a node needs most of its
    share, the search's first guess landed there and the noise ended the calibration."""
    return cores / (1 + neighbours)


def search_quota(measure, target: float, unthrottled: float, max_cores: float, period_us: int = DEFAULT_PERIOD_US,
                 log=print, guess: float | None = None) -> tuple[Point, float]:
    """The quota at which ``measure(quota_us, period_us)`` (a list of img/s) gives ``target``, and
    the tolerance it was judged by.

    img/s rises with the quota, but not in proportion (under a quota TensorFlow's threads lose
    more than their share on some machines), and every measurement is noisy. So: a bracket on
    the quota - the highest one measured below the target, the lowest above, starting from the
    unthrottled rate above - each step measuring where the straight line between them meets the
    target, kept at least a fifth of the bracket from either end so that the bracket shrinks even
    when the line is off. Before both ends exist, steps are proportional guesses, the first
    ``guess`` (cores) where one is given (``first_guess``), else the unthrottled rate's. The search ends
    when a step's median lands within the tolerance, or when the bracket is narrower than
    RESOLUTION (the noise, not the quota, is then what stops a landing).
    """
    lo: Point | None = None
    hi = Point(round(max_cores * period_us), period_us, (unthrottled,))
    if unthrottled < target:
        raise CalibrationError(f"this machine trains at {unthrottled:.0f} img/s unthrottled, below the target {target:g}")
    points: list[Point] = []
    cores = guess or max_cores * target / unthrottled
    for _ in range(MAX_STEPS):
        quota, period = quota_at(cores, period_us, max_cores)
        point = Point(quota, period, tuple(measure(quota, period)))
        points.append(point)
        tol = needed_tolerance(points)
        log(f"calibration: quota {quota} us / {period} us -> {point.rate:.0f} img/s "
            f"(target {target:g}, spread {point.spread:.1%}, tolerance {tol:.1%})")
        if tol > MAX_TOLERANCE and len(points) >= NOISE_POINTS:
            raise CalibrationError(f"calibration to {target:g} img/s: measurements of one setting spread by "
                                   f"{_spreads(points)} (noise {noise(points):.1%}), too noisy to calibrate within {MAX_TOLERANCE:.0%}")
        if tol <= MAX_TOLERANCE and abs(point.rate - target) <= tol * target:
            return point, tol
        if point.rate < target:
            lo = point
        else:
            hi = point
        if lo is None:  # every throttled step above the target so far
            cores = min(hi.cores / 1.02, hi.cores * target / hi.rate)
            continue
        width = hi.cores - lo.cores
        if len(hi.rates) < MEASUREMENTS:  # above: only the unthrottled rate, no throttled step yet
            cores = min(max(lo.cores * 1.02, lo.cores * target / lo.rate), hi.cores)
            continue
        if width <= RESOLUTION * hi.cores and tol <= MAX_TOLERANCE:
            quota, period = quota_at(lo.cores + width * (target - lo.rate) / (hi.rate - lo.rate), period_us, max_cores)
            log(f"calibration: {target:g} img/s lies between quotas {lo.quota_us} and {hi.quota_us} us "
                f"(/ {lo.period_us} and {hi.period_us} us): {quota} us / {period} us")
            return Point(quota, period, (lo.rate, hi.rate), bracketed=True), tol
        cores = lo.cores + width * (target - lo.rate) / (hi.rate - lo.rate)
        cores = min(max(cores, lo.cores + 0.2 * width), hi.cores - 0.2 * width)
    raise CalibrationError(
        f"calibration to {target:g} img/s did not converge in {MAX_STEPS} steps: the target lies between "
        f"{lo.quota_us if lo else MIN_QUOTA_US} us ({lo.rate if lo else 0:.0f} img/s) and {hi.quota_us} us ({hi.rate:.0f} img/s); "
        f"measurements of one setting spread by {_spreads(points)}, tolerance {min(needed_tolerance(points), MAX_TOLERANCE):.1%}")


def _spreads(points: list[Point]) -> str:
    spreads = sorted(p.spread for p in points)
    return f"{spreads[0]:.1%} to {spreads[-1]:.1%} (median {statistics.median(spreads):.1%})"


def first_guess(calibrated: dict[str, dict], target: float, now: float) -> tuple[float, str] | None:
    """Cores for ``target`` scaled from the nearest other rate this machine calibrated under the same
    conditions within CACHE_SECONDS (``calibrated``: one cache key's entries, by rate), and what it
    came from; None with none. A first step near the answer saves the search a step or more of
    three measurements: a Pi 5 at 500 img/s took 3198 us where a Pi 4 at 250 took 1632 (2026-12-05)."""
    fresh = {float(rate): e for rate, e in calibrated.items() if now - e.get("made", 0) < CACHE_SECONDS and float(rate) != target}
    if not fresh:
        return None
    rate = min(fresh, key=lambda r: abs(math.log(r / target)))
    known = fresh[rate]
    return known["quota_us"] / known.get("period_us", DEFAULT_PERIOD_US) * target / rate, f"{rate:g} img/s at {known['quota_us']} us"


def _still_holds(cached: Emulation, group_name: str, python: str, log) -> bool:
    """Whether a cached quota still gives its rate, within MAX_TOLERANCE: this machine's speed
    drifts by a fifth within two hours (the suite once failed its drift guard on a quota cached 1.6
    hours before: 305 img/s for 250)."""
    comm = cached.comm_quota_us / cached.period_us if cached.comm_quota_us else None
    with SeedMeter(group_name, measurement_steps(cached.images_per_sec), python, comm_cores=comm,
                   neighbours=cached.neighbours) as meter:
        meter.limit(cached.quota_us, cached.period_us)
        rate = statistics.median(meter.measure() for _ in range(MEASUREMENTS))
    holds = abs(rate - cached.images_per_sec) <= MAX_TOLERANCE * cached.images_per_sec
    log(f"calibration: the cached quota gives {rate:.0f} img/s now for {cached.images_per_sec:g}: "
        + ("kept" if holds else "calibrating again"))
    return holds


def calibrate(target: float, group_name: str, *, model: str = "pi4", period_us: int = DEFAULT_PERIOD_US, cache: Path | None = None,
              python: str = sys.executable, comm: bool = True, neighbours: int = 0, log=print) -> Emulation:
    """The quota at which one node of this machine, emulating a ``model`` board, trains the seed LeNet at ``target`` img/s; with
    ``comm``, its communication threads on a Pi core of their own (comm_core.py) meanwhile, and
    ``neighbours`` stand-ins training beside it under the same quota (standin.py)."""
    key = _machine_key(period_us, comm, neighbours)
    known = json.loads(cache.read_text()) if cache and cache.exists() else {}
    hit = known.get(key, {}).get(f"{target:g}")
    if hit and time.time() - hit.get("made", 0) < CACHE_SECONDS:
        cached = Emulation(profile=f"{model}:{target:g}", images_per_sec=target, period_us=hit.get("period_us", period_us),
                           quota_us=hit["quota_us"], comm_quota_us=hit.get("comm_quota_us"), neighbours=neighbours)
        if _still_holds(cached, group_name, python, log):
            return cached

    guess = first_guess(known.get(key, {}), target, time.time())
    if guess:
        log(f"calibration: first step scaled from {guess[1]}, calibrated here")
    copy = copy_rate_mb_s() if comm else None
    pi_core = comm_cores(copy) if copy else None
    if pi_core:
        log(f"calibration: one core copies {copy:,.0f} MB/s here (STREAM copy): a Pi core's communication is {pi_core:.3f} of it")
    with SeedMeter(group_name, measurement_steps(target), python, comm_cores=pi_core, neighbours=neighbours) as meter:
        full = meter.measure()

        def measure(quota: int, period: int) -> list[float]:
            meter.limit(quota, period)
            return [meter.measure() for _ in range(MEASUREMENTS)]

        found, tol = search_quota(measure, target, full, fair_share(machine_cores(), neighbours), period_us, log,
                                  guess[0] if guess else None)
    comm_quota = round(pi_core * found.period_us) if pi_core else None
    if cache is not None:
        known.setdefault(key, {})[f"{target:g}"] = {"quota_us": found.quota_us, "period_us": found.period_us,
                                                    "measured": [round(r, 1) for r in found.rates], "tolerance": round(tol, 3),
                                                    "bracketed": found.bracketed,
                                                    "unthrottled": round(full, 1), "comm_quota_us": comm_quota,
                                                    "copy_mb_s": round(copy) if copy else None, "made": round(time.time())}
        cache.parent.mkdir(parents=True, exist_ok=True)  # a first calibration may come before any testbed
        cache.write_text(json.dumps(known, indent=2))
    return Emulation(profile=f"{model}:{target:g}", images_per_sec=target, period_us=found.period_us, quota_us=found.quota_us,
                     comm_quota_us=comm_quota, neighbours=neighbours)
