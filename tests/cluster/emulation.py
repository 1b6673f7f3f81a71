"""Raspberry Pi 4 emulation: a CPU quota per testbed node, calibrated on this machine.

Each node's sshd (so everything Hydra starts there) and its Docker engine's containers live in a
cgroup-v1 ``cpu`` group of the node's own (``/sys/fs/cgroup/cpu/<testbed>-nN``); emulating a Pi
writes that group's CFS quota. What a quota is worth depends on the machine, so it is calibrated,
not assumed:

Method: one process of the seed-style LeNet recipe (``seed_lenet.py --calibrate``, batch 64, one
rank) warms up unthrottled in a group of its own, then trains fixed numbers of steps while the
quota is moved: starting from the unthrottled rate, each measurement rescales the quota by target /
measured (img/s is close to proportional to CPU time), until the median of three measurements lands
within 3% of the target. The kernel's smallest quota is 1 ms, so a rate that needs less at the
requested period (below about 147 img/s at 10 ms here) is calibrated at a period twice as long, and
the period used is recorded with the quota. Results are kept per machine (CPU model, core count,
period, TensorFlow) in ``<testbed root>/calibration.json``, so a later ``up --emulate`` reuses
them; a real Pi's figure replaces the target with one number.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from .comm_core import comm_cores, comm_group, copy_rate_mb_s, moving
from . import standin
from .cpugroup import CpuGroup

SEED = Path(__file__).with_name("seed_lenet.py")
ROOT = Path(__file__).resolve().parents[2]

# img/s of one Pi 4 training LeNet at batch 64 (the seed recipe), by profile; 250 is the default.
PI4_RATES = {"pi4": 250.0, "pi4-slow": 150.0, "pi4-fast": 400.0}
DEFAULT_PERIOD_US = 10_000
# The kernel refuses a CFS quota below 1 ms (EINVAL), so a short period cannot carry a small quota.
MIN_QUOTA_US = 1_000


@dataclass
class Emulation:
    profile: str  # e.g. "pi4" or "pi4:150"
    images_per_sec: float
    period_us: int
    quota_us: int
    # The communication threads' own quota, a Pi core's worth (comm_core.py); None: they share quota_us.
    comm_quota_us: int | None = None
    # Other nodes training beside the calibration (standin.py): the testbed keeps its idle nodes busy.
    neighbours: int = 0

    @property
    def cores(self) -> float:
        return self.quota_us / self.period_us

    @property
    def comm_cores(self) -> float | None:
        return self.comm_quota_us / self.period_us if self.comm_quota_us else None


def parse_profile(spec: str) -> float:
    """``pi4`` (250 img/s), ``pi4-slow``, ``pi4-fast``, or ``pi4:RATE`` for a measured Pi's figure."""
    name, _, rate = spec.partition(":")
    if name != "pi4":
        if spec in PI4_RATES:
            return PI4_RATES[spec]
        raise ValueError(f"unknown emulation {spec!r}: use pi4, pi4-slow, pi4-fast or pi4:IMG_PER_SEC")
    value = float(rate) if rate else PI4_RATES["pi4"]
    if not 1 <= value <= 100_000:
        raise ValueError(f"{spec!r}: the rate must be a Pi's img/s (e.g. pi4:250)")
    return value


def _machine_key(period_us: int, comm: bool, neighbours: int) -> str:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.machine())
    # The figure is TensorFlow's speed: another version recalibrates.
    tf = next((v for v in (_version("tensorflow-cpu"), _version("tensorflow")) if v), "?")
    split = ", communication on a core of its own" if comm else ""
    busy = f", {neighbours} nodes training beside it" if neighbours else ""
    return f"{model} x{len(os.sched_getaffinity(0))}, period {period_us} us, TF {tf}{split}{busy}"


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
        self.group, self.steps, self.python = CpuGroup(group_name), steps, python
        self.beside = [CpuGroup(f"{group_name}-beside{i + 1}") for i in range(neighbours)]
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
            self.proc.kill()
            self.proc.wait()
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

    def median(self, n: int = 3) -> float:
        return statistics.median(self.measure() for _ in range(n))


def measurement_steps(target: float) -> int:
    """About 10 s of training per measurement at the target rate."""
    return max(20, int(target * 10 / 64))


def calibrate(target: float, group_name: str, *, period_us: int = DEFAULT_PERIOD_US, cache: Path | None = None,
              python: str = sys.executable, comm: bool = True, neighbours: int = 0, log=print) -> Emulation:
    """The quota at which one node of this machine trains the seed LeNet at ``target`` img/s; with
    ``comm``, its communication threads on a Pi core of their own (comm_core.py) meanwhile, and
    ``neighbours`` stand-ins training beside it under the same quota (standin.py)."""
    key = _machine_key(period_us, comm, neighbours)
    known = json.loads(cache.read_text()) if cache and cache.exists() else {}
    hit = known.get(key, {}).get(f"{target:g}")
    if hit:
        return Emulation(profile=f"pi4:{target:g}", images_per_sec=target, period_us=hit.get("period_us", period_us),
                         quota_us=hit["quota_us"], comm_quota_us=hit.get("comm_quota_us"), neighbours=neighbours)

    period = period_us
    copy = copy_rate_mb_s() if comm else None
    pi_core = comm_cores(copy) if copy else None
    if pi_core:
        log(f"calibration: one core copies {copy:,.0f} MB/s here (STREAM copy): a Pi core's communication is {pi_core:.3f} of it")
    with SeedMeter(group_name, measurement_steps(target), python, comm_cores=pi_core, neighbours=neighbours) as meter:
        full = meter.measure()
        cores = len(os.sched_getaffinity(0))
        quota = max(MIN_QUOTA_US, min(cores * period, int(period * cores * target / full)))
        # Each step is judged on the median of three measurements: single ones wander by several
        # percent on a shared machine, and one lucky measurement must not end the search.
        for _ in range(8):
            meter.limit(quota, period)
            rate = meter.median()
            log(f"calibration: quota {quota} us / {period} us -> {rate:.0f} img/s (target {target:g})")
            if abs(rate - target) <= 0.03 * target:
                break
            if quota == MIN_QUOTA_US and rate > target:
                # A slow Pi needs less than the kernel's smallest quota at this period: the same
                # share of a core over a period twice as long.
                period *= 2
                quota = 2 * MIN_QUOTA_US
                log(f"calibration: {target:g} img/s needs less than {MIN_QUOTA_US} us a period; period now {period} us")
                continue
            quota = max(MIN_QUOTA_US, int(quota * target / rate))
        else:
            raise RuntimeError(f"calibration to {target:g} img/s did not converge (last {rate:.0f} img/s at quota {quota} us / {period} us)")
    comm_quota = round(pi_core * period) if pi_core else None
    if cache is not None:
        known.setdefault(key, {})[f"{target:g}"] = {"quota_us": quota, "period_us": period, "measured": round(rate, 1),
                                                    "unthrottled": round(full, 1), "comm_quota_us": comm_quota,
                                                    "copy_mb_s": round(copy) if copy else None}
        cache.parent.mkdir(parents=True, exist_ok=True)  # a first calibration may come before any testbed
        cache.write_text(json.dumps(known, indent=2))
    return Emulation(profile=f"pi4:{target:g}", images_per_sec=target, period_us=period, quota_us=quota,
                     comm_quota_us=comm_quota, neighbours=neighbours)
