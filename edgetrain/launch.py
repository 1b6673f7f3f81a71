"""Launching a run: checks first, then MPICH's ``mpirun`` with the job's ranks, then the outcome.

Nothing is started until every check passed; the run directory records the attempt whatever
its end (completed, failed, interrupted).
"""

from __future__ import annotations

import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import __version__, checkpoints, datasets, inventory, jobs, placement, progress, runs
from .errors import EdgetrainError, UsageError

FAILED_RANK = re.compile(r"^edgetrain: rank (\d+) on (\S+) failed: (.*)$")
RANK_PID = re.compile(r"^rank (\d+)/\d+ on (\S+) \(pid (\d+)\)")
# Hydra's report of a process that died without finalizing (killed, crashed, out of memory).
BAD_TERMINATION = re.compile(r"PID (\d+) RUNNING AT (\S+)")
EXIT_CODE = re.compile(r"EXIT CODE: (\d+)")


@dataclass
class RunRequest:
    job: str
    np: int = 1
    epochs: int | None = None
    batch_size: int | None = None
    max_steps: int | None = None
    seed: int = 42
    target_accuracy: float | None = None
    warmup_epochs: float = 0.25
    options: dict = field(default_factory=dict)
    inventory: Path | None = None
    group: str | None = None
    runs_dir: Path = field(default_factory=runs.default_root)
    data_dir: Path | None = None
    resume: str | None = None


@dataclass
class Prepared:
    run: runs.Run
    placement: placement.Placement
    argv: list[str]


@dataclass
class Outcome:
    run: runs.Run
    returncode: int
    status: str
    last_metrics: dict = field(default_factory=dict)
    failed_rank: int | None = None
    failed_host: str | None = None
    failed_error: str | None = None
    log_tail: list[str] = field(default_factory=list)


def _job_options(spec: jobs.JobSpec, given: dict) -> dict:
    unknown = sorted(set(given) - set(spec.options))
    if unknown:
        known = ", ".join(f"--{k}" for k in spec.options) or "none"
        raise UsageError(f"job {spec.name} has no option --{unknown[0]}", f"its own options: {known}")
    return {**spec.options, **given}


def _check_numbers(req: RunRequest) -> None:
    for name, value in (("--epochs", req.epochs), ("--batch-size", req.batch_size), ("--max-steps", req.max_steps)):
        if value is not None and value < 1:
            raise UsageError(f"{name} {value} must be at least 1")
    if req.warmup_epochs < 0:
        raise UsageError(f"--warmup-epochs {req.warmup_epochs} cannot be negative", "use 0 for no warmup")
    if req.target_accuracy is not None and not 0 < req.target_accuracy <= 1:
        raise UsageError(f"--target-accuracy {req.target_accuracy} must be a fraction in (0, 1]", "e.g. --target-accuracy 0.97")


def _resume_point(root: Path, run_id: str, job: str, epochs: int) -> tuple[runs.Run, checkpoints.Checkpoint]:
    run = runs.find(root, run_id)
    ran = run.info().get("job")
    ckpt = checkpoints.latest(run.checkpoints)
    if ckpt is None:
        raise EdgetrainError(f"run {run.id} has no checkpoint to resume from", f"start a new run: edgetrain run {job}")
    if ran != job or ckpt.job != job:
        raise EdgetrainError(
            f"run {run.id} holds a {ckpt.job} checkpoint, not {job}",
            f"resume it with: edgetrain run {ckpt.job} --resume {run.id}",
        )
    checkpoints.verify(ckpt)
    if ckpt.epoch >= epochs:
        raise UsageError(
            f"run {run.id} already finished epoch {ckpt.epoch}",
            f"pass --epochs {ckpt.epoch + 1} or more to train further",
        )
    return run, ckpt


def mpirun_path() -> str:
    exe = shutil.which("mpirun")
    if exe is None:
        raise EdgetrainError("mpirun is not on PATH", "install MPICH (apt-get install mpich, or: make setup)")
    return exe


def mpich_version(mpirun: str) -> str:
    out = subprocess.run([mpirun, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"Version:\s*(\S+)", out)
    return m.group(1) if m else "unknown"


def prepare(req: RunRequest, argv: list[str] | None = None) -> Prepared:
    """Every check that can fail before anything starts, then the run directory and the command."""
    spec = jobs.get(req.job)
    options = _job_options(spec, req.options)
    _check_numbers(req)
    epochs = req.epochs or spec.epochs
    batch = req.batch_size or spec.batch_size
    inv = inventory.load(req.inventory)
    plan = placement.plan(inv, req.np, req.group)
    if any(h.runtime != "host" for h in plan.hosts):
        raise EdgetrainError(
            f"inventory {inv.source} runs ranks in containers (edgetrain_runtime: docker), which edgetrain run cannot launch yet",
            "use hosts with edgetrain_runtime: host, such as the default inventories/local",
        )
    mpirun = mpirun_path()
    files = datasets.locate(spec.dataset, req.data_dir)
    root = runs.ensure_writable(req.runs_dir)

    resume_from = None
    if req.resume:
        run, resume_from = _resume_point(root, req.resume, spec.name, epochs)
    else:
        run = runs.create(root, spec.name)

    machinefile = run.path / "machinefile"
    machinefile.write_text(plan.machinefile())
    worker = [
        sys.executable, "-m", "edgetrain.training",
        "--job", spec.name,
        "--run-dir", str(run.path.resolve()),
        "--data-format", files.fmt,
        "--data-files", *(str(p) for p in files.paths),
        "--epochs", str(epochs),
        "--batch-size", str(batch),
        "--seed", str(req.seed),
        "--warmup-epochs", str(req.warmup_epochs),
        "--options", json.dumps(options),
    ]
    if req.max_steps:
        worker += ["--max-steps", str(req.max_steps)]
    if req.target_accuracy is not None:
        worker += ["--target-accuracy", str(req.target_accuracy)]
    if resume_from is not None:
        worker += ["--resume-from", str(resume_from.path.resolve())]
    cmd = [mpirun, "-f", str(machinefile), "-n", str(req.np)]
    iface = plan.head.iface
    if len(plan.hosts) > 1 and iface:
        cmd += ["-iface", iface]
    cmd += worker

    attempt = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": argv or sys.argv,
        "np": req.np,
        "epochs": epochs,
        "resumed_from_epoch": resume_from.epoch if resume_from else None,
        "mpirun": cmd,
    }
    previous = run.info() if req.resume else {}
    run.update_info(
        id=run.id,
        job=spec.name,
        dataset={"name": spec.dataset, "format": files.fmt, "files": {str(p): datasets.sha256_file(p) for p in files.paths}},
        options={"batch_size": batch, "seed": req.seed, "warmup_epochs": req.warmup_epochs,
                 "max_steps": req.max_steps, "target_accuracy": req.target_accuracy, **options},
        placement={"np": req.np, "oversubscribed": plan.oversubscribed, "inventory": str(inv.source), "hosts": plan.describe()},
        versions={"edgetrain": __version__, "python": platform.python_version(), "mpich": mpich_version(mpirun)},
        attempts=previous.get("attempts", []) + [attempt],
        status="starting",
    )
    return Prepared(run, plan, cmd)


def _failure(run: runs.Run, mpirun_output: list[str]) -> tuple[int | None, str | None, str | None, list[str]]:
    """The rank that failed first: the one whose log recorded an error, or else the process
    Hydra reports as terminated (matched to its rank by the pid each rank logs at start)."""
    found, pids, tails = [], {}, {}  # pids: pid -> [(rank, hostname)]
    for log in run.logs():
        lines = log.read_text(errors="replace").splitlines()
        rank = int(log.name.split(".")[1])
        tails[rank] = lines[-15:]
        for line in lines:
            m = RANK_PID.match(line)
            if m:
                pids.setdefault(m.group(3), []).append((rank, m.group(2)))
        for line in reversed(lines):
            m = FAILED_RANK.match(line)
            if m:
                found.append((log.stat().st_mtime, int(m.group(1)), m.group(2), m.group(3)))
                break
    if found:
        _, rank, host, error = min(found)
        return rank, host, error, tails[rank]
    text = "\n".join(mpirun_output)
    m = BAD_TERMINATION.search(text)
    if m:
        pid, host = m.group(1), m.group(2)
        code = EXIT_CODE.search(text)
        error = f"process {pid} ended abnormally" + (f" (exit code {code.group(1)})" if code else "")
        # Hydra names the machinefile entry; the rank log knows the hostname. Pids can repeat
        # across hosts, so only an unambiguous match names the rank.
        candidates = pids.get(pid, [])
        if len(candidates) == 1:
            rank, hostname = candidates[0]
            return rank, hostname, error, tails[rank]
        return None, host, error, mpirun_output[-15:]
    return None, None, None, mpirun_output[-15:]


def execute(prep: Prepared, on_event: Callable[[dict], None], on_output: Callable[[str], None], grace: float = 10.0) -> Outcome:
    """Run mpirun, hand its events and other output to the callbacks, and record the end."""
    run = prep.run
    run.update_info(status="running")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(prep.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    last: dict = {}
    output: list[str] = []
    status = "failed"
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            event = progress.parse(line)
            if event is None:
                output.append(line.rstrip("\n"))
                on_output(output[-1])
                continue
            if event["event"] == "epoch":
                last = event
            elif event["event"] == "start":
                run.update_info(versions={**run.info().get("versions", {}), **event.get("versions", {})})
            on_event(event)
        code = proc.wait()
        status = "completed" if code == 0 else "failed"
    except KeyboardInterrupt:
        # Hydra forwards SIGINT to every rank; if they do not end in time, the session goes.
        status = "interrupted"
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        code = 130
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        run.update_info(status=status, ended=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), returncode=proc.returncode)
    outcome = Outcome(run, code, status, last)
    if status == "failed":
        outcome.failed_rank, outcome.failed_host, outcome.failed_error, outcome.log_tail = _failure(run, output)
    return outcome
