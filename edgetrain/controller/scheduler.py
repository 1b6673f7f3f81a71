"""Slurm, where a shared cluster queues its runs: submit a run as a batch job, list and cancel the
queued ones, and the scheduler's view of the nodes (docs/provisioning.md#slurm).

A submitted run's id is chosen here and set in the job's script (RUN_ID_ENV), so that the queue, the
run directory and ``edgetrain cancel`` name one run alike; the job is named JOB_PREFIX + that id for
people reading squeue. edgetrain itself never reads a job's name: on a shared cluster it is anyone's
free text (``|``, newlines, escapes). Which run a job is comes from what `submit` recorded in the
user's own corner of the runs root (runs.slurm_dir), and the queue is read from ``squeue --me`` in
fields no user chooses, each line matched whole.
"""

from __future__ import annotations

import os
import re
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
from edgetrain.shared.errors import EdgetrainError, UsageError

RUN_ID_ENV = "EDGETRAIN_RUN_ID"
JOB_PREFIX = "edgetrain:"
DEFAULT_CONF = Path("/etc/slurm/slurm.conf")
# squeue's fields edgetrain reads, none of them a user's free text: job id, state, user, nodes,
# node list, reason (one of Slurm's words, with node names after some).
_FORMAT = "%i|%T|%u|%D|%N|%r"
_LINE = re.compile(r"(\d+)\|([A-Z_]+)\|([A-Za-z0-9_.-]+)\|(\d{1,6})\|([A-Za-z0-9_.,\[\]-]*)\|([A-Za-z0-9_.,:()\[\] -]*)")
_JOB_ID = re.compile(r"\d+")
_RECORD = "job-"  # + Slurm's job id: a file in runs.slurm_dir holding the run id submit gave the job


class JobState(str, Enum):
    """The squeue states a queued or running edgetrain job is shown with."""

    PENDING = "PENDING"
    RUNNING = "RUNNING"
    OTHER = "OTHER"  # completing, suspended, ...: on its way


@dataclass(frozen=True)
class Job:
    """One of this user's submitted runs in the queue."""

    job_id: str
    run_id: str
    state: JobState
    user: str
    nodes: int
    nodelist: str
    reason: str


@dataclass(frozen=True)
class Queue:
    jobs: list[Job]
    unreadable: int = 0  # squeue lines and job records that did not read as they must: left out


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


ANSWER_SECONDS = 60.0  # how long a Slurm command may take to answer


def _required() -> None:
    if not configured():
        raise EdgetrainError("Slurm is not configured on this machine (no slurm.conf at SLURM_CONF or /etc/slurm)",
                             "run this on the cluster's head, provisioned with edgetrain_scheduler: slurm")


def _slurm(*argv: str, stdin: str | None = None, timeout: float | None = None) -> str:
    _required()
    timeout = ANSWER_SECONDS if timeout is None else timeout
    try:
        r = subprocess.run(list(argv), input=stdin, capture_output=True, text=True, timeout=timeout, check=False)
    except subprocess.TimeoutExpired:
        raise EdgetrainError(f"{argv[0]}: no answer in {timeout:.0f} s: the Slurm controller is busy or out of reach",
                             "try again later; sinfo and squeue say when it answers") from None
    except OSError as exc:
        raise EdgetrainError(f"{argv[0]}: {exc.strerror or exc}") from None
    if r.returncode != 0:
        said = " ".join((r.stderr or r.stdout).split()) or f"exit status {r.returncode}"
        raise EdgetrainError(f"{argv[0]}: {said}")
    return r.stdout


def batch_script(run_id: str, run_argv: list[str]) -> str:
    """The job: this edgetrain's `run` with the arguments `submit` was given, as the batch step
    itself (exec), so that a cancel's signal reaches it and it cleans up as after Ctrl-C. The run id
    is set here, quoted, not in sbatch's --export list, where a comma would start another variable."""
    if not runs.RUN_ID.fullmatch(run_id):
        raise EdgetrainError(f"{run_id!r} is not a run id")
    return (f"#!/bin/sh\n{RUN_ID_ENV}={shlex.quote(run_id)}\nexport {RUN_ID_ENV}\n"
            f"exec {shlex.join([sys.executable, '-m', 'edgetrain', 'run', *run_argv])}\n")


def sbatch_argv(config: LaunchConfig, inv: Inventory, run_id: str, output_dir: Path) -> list[str]:
    """Whole nodes of one device group and one architecture, as many as the run's placement on the
    inventory uses, and --np tasks on them."""
    plan = placement.plan(inv, config.np, config.group)
    group = config.group or next((g for g in DEVICE_GROUPS if g in plan.head.groups), None)
    return [
        "sbatch", "--parsable", f"--job-name={JOB_PREFIX}{run_id}", f"--nodes={len(plan.hosts)}", f"--ntasks={config.np}",
        # --no-kill: a node Slurm takes away ends the attempt as a lost node does (the attempt's monitor), not the job.
        "--exclusive", "--no-kill", f"--constraint={plan.head.arch}", *([f"--partition={group}"] if group else []),
        "--export=ALL", f"--chdir={Path.cwd()}",
        # The job's console is the run's whole output: in a directory only its user reads.
        f"--output={output_dir.resolve()}/slurm-%j.out",
    ]


def submit(config: LaunchConfig, inv: Inventory, run_id: str, run_argv: list[str]) -> str:
    """Queue the run, and record which run the job is; its Slurm job id."""
    _required()
    mine = runs.slurm_dir(runs.ensure_writable(config.runs_dir))
    if mine is None:  # the runs directory went between its check and now
        raise EdgetrainError(f"{config.runs_dir} is gone", "check the runs directory (--runs-dir), then submit again")
    # sbatch reads the script from its standard input: no file to outlive a refused submit.
    out = _slurm(*sbatch_argv(config, inv, run_id, mine), stdin=batch_script(run_id, run_argv))
    job = out.strip().split(";")[0]
    if not _JOB_ID.fullmatch(job):
        raise EdgetrainError(f"sbatch answered {out.strip()[:80]!r}, not a job id", "see whether the job was queued: squeue --me")
    runs.write_anew(mine / f"{_RECORD}{job}", run_id.encode(), mode=0o600)
    return job


def _recorded(root: Path) -> tuple[dict[str, str], int]:
    """The runs this user submitted from ``root``, by job id; and how many records did not read as a run id."""
    mine = runs.slurm_dir(root, create=False) if root.is_dir() else None
    found, bad = {}, 0
    for path in mine.iterdir() if mine else ():
        job = path.name.removeprefix(_RECORD)
        if job == path.name or not _JOB_ID.fullmatch(job):
            continue  # the jobs' output, not a record
        try:
            run_id = path.read_text(errors="replace").strip() if path.is_file() and not path.is_symlink() else ""
        except OSError:
            run_id = ""
        if runs.RUN_ID.fullmatch(run_id):
            found[job] = run_id
        else:
            bad += 1
    return found, bad


def queue(root: Path) -> Queue:
    """This user's runs submitted from the runs directory ``root`` that are in the queue, oldest first."""
    if not configured():
        return Queue([])  # no scheduler here: nothing queued
    recorded, bad = _recorded(root)
    out = _slurm("squeue", "--me", "--noheader", "--sort=i", f"--format={_FORMAT}")
    jobs = []
    for line in out.splitlines():
        m = _LINE.fullmatch(line)
        if m is None:
            bad += 1
            continue
        job_id, state, user, nodes, nodelist, reason = m.groups()
        if job_id in recorded:
            jobs.append(Job(job_id, recorded[job_id], JobState(state) if state in JobState.__members__ else JobState.OTHER,
                            user, int(nodes), nodelist, reason))
    return Queue(jobs, bad)


def cancel(run_id: str, root: Path) -> Job:
    """End one of this user's queued or running runs (by its id, else a unique prefix): a pending
    job leaves the queue; a running one's edgetrain gets SIGINT, as from Ctrl-C, and removes its
    containers and records the run interrupted."""
    if not runs.RUN_ID.fullmatch(run_id):
        raise UsageError(f"{run_id!r} is not a run id", "see the queue with: edgetrain runs list")
    jobs = queue(root).jobs
    matches = [j for j in jobs if j.run_id == run_id] or [j for j in jobs if j.run_id.startswith(run_id)]
    if not matches:
        raise EdgetrainError(f"run {run_id} is not queued or running under Slurm (submitted by you from {root})",
                             "see the queue with: edgetrain runs list")
    if len(matches) > 1:
        raise EdgetrainError(f"run id {run_id!r} is ambiguous: {', '.join(f'{j.run_id} (job {j.job_id})' for j in matches)}",
                             "give more of the id")
    job = matches[0]
    # --user: should the queue have changed hands since it was read, scancel still touches only this user's job.
    if job.state is JobState.RUNNING:
        _slurm("scancel", f"--user={os.getuid()}", "--batch", "--signal=INT", job.job_id)
    else:
        _slurm("scancel", f"--user={os.getuid()}", job.job_id)
    return job


def taken(nodes: list[str], timeout: float | None = None) -> dict[str, str]:
    """Those of ``nodes`` the scheduler no longer gives jobs (down, drained, failed), with their state."""
    return {v.name: v.state for v in nodes_view(timeout) if v.name in nodes and not v.usable}


def nodes_view(timeout: float | None = None) -> list[NodeView]:
    """Each node as the scheduler sees it (idle, allocated, mixed, down, drained...)."""
    out = _slurm("sinfo", "--noheader", "--Node", "--format=%N|%T", timeout=timeout)
    seen: dict[str, str] = {}
    for line in out.splitlines():
        name, bar, state = line.partition("|")
        if not bar:
            continue
        seen.setdefault(name.strip(), state.strip())  # a node in two partitions is listed twice
    return [NodeView(n, s) for n, s in seen.items()]
