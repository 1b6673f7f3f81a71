"""Idle emulated nodes keep training, so that no node is faster for being alone.

Emulated nodes share this machine's two cores and their caches; Pis share nothing. One node
training LeNet alone ran at 255 and 261 img/s; three nodes training at once, with no communication
between them, at 197-215 img/s each. Against a lone node that had the machine to itself, a job on
three nodes would lose a fifth of E(3) to the emulation alone.

So every emulated node is always busy: a node with no training of its own runs a stand-in, one
process of the seed recipe (``seed_lenet.py --stand-in``) in the node's group, stopped (SIGSTOP)
while anything else in the node has TensorFlow or torch loaded and continued (SIGCONT) once nothing does. The
calibration runs as many stand-ins beside its measured process as the testbed has other nodes
(emulation.py), so the calibrated rate is a node's rate while every node works.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from edgetrain.shared import lifetime, tempdirs

from .cpugroup import CpuGroup

SEED = Path(__file__).with_name("seed_lenet.py")
SCRATCH = "seed"  # the kind of temp directory the seed process makes itself (seed_lenet.py)
ROOT = Path(__file__).resolve().parents[1]
# What a process that trains has mapped: TensorFlow's framework, or torch's CPU library.
TRAINING_LIBRARIES = ("/libtensorflow_framework.so", "/libtorch_cpu.so")


def _die_with_parent() -> None:
    # A stand-in must not outlive whoever keeps it (a daemon killed by SIGKILL included).
    lifetime.end_with_parent(signal.SIGKILL)


def start(group: CpuGroup, python: str = sys.executable) -> subprocess.Popen:
    """A stand-in in ``group``, moved in before it loads anything, so all of its work is charged there."""
    proc = subprocess.Popen([python, str(SEED), "--stand-in"], cwd=ROOT, stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=_die_with_parent)  # noqa: PLW1509 - one libc call (prctl), loaded before the fork
    try:
        group.move(proc.pid)
    except OSError:
        proc.kill()
        proc.wait()
        raise
    return proc


def stop(procs: list[subprocess.Popen]) -> None:
    """Kill seed processes and remove the temp directories they could not (seed_lenet.py)."""
    for p in procs:
        with contextlib.suppress(ProcessLookupError):
            p.kill()  # SIGKILL also ends a stopped process
    for p in procs:
        p.wait()
        for left in Path(tempfile.gettempdir()).glob(tempdirs.prefix(SCRATCH, p.pid) + "*"):
            shutil.rmtree(left, ignore_errors=True)


def _trains(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/maps") as maps:
            return any(lib in line for line in maps for lib in TRAINING_LIBRARIES)
    except OSError:
        return False


class StandIns:
    """One stand-in per node group, stopped while the node trains something of its own."""

    def __init__(self, groups: list[CpuGroup], python: str = sys.executable):
        self.procs = {g.name: start(g, python) for g in groups}
        self.groups = groups
        self.paused: set[str] = set()

    def scan(self) -> None:
        for g in self.groups:
            mine = self.procs[g.name].pid
            busy = any(_trains(p) for p in g.pids() - {mine})
            if busy and g.name not in self.paused:
                os.kill(mine, signal.SIGSTOP)
                self.paused.add(g.name)
            elif not busy and g.name in self.paused:
                os.kill(mine, signal.SIGCONT)
                self.paused.discard(g.name)

    def close(self) -> None:
        stop(list(self.procs.values()))
