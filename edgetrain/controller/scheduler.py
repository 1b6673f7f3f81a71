"""Slurm, where a shared cluster queues its runs: submit a run as a batch job, list and cancel the
queued ones, and the scheduler's view of the nodes (docs/provisioning.md#slurm).

A submitted run's id is chosen here and given to the job (RUN_ID_ENV), so that the queue, the run
directory and ``edgetrain cancel`` name one run alike; the job is named JOB_PREFIX + that id.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from edgetrain.controller import placement
from edgetrain.controller.config import LaunchConfig
from edgetrain.controller.inventory import DEVICE_GROUPS, Inventory
from edgetrain.shared import runs
from edgetrain.shared.errors import EdgetrainError

RUN_ID_ENV = "EDGETRAIN_RUN_ID"
JOB_PREFIX = "edgetrain:"
DEFAULT_CONF = Path("/etc/slurm/slurm.conf")
_FIELDS = ("%i", "%j", "%T", "%u", "%D", "%N", "%r")


class JobState(str, Enum):
    """The squeue states a queued or running edgetrain job is shown with."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    OTHER = "OTHER"  # completing, suspended, ...: on its way


@dataclass(frozen=True)
class Job:
    job_id: str
    run_id: str
    state: JobState
    user: str
    nodes: int
    nodelist: str
    reason: str


# The states sinfo gives a node that takes jobs (its flags after: * not responding, ~ powered off, ...).
USABLE = ("idle", "allocated", "mixed", "completing")


@dataclass(frozen=True)
class NodeView:
    name: str
    state: str  # sinfo's, e.g. idle, allocated, down*

    @property
    def usable(self) -> bool:
        return self.state.rstrip("*~#!%$@^-+") in USABLE


def configured() -> bool:
    """Whether this machine can ask Slurm anything: its commands are here and a configuration
    names the controller (without one, they look for it in DNS)."""
    return shutil.which("sbatch") is not None and (bool(os.environ.get("SLURM_CONF")) or DEFAULT_CONF.is_file())


def _slurm(*argv: str, stdin: str | None = None, timeout: float = 60) -> str:
    if not configured():
        raise EdgetrainError("Slurm is not configured on this machine (no slurm.conf at SLURM_CONF or /etc/slurm)",
                             "run this on the cluster's head, provisioned with edgetrain_scheduler: slurm")
    r = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=timeout, check=False)
    if r.returncode != 0:
        said = " ".join((r.stderr or r.stdout).split()) or f"exit status {r.returncode}"
        raise EdgetrainError(f"{argv[0]}: {said}")
    return r.stdout


def batch_script(run_argv: list[str]) -> str:
    """The job: this edgetrain's `run` with the arguments `submit` was given, as the batch step
    itself (exec), so that a cancel's signal reaches it and it cleans up as after Ctrl-C."""
    return f"#!/bin/sh\nexec {shlex.join([sys.executable, '-m', 'edgetrain', 'run', *run_argv])}\n"


def sbatch_argv(config: LaunchConfig, inv: Inventory, run_id: str, runs_root: Path) -> list[str]:
    """Whole nodes of one device group and one architecture, as many as the run's placement on the
    inventory uses, and --np tasks on them."""
    plan = placement.plan(inv, config.np, config.group)
    group = config.group or next((g for g in DEVICE_GROUPS if g in plan.head.groups), None)
    return [
        "sbatch", "--parsable", f"--job-name={JOB_PREFIX}{run_id}", f"--nodes={len(plan.hosts)}", f"--ntasks={config.np}",
        # --no-kill: a node Slurm takes away ends the attempt as a lost node does (the attempt's monitor), not the job.
        "--exclusive", "--no-kill", f"--constraint={plan.head.arch}", *([f"--partition={group}"] if group else []),
        f"--export=ALL,{RUN_ID_ENV}={run_id}", f"--chdir={Path.cwd()}", f"--output={runs_root.resolve()}/slurm-%j.out",
    ]


def submit(config: LaunchConfig, inv: Inventory, run_id: str, run_argv: list[str]) -> str:
    """Queue the run; its Slurm job id."""
    root = runs.ensure_writable(config.runs_dir)
    # sbatch reads the script from its standard input: no file to outlive a refused submit.
    out = _slurm(*sbatch_argv(config, inv, run_id, root), stdin=batch_script(run_argv))
    return out.strip().split(";")[0]


def queue() -> list[Job]:
    """edgetrain's jobs in the queue, every user's (what waits ahead of one's own), oldest first."""
    if not configured():
        return []  # no scheduler here: nothing queued
    out = _slurm("squeue", "--noheader", "--all", "--sort=i", f"--format={'|'.join(_FIELDS)}")
    jobs = []
    for line in out.splitlines():
        job_id, name, state, user, nodes, nodelist, reason = line.split("|", len(_FIELDS) - 1)
        if name.startswith(JOB_PREFIX):
            jobs.append(Job(job_id, name[len(JOB_PREFIX):], JobState(state) if state in JobState.__members__ else JobState.OTHER,
                            user, int(nodes), nodelist, reason))
    return jobs


def cancel(run_id: str) -> Job:
    """End a queued or running run: a pending job leaves the queue; a running one's edgetrain gets
    SIGINT, as from Ctrl-C, and removes its containers and records the run interrupted."""
    matches = [j for j in queue() if j.run_id.startswith(run_id)]
    if not matches:
        raise EdgetrainError(f"run {run_id} is not queued or running under Slurm", "see the queue with: edgetrain runs list")
    if len(matches) > 1:
        raise EdgetrainError(f"run id {run_id!r} is ambiguous: {', '.join(j.run_id for j in matches)}", "give more of the id")
    job = matches[0]
    if job.state is JobState.RUNNING:
        _slurm("scancel", "--batch", "--signal=INT", job.job_id)
    else:
        _slurm("scancel", job.job_id)
    return job


def taken(nodes: list[str]) -> dict[str, str]:
    """Those of ``nodes`` the scheduler no longer gives jobs (down, drained, failed), with their state."""
    return {v.name: v.state for v in nodes_view() if v.name in nodes and not v.usable}


def nodes_view() -> list[NodeView]:
    """Each node as the scheduler sees it (idle, allocated, mixed, down, drained...)."""
    out = _slurm("sinfo", "--noheader", "--Node", "--format=%N|%T")
    seen: dict[str, str] = {}
    for line in out.splitlines():
        name, state = line.split("|", 1)
        seen.setdefault(name.strip(), state.strip())  # a node in two partitions is listed twice
    return [NodeView(n, s) for n, s in seen.items()]
