"""Launching a run: checks first, then MPICH's ``mpirun`` with the job's ranks, then the outcome.

Nothing is started until every check passed; the run directory records the attempt whatever
its end (completed, failed, interrupted).
"""

from __future__ import annotations

import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import __version__, checkpoints, containers, datasets, doctor, images, inventory, jobs, placement, progress, runs
from .errors import EdgetrainError, UsageError
from .remote import Nodes

FAILED_RANK = re.compile(r"^edgetrain: rank (\d+) on (\S+) failed: (.*)$")
RANK_PID = re.compile(r"^rank (\d+)/\d+ on (\S+) \(pid (\d+)\)")
# Hydra's report of a process that died without finalizing (killed, crashed, out of memory).
BAD_TERMINATION = re.compile(r"PID (\d+) RUNNING AT (\S+)")
EXIT_CODE = re.compile(r"EXIT CODE: (\d+)")
# Hydra's ssh to a node that went away (container gone, or no answer to keepalives).
SSH_LOST = re.compile(r"Connection to (\S+) closed by remote host|Timeout, server (\S+) not responding")


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
    runtime: str | None = None  # None: the inventory's edgetrain_runtime
    runs_dir: Path = field(default_factory=runs.default_root)
    data_dir: Path | None = None
    resume: str | None = None
    hang_timeout: float = 300.0


@dataclass
class Cluster:
    """A docker-runtime run's side on the nodes: the ssh session and the containers."""

    nodes: Nodes
    containers: containers.Containers
    node_run_dirs: dict[str, str]
    probe: doctor.ProbeReport

    def finish(self, run: runs.Run) -> list[str]:
        """Remove every container, then bring each node's rank logs (and rank 0's metrics) home."""
        failed = self.containers.remove()
        for host in self.containers.plan.hosts:
            names = ["rank.*.log", "metrics.jsonl"] if host is self.containers.plan.head else ["rank.*.log"]
            try:
                self.nodes.fetch(host, self.node_run_dirs[host.name], names, run.path)
            except EdgetrainError as exc:
                failed.append(f"{host.name}: logs not copied: {exc}")
        self.nodes.close()
        return failed


@dataclass
class Prepared:
    run: runs.Run
    placement: placement.Placement
    argv: list[str]
    hang_timeout: float = 300.0
    cluster: Cluster | None = None
    started: float = field(default_factory=time.monotonic)


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
    cleanup_errors: list[str] = field(default_factory=list)


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


def worker_command(python: str, spec: jobs.JobSpec, req: RunRequest, run_dir: str, fmt: str, data_files: list[str],
            epochs: int, batch: int, options: dict, resume_from: str | None) -> list[str]:
    worker = [
        python, "-m", "edgetrain.training",
        "--job", spec.name,
        "--run-dir", run_dir,
        "--data-format", fmt,
        "--data-files", *data_files,
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
        worker += ["--resume-from", resume_from]
    return worker


def _runtime(req: RunRequest, plan: placement.Placement) -> str:
    if req.runtime is not None:
        if req.runtime not in inventory.RUNTIMES:
            raise UsageError(f"unknown --runtime {req.runtime!r}", f"use one of: {', '.join(inventory.RUNTIMES)}")
        return req.runtime
    found = {h.runtime for h in plan.hosts}
    if len(found) > 1:
        raise UsageError("the hosts of this run mix edgetrain_runtime host and docker", "pass --runtime docker or --runtime host")
    return found.pop()


def _record(run: runs.Run, req: RunRequest, spec: jobs.JobSpec, inv: inventory.Inventory, plan: placement.Placement,
            runtime: str, cmd: list[str], epochs: int, batch: int, options: dict, resumed_epoch: int | None,
            dataset: dict, versions: dict, argv: list[str] | None, nodes: dict | None = None) -> None:
    attempt = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": argv or sys.argv,
        "np": req.np,
        "epochs": epochs,
        "resumed_from_epoch": resumed_epoch,
        "mpirun": cmd,
    }
    previous = run.info() if req.resume else {}
    where = {"np": req.np, "oversubscribed": plan.oversubscribed, "inventory": str(inv.source), "runtime": runtime, "hosts": plan.describe()}
    if nodes:
        where["nodes"] = nodes
    run.update_info(
        id=run.id,
        job=spec.name,
        dataset=dataset,
        options={"batch_size": batch, "seed": req.seed, "warmup_epochs": req.warmup_epochs,
                 "max_steps": req.max_steps, "target_accuracy": req.target_accuracy, **options},
        placement=where,
        versions={"edgetrain": __version__, **versions},
        attempts=previous.get("attempts", []) + [attempt],
        status="starting",
    )


def prepare(req: RunRequest, argv: list[str] | None = None) -> Prepared:
    """Every check that can fail before anything starts, then the run directory and the command."""
    started = time.monotonic()
    spec = jobs.get(req.job)
    options = _job_options(spec, req.options)
    _check_numbers(req)
    epochs = req.epochs or spec.epochs
    batch = req.batch_size or spec.batch_size
    inv = inventory.load(req.inventory)
    plan = placement.plan(inv, req.np, req.group)
    runtime = _runtime(req, plan)
    if req.hang_timeout <= 0:
        raise UsageError(f"--hang-timeout {req.hang_timeout} must be positive")
    prep = (_prepare_docker if runtime == "docker" else _prepare_host)(req, spec, inv, plan, epochs, batch, options, argv)
    prep.started, prep.hang_timeout = started, req.hang_timeout
    return prep


def _prepare_host(req, spec, inv, plan, epochs, batch, options, argv) -> Prepared:
    if not plan.head.is_local:
        raise EdgetrainError(
            f"the host runtime starts mpirun on this machine, but rank 0's host {plan.head.name} is another machine",
            "use --runtime docker, or run edgetrain on the head node",
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
    worker = worker_command(sys.executable, spec, req, str(run.path.resolve()), files.fmt, [str(p) for p in files.paths],
                     epochs, batch, options, str(resume_from.path.resolve()) if resume_from else None)
    cmd = [mpirun, "-f", str(machinefile), "-n", str(req.np)]
    if len(plan.hosts) > 1 and plan.head.iface:
        cmd += ["-iface", plan.head.iface]
    cmd += worker
    _record(run, req, spec, inv, plan, "host", cmd, epochs, batch, options, resume_from.epoch if resume_from else None,
            {"name": spec.dataset, "format": files.fmt, "files": {str(p): datasets.sha256_file(p) for p in files.paths}},
            {"python": platform.python_version(), "mpich": mpich_version(mpirun)}, argv)
    return Prepared(run, plan, cmd)


def _remote_resume_point(nodes: Nodes, head: inventory.Host, node_run_dir: str, run: runs.Run, job: str, epochs: int) -> int:
    """The newest checkpoint epoch on the rank-0 node (the ranks verify its files when they load it)."""
    listing = nodes.check(head, ["sh", "-c", f"cd {shlex.quote(node_run_dir)}/checkpoints 2>/dev/null && ls -1 */{checkpoints.MANIFEST}; true"],
                          "listing checkpoints")
    found = sorted(line.split("/")[0] for line in listing.split() if line.startswith(checkpoints.PREFIX))
    if not found:
        raise EdgetrainError(f"run {run.id} has no checkpoint on {head.name} to resume from", f"start a new run: edgetrain run {job}")
    newest = found[-1]
    manifest = json.loads(nodes.check(head, ["cat", f"{node_run_dir}/checkpoints/{newest}/{checkpoints.MANIFEST}"], "reading the checkpoint manifest"))
    if manifest.get("job") != job:
        raise EdgetrainError(f"run {run.id} holds a {manifest.get('job')} checkpoint, not {job}",
                             f"resume it with: edgetrain run {manifest.get('job')} --resume {run.id}")
    if manifest["epoch"] >= epochs:
        raise UsageError(f"run {run.id} already finished epoch {manifest['epoch']}", f"pass --epochs {manifest['epoch'] + 1} or more to train further")
    return int(manifest["epoch"])


def _prepare_docker(req, spec, inv, plan, epochs, batch, options, argv) -> Prepared:
    nodes = Nodes()
    ctrs = None
    try:
        reports = doctor.check_nodes(nodes, plan, spec.dataset, inv.source)
        doctor.require(reports)
        root = runs.ensure_writable(req.runs_dir)
        head = reports[0]
        resumed_epoch = None
        if req.resume:
            run = runs.find(root, req.resume)
            ran = run.info().get("job")
            if ran != spec.name:
                raise EdgetrainError(f"run {run.id} trained {ran}, not {spec.name}", f"resume it with: edgetrain run {ran} --resume {run.id}")
            resumed_epoch = _remote_resume_point(nodes, head.host, f"{head.runs_dir}/{run.id}", run, spec.name, epochs)
        else:
            run = runs.create(root, spec.name)
        node_run_dirs = {r.host.name: f"{r.runs_dir}/{run.id}" for r in reports}
        (run.path / "machinefile").write_text(plan.machinefile())
        data_files = containers.data_files(spec.dataset, head.data_format)
        resume_from = f"{containers.RUN_MOUNT}/checkpoints/{checkpoints.PREFIX}{resumed_epoch:04d}" if resumed_epoch else None
        worker = worker_command(containers.PYTHON, spec, req, containers.RUN_MOUNT, head.data_format, data_files,
                         epochs, batch, options, resume_from)
        ctrs = containers.Containers(nodes, plan, run.id, node_run_dirs)
        ctrs.start()
        try:
            probed = doctor.probe(nodes, ctrs)
        except EdgetrainError as exc:
            run.update_info(status="failed", error=str(exc))
            raise
        cmd = ctrs.mpirun(worker)
        r0 = probed.ranks[0]
        _record(run, req, spec, inv, plan, "docker", cmd, epochs, batch, options, resumed_epoch,
                {"name": spec.dataset, "format": head.data_format, "verified_on": [r.host.name for r in reports]},
                {"mpich": r0["mpi"], "tensorflow": r0["tensorflow"], "horovod": r0["horovod"]}, argv,
                nodes={r.host.name: {"runs_dir": node_run_dirs[r.host.name], "image": images.image_for(r.host), "image_id": r.image_id}
                       for r in reports})
        return Prepared(run, plan, cmd, cluster=Cluster(nodes, ctrs, node_run_dirs, probed))
    except BaseException:
        if ctrs is not None:
            ctrs.remove()
        nodes.close()
        raise


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
    m = SSH_LOST.search(text)
    if m:
        return None, m.group(1) or m.group(2), "lost its connection to mpirun", mpirun_output[-15:]
    return None, None, None, mpirun_output[-15:]


class _Watch(threading.Thread):
    """Stops a run that can no longer finish: a node's container gone (checked every ``interval``
    seconds), a node unreachable for ``hang_timeout``, or no output at all for ``hang_timeout``."""

    def __init__(self, prep: Prepared, stop: Callable[[], None], interval: float = 2.0) -> None:
        super().__init__(daemon=True)
        self.prep, self.stop, self.interval = prep, stop, interval
        self.last_output = time.monotonic()
        self.failure: tuple[inventory.Host | None, str] | None = None
        self.finished = threading.Event()

    def _fail(self, host: inventory.Host | None, why: str) -> None:
        self.failure = (host, why)
        self.stop()

    def run(self) -> None:
        unreachable_since: dict[str, float] = {}
        while not self.finished.wait(self.interval):
            now = time.monotonic()
            if now - self.last_output > self.prep.hang_timeout:
                return self._fail(None, f"no progress for {self.prep.hang_timeout:.0f} s (--hang-timeout)")
            if self.prep.cluster is None:
                continue
            try:
                states = self.prep.cluster.containers.states()
            except EdgetrainError:
                continue
            if self.finished.is_set():
                return
            for st in states:
                if st.alive:
                    unreachable_since.pop(st.host.name, None)
                elif st.detail.startswith("unreachable"):
                    since = unreachable_since.setdefault(st.host.name, now)
                    if now - since > self.prep.hang_timeout:
                        return self._fail(st.host, f"{st.detail} for {now - since:.0f} s")
                else:
                    return self._fail(st.host, st.detail)


def execute(prep: Prepared, on_event: Callable[[dict], None], on_output: Callable[[str], None], grace: float = 10.0) -> Outcome:
    """Run mpirun, hand its events and other output to the callbacks, and record the end.

    Whatever the end (success, a failed rank or node, a hang, Ctrl-C), every container is removed
    and the rank logs are brought into the run directory before this returns.
    """
    run = prep.run
    run.update_info(status="running")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(prep.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)

    def stop() -> None:
        if prep.cluster is not None:
            prep.cluster.containers.remove()  # ends mpirun and every rank with their containers
        elif proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)

    watch = _Watch(prep, stop)
    watch.start()
    last: dict = {}
    output: list[str] = []
    status = "failed"
    first_step = None
    finished = False
    cleanup: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            watch.last_output = time.monotonic()
            event = progress.parse(line)
            if event is None:
                output.append(line.rstrip("\n"))
                on_output(output[-1])
                continue
            if event["event"] == "step" and first_step is None:
                first_step = time.monotonic() - prep.started
            elif event["event"] == "epoch":
                last = event
            elif event["event"] == "finished":
                finished = True
            elif event["event"] == "start":
                run.update_info(versions={**run.info().get("versions", {}), **event.get("versions", {})})
            on_event(event)
        code = proc.wait()
        if finished and code != 0:
            # Every rank passed the final barrier: Hydra's complaint is about how they ended.
            on_output(f"every rank finished; mpirun still exited with {code} (recorded as returncode in run.json)")
            code = 0
        if code != 0 and watch.failure is None and prep.cluster is not None:
            # Hydra often ends first when a node goes (its ssh connection closes), sometimes before
            # Docker has recorded the container's end: look for the dead one for a few seconds.
            deadline = time.monotonic() + 5
            while watch.failure is None and time.monotonic() < deadline:
                dead = [st for st in prep.cluster.containers.states() if not st.alive]
                if dead:
                    watch.failure = (dead[0].host, dead[0].detail)
                else:
                    time.sleep(0.5)
        status = "completed" if code == 0 and watch.failure is None else "failed"
    except KeyboardInterrupt:
        status = "interrupted"
        if prep.cluster is not None:
            stop()
        else:
            # Hydra forwards SIGINT to every rank; if they do not end in time, the session goes.
            proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        code = 130
    finally:
        watch.finished.set()
        # The watcher may be removing containers itself: let it finish before the final cleanup.
        watch.join(timeout=120)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if prep.cluster is not None:
            cleanup = prep.cluster.finish(run)
        attempts = run.info().get("attempts", [])
        if attempts:
            attempts[-1]["first_step_s"] = round(first_step, 1) if first_step is not None else None
        run.update_info(status=status, ended=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), returncode=proc.returncode,
                        attempts=attempts)
    outcome = Outcome(run, code if status != "failed" or code != 0 else 1, status, last, cleanup_errors=cleanup)
    if status == "failed":
        if watch.failure is not None:
            host, why = watch.failure
            outcome.failed_host, outcome.failed_error = (host.name if host else None), why
            ranks = prep.placement.ranks_on(host) if host else []
            if ranks:
                outcome.failed_rank = ranks[0]
                log = run.log(ranks[0])
                outcome.log_tail = log.read_text(errors="replace").splitlines()[-15:] if log.is_file() else []
            else:
                outcome.log_tail = output[-15:]
        else:
            outcome.failed_rank, host, outcome.failed_error, outcome.log_tail = _failure(run, output)
            # Hydra names machinefile entries (addresses); the inventory name is what the user knows.
            outcome.failed_host = next((h.name for h in prep.placement.hosts if h.address == host), host)
    return outcome
