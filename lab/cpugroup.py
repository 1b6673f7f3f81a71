"""A cgroup-v1 CPU group: what an emulated node's CPU is made of (emulation.py, comm_core.py)."""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import time
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
CONTROLLERS = ("cpu", "cpuacct")


def own_group() -> str:
    """The cpu group this process runs in, relative to the hierarchy's root ("" at the root).

    Groups the tests make go below it, so a suite run inside a capped group (``lab/capped.py``,
    a stand-in for a slower machine) cannot give its nodes, ranks or containers more CPU than it has.
    """
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return path.strip("/")
    return ""


def own_cap() -> float | None:
    """The fewest cores the groups above this process allow (their CFS quotas), None when unlimited."""
    caps, group = [], CGROUP_ROOT / "cpu" / own_group()
    while group != CGROUP_ROOT / "cpu":
        quota = int((group / "cpu.cfs_quota_us").read_text())
        if quota > 0:
            caps.append(quota / int((group / "cpu.cfs_period_us").read_text()))
        group = group.parent
    return min(caps) if caps else None


class CpuGroup:
    """One cgroup-v1 group in the cpu and cpuacct hierarchies; ``name`` is its path from their root."""

    def __init__(self, name: str):
        self.name = name

    @classmethod
    def mine(cls, name: str) -> CpuGroup:
        """A group called ``name`` below the one this process runs in (own_group)."""
        parent = own_group()
        return cls(f"{parent}/{name}" if parent else name)

    def path(self, controller: str = "cpu") -> Path:
        return CGROUP_ROOT / controller / self.name

    def create(self) -> None:
        for c in CONTROLLERS:
            self.path(c).mkdir(parents=True, exist_ok=True)

    def move(self, pid: int) -> None:
        for c in CONTROLLERS:
            (self.path(c) / "cgroup.procs").write_text(f"{pid}\n")

    def command(self, cmd: list[str]) -> list[str]:
        """The command, started inside the group (the shell moves itself in, then execs it)."""
        move = " && ".join(f"echo $$ > {self.path(c)}/cgroup.procs" for c in CONTROLLERS)
        return ["sh", "-c", f'{move} && exec "$@"', "sh", *cmd]

    def pids(self) -> set[int]:
        """The processes in the group and the groups below it (a Docker engine's containers)."""
        pids: set[int] = set()
        for procs in self.path().rglob("cgroup.procs"):
            with contextlib.suppress(OSError):  # a container's group, removed meanwhile
                pids |= {int(p) for p in procs.read_text().split()}
        return pids

    def kill(self) -> None:
        """End every process in the group - whoever made the group started them. A process group
        does not reach them all: Hydra starts each proxy and rank in a session of its own."""
        for pid in self.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)

    def move_thread(self, tid: int) -> None:
        """One thread, leaving the rest of its process where it is (cgroup v1 allows it)."""
        for c in CONTROLLERS:
            (self.path(c) / "tasks").write_text(f"{tid}\n")

    def limit(self, quota_us: int, period_us: int) -> None:
        cpu = self.path()
        # The kernel refuses a period below the quota already set: lift the quota first.
        (cpu / "cpu.cfs_quota_us").write_text("-1\n")
        (cpu / "cpu.cfs_period_us").write_text(f"{period_us}\n")
        (cpu / "cpu.cfs_quota_us").write_text(f"{quota_us}\n")

    def unlimit(self) -> None:
        (self.path() / "cpu.cfs_quota_us").write_text("-1\n")

    def quota(self) -> tuple[int, int]:
        cpu = self.path()
        return int((cpu / "cpu.cfs_quota_us").read_text()), int((cpu / "cpu.cfs_period_us").read_text())

    def stat(self) -> dict[str, int]:
        """cpu.stat (periods, throttled periods, throttled ns) and the CPU ns used (cpuacct.usage)."""
        out = dict(line.split() for line in (self.path() / "cpu.stat").read_text().splitlines())
        stat = {k: int(v) for k, v in out.items()}
        stat["usage_ns"] = int((self.path("cpuacct") / "cpuacct.usage").read_text())
        return stat

    def wait_while_working(self, done, what: str, *, alive=lambda: True, stall_s: float = 120.0,
                           ceiling_s: float = 1200.0) -> None:
        """Wait until ``done()`` for as long as the group's processes keep using CPU.

        How long work inside a quota takes depends on the machine (a CFS quota costs TensorFlow's
        threads more on some machines of one kind than on others), so no fixed deadline: the wait
        fails when the group used no CPU for ``stall_s``, when ``alive()`` turns false, or - for
        work that spins without getting anywhere - after ``ceiling_s``.
        """
        start = last_move = time.monotonic()
        used = self.stat()["usage_ns"]
        while not done():
            assert alive(), f"ended before {what}"
            now, usage = time.monotonic(), self.stat()["usage_ns"]
            if usage > used:
                used, last_move = usage, now
            assert now - last_move < stall_s, f"no {what}: the group used no CPU for {stall_s:.0f} s"
            assert now - start < ceiling_s, f"no {what} within {ceiling_s:.0f} s though the group kept using CPU"
            time.sleep(0.2)

    def remove(self) -> None:
        """Remove the group and whatever groups were made below it (a Docker engine's, in every hierarchy)."""
        for hierarchy in CGROUP_ROOT.iterdir():
            top = hierarchy / self.name
            if not top.is_dir() or top.is_symlink():
                continue
            for d in sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
                _rmdir(d)
            _rmdir(top)


def _rmdir(group: Path, timeout: float = 10.0) -> None:
    """A group is busy until its last process has been reaped, a moment after it was killed."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            group.rmdir()
            return
        except OSError as e:
            if e.errno != errno.EBUSY or time.monotonic() > deadline:
                raise
            time.sleep(0.2)
