"""The Slurm allocation a run starts inside (salloc, sbatch, or submit's own job): its nodes and slots.

Read as Lightning's SLURMEnvironment reads it: the nodes from SLURM_JOB_NODELIST (compressed,
``node[1-3,5]``), their slots from SLURM_TASKS_PER_NODE (``2(x3),1``). Inside one, a run's hosts are
the allocation's, with the allocation's slots: the scheduler gave those cores to this job alone.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, replace

from edgetrain.controller import scheduler
from edgetrain.controller.inventory import Inventory
from edgetrain.shared.errors import EdgetrainError

JOB_ID = "SLURM_JOB_ID"
NODELIST = "SLURM_JOB_NODELIST"
TASKS_PER_NODE = "SLURM_TASKS_PER_NODE"
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")
_TASKS = re.compile(r"^(\d+)(?:\(x(\d+)\))?$")


@dataclass(frozen=True)
class Allocation:
    job_id: str
    slots: tuple[tuple[str, int], ...]  # (node, tasks on it), in the scheduler's order

    @property
    def nodes(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.slots)


def _split_top(text: str) -> list[str]:
    """``a[1-2],b`` -> ``a[1-2]``, ``b``: commas outside brackets separate names."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        depth += {"[": 1, "]": -1}.get(c, 0)
        if depth < 0:
            raise ValueError(f"unbalanced ']' in {text!r}")
        if c == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"unbalanced '[' in {text!r}")
    return [*parts, text[start:]]


def _expand_one(name: str) -> list[str]:
    """``rack[1-2]-n[01-02]`` -> rack1-n01, rack1-n02, rack2-n01, rack2-n02 (zero padding kept)."""
    at = name.find("[")
    if at < 0:
        return [name]
    end = name.index("]", at)
    prefix, ranges, rest = name[:at], name[at + 1:end], name[end + 1:]
    out = []
    for part in ranges.split(","):
        m = _RANGE.match(part)
        if not m:
            raise ValueError(f"{part!r} in {name!r} is not a number or a range")
        first, last = m.group(1), m.group(2) or m.group(1)
        if int(last) < int(first):
            raise ValueError(f"range {part!r} in {name!r} runs backwards")
        width = len(first)
        out += [f"{prefix}{i:0{width}d}{tail}" for i in range(int(first), int(last) + 1) for tail in _expand_one(rest)]
    return out


def parse_hostlist(text: str) -> list[str]:
    """Slurm's compressed host list, expanded in its order (as ``scontrol show hostnames`` does)."""
    return [host for part in _split_top(text.strip()) if part for host in _expand_one(part)]


def parse_tasks(text: str) -> list[int]:
    """SLURM_TASKS_PER_NODE (``2(x3),1``) as one count per node."""
    counts = []
    for part in text.strip().split(","):
        m = _TASKS.match(part)
        if not m:
            raise ValueError(f"{part!r} in {text!r} is not a task count")
        counts += [int(m.group(1))] * int(m.group(2) or 1)
    return counts


def hostnames(nodelist: str) -> list[str]:
    """The allocation's nodes: Slurm's own expansion where its commands are here, else ours."""
    scontrol = shutil.which("scontrol")
    if scontrol and scheduler.configured():
        r = subprocess.run([scontrol, "show", "hostnames", nodelist], capture_output=True, text=True, timeout=30, check=False)
        if r.returncode == 0 and r.stdout.split():
            return r.stdout.split()
    return parse_hostlist(nodelist)


def current(environ: Mapping[str, str] = os.environ) -> Allocation | None:
    """The allocation this process runs in, or None outside Slurm."""
    job, nodelist = environ.get(JOB_ID), environ.get(NODELIST)
    if not job or not nodelist:
        return None
    try:
        nodes = hostnames(nodelist)
        tasks = parse_tasks(environ.get(TASKS_PER_NODE) or ",".join("1" for _ in nodes))
    except ValueError as exc:
        raise EdgetrainError(f"Slurm job {job}: cannot read its allocation: {exc}") from None
    if len(tasks) != len(nodes):
        raise EdgetrainError(f"Slurm job {job}: {TASKS_PER_NODE} counts {len(tasks)} nodes, {NODELIST} names {len(nodes)}")
    return Allocation(job, tuple(zip(nodes, tasks, strict=True)))


def within(inventory: Inventory, allocation: Allocation | None) -> Inventory:
    """The inventory's hosts the allocation holds, in its order and with its slots; the rest are not
    this job's to use. Every allocated node must be one of the inventory's."""
    if allocation is None:
        return inventory
    by_name = {h.name: h for h in inventory.hosts}
    unknown = [n for n in allocation.nodes if n not in by_name]
    if unknown:
        raise EdgetrainError(f"Slurm job {allocation.job_id} holds {', '.join(unknown)}, which inventory {inventory.source} does not name",
                             "use the inventory the cluster (and its slurm.conf) was provisioned from")
    return replace(inventory, hosts=tuple(replace(by_name[n], slots=k) for n, k in allocation.slots))
