"""An emulated Pi's communication threads get a Pi core of their own.

Why: a Pi 4 has four slow cores. Its training threads share them, and the threads that talk to the
other nodes (Horovod's background loop, Gloo's event loops, MPI's progress) run at one core's speed
and take that core from the training while they work. The quota alone (emulation.py) squeezes
all of it into one pool of this machine's CPU, calibrated on convolutions, where this machine leads
a Cortex-A72 by far the most. Communication is copies, sums and TCP buffers, memory-bound work,
where the lead is much smaller: so under the quota alone every communicated byte costs the node's
training several times what it costs on a Pi.

What: each emulated node's group ``G`` (the compute, with its calibrated quota) gets a sibling
group ``G-comm`` with the quota of one Pi core at memory-bound work: this machine's single-core
STREAM copy rate against a Pi 4's (``PI4_CORE_COPY_MB_S``). A mover puts the communication threads
of every process in ``G`` (and the groups below it: a Docker engine's containers) into ``G-comm``.

Which threads: any thread but a process's main thread whose live stack (from its stack pointer to
the end of its stack's mapping) holds a return address into Horovod's library: its background loop
(which also makes the MPI calls when MPI carries the collectives) and Gloo's event loops. Read from ``/proc`` (the thread's stack pointer in ``syscall``, ``maps``,
``mem``; a thread that is never blocked - MPI's polling - is stopped for that moment with
ptrace), with no help from the process, so the seed recipe's ranks and edgetrain's are split
alike. TensorFlow's threads show Horovod's addresses only for the microseconds they spend handing
it a tensor, so a thread moves once it has shown them in two scans in a row.

What this still does not reproduce: the communication threads no longer slow the training at all,
where on a Pi they take one core of four while they work (the comm group's ``cpuacct`` usage, divided
by its quota and by four, bounds what that would have cost: ``training_share_bound``).
"""

from __future__ import annotations

import ctypes
import os
import platform
import re
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from .cpugroup import CpuGroup

# A Raspberry Pi 4's single-core STREAM copy (gcc -O3 stream.c, one thread, no display attached):
# 5,527 MB/s, https://www.sci-pi.org.uk/bench/stream.html. A measured Pi's figure replaces it.
PI4_CORE_COPY_MB_S = 5527.0
# Horovod's library, which carries Gloo. Not MPICH's or UCX's: UCX hooks every thread's memory
# calls, so their addresses turn up on TensorFlow's threads too; MPI's polling under Horovod runs on
# Horovod's background thread anyway.
COMM_LIBRARY = re.compile(r"/horovod/\w+/mpi_lib\.[^/]*\.so$")
SCAN_SECONDS = 0.5
# A thread that showed no communication frames in this many scans is training's for good.
GIVE_UP_SCANS = 20


def copy_rate_mb_s(elements: int = 20_000_000, tries: int = 10) -> float:
    """This machine's single-core STREAM copy rate (16 bytes counted per float64 element, as STREAM does)."""
    a, b = np.ones(elements), np.full(elements, 2.0)
    best = float("inf")
    for _ in range(tries):
        t = time.perf_counter()
        np.copyto(a, b)
        best = min(best, time.perf_counter() - t)
    return 16 * elements / best / 1e6


def comm_cores(copy_mb_s: float, pi_core_mb_s: float = PI4_CORE_COPY_MB_S) -> float:
    """One Pi core at memory-bound work, in this machine's cores."""
    return min(1.0, pi_core_mb_s / copy_mb_s)


def comm_group(group: CpuGroup) -> CpuGroup:
    return CpuGroup(f"{group.name}-comm")


def _maps(pid: int) -> list[tuple[int, int, str, str]]:
    """(start, end, permissions, path) of every mapping of the process."""
    out = []
    with open(f"/proc/{pid}/maps") as maps:
        for line in maps:
            f = line.split(None, 5)
            lo, hi = (int(v, 16) for v in f[0].split("-"))
            out.append((lo, hi, f[1], f[5].strip() if len(f) > 5 else ""))
    return out


def _stack(pid: int, sp: int, maps: list[tuple[int, int, str, str]]) -> bytes | None:
    end = next((hi for lo, hi, _, _ in maps if lo <= sp < hi), None)
    if end is None:
        return None
    with open(f"/proc/{pid}/mem", "rb") as mem:
        mem.seek(sp)
        return mem.read(end - sp)


_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.restype = ctypes.c_long
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
PTRACE_GETREGS, PTRACE_DETACH, PTRACE_SEIZE, PTRACE_INTERRUPT = 12, 17, 0x4206, 0x4207
WALL = 0x40000000  # waitpid's __WALL: the thread is not a child of ours
RSP = 19  # in x86_64's struct user_regs_struct


def _stack_of_runnable(pid: int, tid: int, maps: list[tuple[int, int, str, str]]) -> bytes | None:
    """The stack of a thread that never sleeps in a syscall (MPI's progress polls without end, and
    a throttled group's threads are runnable while they wait for the next period): the kernel
    publishes its stack pointer only while it is blocked, so it is stopped for the moment of the
    read (ptrace, this one thread only), then let go."""
    if platform.machine() != "x86_64" or _libc.ptrace(PTRACE_SEIZE, tid, None, None) != 0:
        return None
    status = None
    try:
        if _libc.ptrace(PTRACE_INTERRUPT, tid, None, None) != 0:
            return None
        _, status = os.waitpid(tid, WALL)
        regs = (ctypes.c_ulonglong * 27)()
        if _libc.ptrace(PTRACE_GETREGS, tid, None, ctypes.byref(regs)) != 0:
            return None
        return _stack(pid, regs[RSP], maps)
    except OSError:
        return None
    finally:
        _let_go(tid, status)


def _let_go(tid: int, status: int | None) -> None:
    """Detach from the thread, handing back a signal it stopped for. A thread that is in no stop
    cannot be detached: either its process is ending (the kill took it out of the stop) or it has
    not yet taken the interrupt. It is waited for first - else, dead, it stays a zombie this
    tracer must reap, and its process never ends (its mpirun waits for it) while the mover runs."""
    while True:
        delivered = os.WSTOPSIG(status) if status is not None and os.WIFSTOPPED(status) and status >> 16 == 0 else 0
        if _libc.ptrace(PTRACE_DETACH, tid, None, delivered) == 0:
            return
        try:
            _, status = os.waitpid(tid, WALL)
        except ChildProcessError:
            return  # reaped, by an earlier wait
        if not os.WIFSTOPPED(status):
            return  # it ended, and that wait reaped it


def shows_comm_frames(pid: int, tid: int, maps: list[tuple[int, int, str, str]]) -> bool | None:
    """Whether the thread's live stack holds a return address into a communication library; None
    when it cannot be told now (the thread is gone)."""
    text = [(lo, hi) for lo, hi, perm, path in maps if "x" in perm and COMM_LIBRARY.search(path)]
    if not text:
        return False
    try:
        fields = Path(f"/proc/{pid}/task/{tid}/syscall").read_text().split()
        data = _stack_of_runnable(pid, tid, maps) if len(fields) < 3 else _stack(pid, int(fields[-2], 16), maps)
    except (OSError, ValueError):
        return None
    if data is None:
        return None
    words = struct.unpack(f"<{len(data) // 8}Q", data[: len(data) // 8 * 8])
    return any(lo <= w < hi for w in words for lo, hi in text)


def _tgid(tid: int) -> int | None:
    try:
        return int(Path(f"/proc/{tid}/status").read_text().split("\nTgid:", 1)[1].split()[0])
    except (OSError, IndexError, ValueError):
        return None


class Mover:
    """Moves the communication threads of the processes in ``groups`` into each group's comm group."""

    def __init__(self, groups: list[CpuGroup]):
        self.groups = groups
        self.streak: dict[int, int] = {}  # tid -> consecutive scans that found communication frames
        self.scans: dict[int, int] = {}  # tid -> scans that could tell
        self.settled: set[int] = set()  # moved, or training's for good

    @staticmethod
    def _tasks(group: CpuGroup) -> list[int]:
        tids = []
        for tasks in group.path().rglob("tasks"):
            try:
                tids += [int(t) for t in tasks.read_text().split()]
            except OSError:
                continue  # a container's group, removed meanwhile
        return tids

    def scan(self) -> list[int]:
        """One pass over every group; returns the threads it moved."""
        moved, maps = [], {}
        live = set()
        for group in self.groups:
            for tid in self._tasks(group):
                live.add(tid)
                pid = _tgid(tid)
                if pid is None or pid == tid or tid in self.settled:
                    continue
                if pid not in maps:
                    try:
                        maps[pid] = _maps(pid)
                    except OSError:
                        continue
                found = shows_comm_frames(pid, tid, maps[pid])
                if found is None:
                    continue
                self.scans[tid] = self.scans.get(tid, 0) + 1
                self.streak[tid] = self.streak.get(tid, 0) + 1 if found else 0
                if self.streak[tid] >= 2:
                    try:
                        comm_group(group).move_thread(tid)
                        moved.append(tid)
                    except OSError:
                        pass  # it ended meanwhile
                    self.settled.add(tid)
                elif self.scans[tid] >= GIVE_UP_SCANS:
                    self.settled.add(tid)
        # Forget threads that ended (or left): their ids may be given to new threads.
        for d in (self.streak, self.scans):
            for tid in d.keys() - live:
                del d[tid]
        self.settled &= live
        return moved

    def run(self, stop: threading.Event, interval: float = SCAN_SECONDS) -> None:
        while not stop.is_set():
            self.scan()
            stop.wait(interval)


@contextmanager
def moving(groups: list[CpuGroup]) -> Iterator[None]:
    """A Mover at work on ``groups`` (their comm groups made and removed here) while the block runs."""
    for g in groups:
        comm_group(g).create()
    stop = threading.Event()
    thread = threading.Thread(target=Mover(groups).run, args=(stop,), daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
        for g in groups:
            comm_group(g).remove()


def training_share_bound(comm_usage_s: float, seconds: float, cores: float, pi_cores: int = 4) -> float:
    """At most what the communication threads' work would have taken from training on a Pi: their
    busy time in Pi-core seconds (CPU seconds here over the comm quota), as a share of four cores."""
    return comm_usage_s / cores / seconds / pi_cores
