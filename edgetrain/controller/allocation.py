"""The Slurm allocation a run starts inside (salloc, sbatch, or submit's own job): its nodes and slots.

Read as Lightning's SLURMEnvironment reads it: the nodes from SLURM_JOB_NODELIST (compressed,
``node[1-3,5]``), their slots from SLURM_TASKS_PER_NODE (``2(x3),1``). Inside one, a run's hosts are
the allocation's, with the allocation's slots: the scheduler gave those cores to this job alone.
Without --np, a run takes the tasks the user asked Slurm for (SLURM_NTASKS), as mpirun and srun do.

The variables are read as input like any other: sizes are counted before anything is expanded
(a short list can name billions of nodes), and a node named twice is refused.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace

from edgetrain.controller import scheduler
from edgetrain.controller.inventory import Inventory
from edgetrain.shared.errors import EdgetrainError

JOB_ID = "SLURM_JOB_ID"
NODELIST = "SLURM_JOB_NODELIST"
TASKS_PER_NODE = "SLURM_TASKS_PER_NODE"
NTASKS = "SLURM_NTASKS"
# Past any cluster edgetrain drives: counted before a list is expanded.
MAX_NODES = 10_000
MAX_TASKS = 10_000  # on one node
_RANGE = re.compile(r"([0-9]{1,9})(?:-([0-9]{1,9}))?")
_TASKS = re.compile(r"([0-9]{1,9})(?:\(x([0-9]{1,9})\))?")


@dataclass(frozen=True)
class Allocation:
    job_id: str
    slots: tuple[tuple[str, int], ...]  # (node, tasks on it), in the scheduler's order
    ntasks: int | None = None  # SLURM_NTASKS: the tasks asked for (sbatch -n), where they were

    @property
    def tasks(self) -> int:
        """What a run without --np takes: the tasks asked for, else every task the nodes hold."""
        return self.ntasks if self.ntasks is not None else sum(k for _, k in self.slots)

    @property
    def tasks_from(self) -> str:
        return NTASKS if self.ntasks is not None else TASKS_PER_NODE

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


def _bracket(name: str) -> tuple[str, list[tuple[int, int, int]], str] | None:
    """``rack[1-2,5]-n[01-02]`` -> ``rack``, [(1, 2, 1), (5, 5, 1)] (first, last, width), ``-n[01-02]``; None without brackets."""
    at = name.find("[")
    if at < 0:
        return None
    end = name.index("]", at)
    ranges = []
    for part in name[at + 1:end].split(","):
        m = _RANGE.fullmatch(part)
        if not m:
            raise ValueError(f"{part!r} in {name!r} is not a number or a range")
        first, last = m.group(1), m.group(2) or m.group(1)
        if int(last) < int(first):
            raise ValueError(f"range {part!r} in {name!r} runs backwards")
        ranges.append((int(first), int(last), len(first)))
    return name[:at], ranges, name[end + 1:]


def _count_one(name: str) -> int:
    split = _bracket(name)
    return 1 if split is None else sum(last - first + 1 for first, last, _ in split[1]) * _count_one(split[2])


def _expand_one(name: str) -> list[str]:
    """``rack[1-2]-n[01-02]`` -> rack1-n01, rack1-n02, rack2-n01, rack2-n02 (zero padding kept)."""
    split = _bracket(name)
    if split is None:
        return [name]
    prefix, ranges, rest = split
    tails = _expand_one(rest)
    return [f"{prefix}{i:0{width}d}{tail}" for first, last, width in ranges for i in range(first, last + 1) for tail in tails]


def _parts(text: str) -> list[str]:
    """The list's names, once it is known to name at most MAX_NODES nodes."""
    parts = [part for part in _split_top(text.strip()) if part]
    if sum(_count_one(part) for part in parts) > MAX_NODES:
        raise ValueError(f"{text[:80]!r} names more than {MAX_NODES:,} nodes")
    return parts


def parse_hostlist(text: str) -> list[str]:
    """Slurm's compressed host list, expanded in its order (as ``scontrol show hostnames`` does)."""
    return [host for part in _parts(text) for host in _expand_one(part)]


def parse_tasks(text: str) -> list[int]:
    """SLURM_TASKS_PER_NODE (``2(x3),1``) as one count per node."""
    counts: list[int] = []
    for part in text.strip().split(","):
        m = _TASKS.fullmatch(part)
        if not m:
            raise ValueError(f"{part!r} in {text!r} is not a task count")
        tasks, times = int(m.group(1)), int(m.group(2) or 1)
        if tasks > MAX_TASKS or len(counts) + times > MAX_NODES:
            raise ValueError(f"{text[:80]!r} counts more than {MAX_TASKS:,} tasks on a node or {MAX_NODES:,} nodes")
        counts += [tasks] * times
    return counts


def hostnames(nodelist: str) -> list[str]:
    """The allocation's nodes: Slurm's own expansion where its commands are here, else ours."""
    _parts(nodelist)  # its size, before Slurm's expansion fills memory with it
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
    twice = sorted(n for n, k in Counter(nodes).items() if k > 1)
    if twice:
        raise EdgetrainError(f"Slurm job {job}: {NODELIST} names {', '.join(twice[:5])} more than once",
                             "Slurm never does: see what set the variable")
    ntasks = environ.get(NTASKS)
    if ntasks is not None and not (re.fullmatch("[0-9]{1,9}", ntasks) and 1 <= int(ntasks) <= sum(tasks)):
        raise EdgetrainError(f"Slurm job {job}: {NTASKS}={ntasks[:20]!r} is not a number of tasks from 1 to the {sum(tasks)} its nodes hold")
    return Allocation(job, tuple(zip(nodes, tasks, strict=True)), int(ntasks) if ntasks is not None else None)


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
