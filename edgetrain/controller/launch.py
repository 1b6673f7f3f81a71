"""Launching a run: one resolved description, every check, then ``mpirun`` of the worker on every
rank, then the outcome.

Nothing is started until every check passed; the run directory records each attempt whatever
its end (completed, failed, interrupted), and the runtime removes what it started on every path.
"""

from __future__ import annotations

import os
import posixpath
import queue
import shlex
import shutil
import signal
import socket
import subprocess
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from edgetrain import __version__
from edgetrain.controller import allocation, blame, containers, inventory, monitor, observers, placement, remote, requirements, runtimes
from edgetrain.shared import checkpoints, failures, job_options, lifetime, progress, record, runs, workdir
from edgetrain.shared.errors import EdgetrainError, Interrupted, UsageError
from edgetrain.shared.layout import RunLayout
from edgetrain.controller.config import Attempt, LaunchConfig
from edgetrain.controller.program import Program
from edgetrain.controller.recorder import Recorder
from edgetrain.shared.runs import Status


@dataclass
class Launch:
    """One resolved launch: what runs, where, how, and the command that starts it."""

    config: LaunchConfig
    attempt: Attempt
    placement: placement.Placement
    runtime: runtimes.Runtime
    run: runs.Run
    argv: list[str]
    manifest: workdir.Manifest | None
    resumed_epoch: int | None
    lock: runs.RunLock
    events_token: str  # marks this attempt's own events on mpirun's stream (edgetrain.shared.progress)
    recorder: Recorder  # the attempt's one writer of run.json
    held: allocation.Allocation | None  # the Slurm job the run is inside, read once (allocation.current)
    left_out: tuple[inventory.Host, ...]  # the inventory's hosts this attempt excluded, where --rejoin looks
    started: float = field(default_factory=time.monotonic)

    @property
    def losable(self) -> dict[str, str]:
        """The hosts this run goes on without (placement.losable_hosts), each with what it loses there."""
        found = {}
        for host in self.placement.losable_hosts(self.config.expendable):
            ranks = self.placement.ranks_on(host)
            lost = ", ".join(str(self.config.strategy.can_lose(r, self.config.ps)) for r in ranks)
            found[host.name] = f"{lost} (rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))})"
        return found

    @property
    def resume_command(self) -> str:
        """The command that continues this run: the user's own, with ``--resume RUN``."""
        return _with_resume(list(self.config.command), self.run.id)


# How an attempt ended whose edgetrain died before it could say (killed, or its machine went down).
ABANDONED = "abandoned: its edgetrain ended without recording how (killed, or its machine went down)"


@dataclass
class Outcome:
    run: runs.Run
    returncode: int
    state: Status
    last_metrics: dict[str, Any] = field(default_factory=dict)
    finding: blame.Finding | None = None  # who a failed run's failure belongs to
    cleanup_errors: list[str] = field(default_factory=list)
    lost: monitor.Verdict | None = None  # a node the watcher saw go (its container, or the way to it), and how
    back: inventory.Host | None = None  # a left-out node that answered again: the attempt was ended to take it back (--rejoin)

    @property
    def why(self) -> str:
        """What ended a run that did not complete, in a phrase: the failing rank and host where known."""
        found = self.finding
        if self.state is Status.INTERRUPTED:
            return "interrupted"
        if found and found.rank is not None:
            return f"rank {found.rank} on {found.host} failed: {found.error}"
        if found and found.host is not None:
            return f"a rank on {found.host} failed: {found.error}"
        if found and found.error is not None:
            return found.error
        return f"mpirun exited with {self.returncode}"


def _runtime(config: LaunchConfig, inv: inventory.Inventory, plan: placement.Placement) -> runtimes.Runtime:
    name = config.runtime
    if name is None:
        found = {h.runtime for h in plan.hosts}
        if len(found) > 1:
            raise UsageError("the hosts of this run mix edgetrain_runtime host and docker", "pass --runtime docker or --runtime host")
        name = found.pop()
    if name not in runtimes.RUNTIMES:
        raise UsageError(f"unknown --runtime {name!r}", f"use one of: {', '.join(runtimes.RUNTIMES)}")
    return runtimes.RUNTIMES[name].checked(plan, inv, config.program, data_dir=config.data_dir, strategy=config.strategy,
                                           log=config.log)


def _check_restarts(config: LaunchConfig, plan: placement.Placement) -> None:
    policy = config.restarts
    if policy.max_restarts and policy.min_nodes > len(plan.hosts):
        raise UsageError(f"--min-nodes {policy.min_nodes} is more than the {len(plan.hosts)} nodes --np {plan.np} is placed on",
                         f"use --min-nodes {len(plan.hosts)} or less")


def _resume_point(rt: runtimes.Runtime, run: runs.Run, program: Program, np: int, log: Callable[[str], None]) -> int | None:
    """The newest intact checkpoint's epoch on the rank-0 node, checked against what is asked
    for; None for a script that keeps no edgetrain checkpoints (it resumes by itself).

    Every file of a checkpoint is hashed where it lives and compared with its manifest; a damaged
    one is passed over for the one before, and the user is told."""
    head = rt.plan.head
    ckpt_dir = str(RunLayout.posix(rt.node_run_dirs(run)[head.name]).checkpoints)
    listing = rt.nodes.check(head, ["sh", "-c", f"cd {shlex.quote(ckpt_dir)} 2>/dev/null && ls -1 */{checkpoints.MANIFEST}; true"],
                             "listing checkpoints")
    found = sorted(line.split("/")[0] for line in listing.split() if line.startswith(checkpoints.PREFIX))
    if not found:
        if program.job is not None:
            raise EdgetrainError(f"run {run.id} has no checkpoint on {head.name} to resume from",
                                 f"start a new run: edgetrain run {program.name}")
        return None
    damaged: list[str] = []
    for name in reversed(found):
        manifest = _intact(rt, head, f"{ckpt_dir}/{name}", damaged)
        if manifest is not None:
            epoch: int = manifest["epoch"]
            break
    else:
        raise EdgetrainError(f"run {run.id} has no intact checkpoint on {head.name}: {'; '.join(damaged)}",
                             f"start a new run: edgetrain run {program.name}")
    if damaged:
        log(f"edgetrain: warning: passed over damaged checkpoint(s) {'; '.join(damaged)}; resuming from {name}")
    if manifest.get("job") != program.name:
        raise EdgetrainError(f"run {run.id} holds a {manifest.get('job')} checkpoint, not {program.name}",
                             f"resume it with: {command_of(run, str(manifest.get('job')))}")
    ranks = (manifest.get("metrics") or {}).get("ranks")
    if ranks is not None and ranks != np:
        # The same rule as a fresh run on np ranks: built-in jobs (and scripts that scale by their
        # world size, as Horovod's and torch's examples do) get their rate, warmup and shards anew.
        log(f"resuming on {np} ranks from epoch {epoch}, trained on {ranks}: the learning rate, its warmup and the data "
            f"shards follow {np} ranks, and each update averages {np}/{ranks} of the images it did")
    saved = job_options.saved(manifest.get("options") or {})
    if program.job is not None and saved and saved != program.checkpoint_options:
        diff = ", ".join(f"--{k.replace('_', '-')} {saved.get(k)} (asked {program.checkpoint_options.get(k)})"
                         for k in sorted(set(saved) | set(program.checkpoint_options)) if saved.get(k) != program.checkpoint_options.get(k))
        raise UsageError(f"run {run.id} was trained with {diff}", "resume with the options it was started with")
    if program.epochs is not None and epoch >= program.epochs:
        raise UsageError(f"run {run.id} already finished epoch {epoch}", f"pass --epochs {epoch + 1} or more to train further")
    return epoch


def _intact(rt: runtimes.Runtime, head: inventory.Host, where: str, damaged: list[str]) -> dict[str, Any] | None:
    """A checkpoint's manifest if every file of it is hashed, where it lives, to what the manifest
    says; else None, with why appended to ``damaged``."""
    name = posixpath.basename(where)
    try:
        manifest = checkpoints.parse(rt.nodes.check(head, ["cat", f"{where}/{checkpoints.MANIFEST}"], "reading the checkpoint manifest"))
    except ValueError as exc:
        damaged.append(f"{name} (its manifest is damaged: {exc})")
        return None
    checklist = "".join(f"{digest}  {file}\n" for file, digest in manifest["files"].items())
    check = rt.nodes.run(head, ["sh", "-c", f"cd {shlex.quote(where)} && sha256sum -c --quiet -"], input=checklist)
    if check.returncode != 0:
        bad = (check.stdout.strip().splitlines() or check.stderr.strip().splitlines() or ["?"])[0]
        damaged.append(f"{name} ({bad.replace(': FAILED', ' does not match its manifest')})")
        return None
    return manifest


def _with_resume(command: list[str], run_id: str) -> str:
    cmd = list(command)
    if "--resume" not in cmd:
        at = cmd.index("--") if "--" in cmd else len(cmd)
        cmd[at:at] = ["--resume", run_id]
    return shlex.join(cmd)


def command_of(run: runs.Run, job: str) -> str:
    """The command that continues ``run``: the one that started it, with ``--resume``."""
    return _with_resume(run.record().command or ["edgetrain", "run", job], run.id)


def prepare(config: LaunchConfig, attempt: Attempt) -> Launch:
    """Every check that can fail before anything starts, then the run directory, the staged
    working directory, the containers (docker runtime) and the command."""
    started = time.monotonic()
    program = config.program
    held = allocation.current()
    known = allocation.within(inventory.load(config.inventory), held)
    inv = replace(known, hosts=tuple(h for h in known.hosts if h.name not in attempt.excluded))
    if held is not None and attempt.np > sum(h.slots for h in inv.hosts):
        raise EdgetrainError(f"--np {attempt.np} needs more ranks than the {sum(h.slots for h in inv.hosts)} tasks Slurm job {held.job_id} holds",
                             "lower --np, or ask Slurm for more (sbatch -n, or edgetrain submit)")
    plan = placement.plan(inv, attempt.np, config.group, config.per_node)
    if config.speeds is not None:
        plan = config.speeds.placed(plan, program.name, config.log)
    _check_restarts(config, plan)
    program.check_ranks(attempt.np)
    manifest = (workdir.scan(program.workdir, config.max_workdir_bytes, config.ship_secrets, config.max_workdir_files)
                if program.workdir is not None else None)
    if attempt.resume:
        # Before the node checks, which would take the live run's own containers for leftovers.
        resumed = runs.find(runs.ensure_writable(config.runs_dir), attempt.resume)
        resumed.refuse_if_live()
        if resumed.status() is Status.ABANDONED:
            _remove_abandoned(config, inv, resumed)
    rt = _runtime(config, inv, plan)
    created: runs.Run | None = None
    lock: runs.RunLock | None = None
    try:
        rt.check_ports(config.strategy.ports(plan, config.port), config.strategy)
        root = runs.ensure_writable(config.runs_dir)
        resumed_epoch = None
        if attempt.resume:
            run = runs.find(root, attempt.resume)
            ran = run.record().job
            if ran != program.name:
                raise EdgetrainError(f"run {run.id} holds a {ran} checkpoint, not {program.name}", f"resume it with: {command_of(run, ran)}")
            resumed_epoch = _resume_point(rt, run, program, attempt.np, config.log)
            lock = run.lock()  # after the checks, which only read: a refused resume leaves no trace
            failures.clear_all(run.path)
        else:
            run = created = runs.create(root, program.name, config.run_id)
            lock = run.lock()
        recorder = Recorder(run, run.record() if attempt.resume else None)
        rt.stage(run, manifest)
        runs.write_anew(run.machinefile, plan.machinefile().encode())
        token = progress.new_token()
        worker = _worker_command(config, rt, run, plan, resumed_epoch, token)
        try:
            rt.start(run)
        except EdgetrainError as exc:
            recorder.update(job=program.name, status=Status.FAILED, error=str(exc))
            raise
        argv = rt.mpirun(run, worker, config.expendable, token)
        launch = Launch(config, attempt, plan, rt, run, argv, manifest, resumed_epoch, lock, token, recorder, held,
                        tuple(h for h in known.hosts if h.name in attempt.excluded), started)
        _record(launch, inv)
        return launch
    except BaseException as exc:
        _undo(config, rt, created, lock, exc)
        raise


def _remove_abandoned(config: LaunchConfig, inv: inventory.Inventory, run: runs.Run) -> None:
    """A run whose edgetrain died left its containers running until their leases run out; nothing
    holds the run, so they are its dead attempt's, and they go before the node checks see them."""
    docker = [h for h in inv.hosts if h.runtime == "docker"]
    if not docker:
        return
    with remote.Nodes() as nodes:
        gone = containers.remove_run(nodes, docker, run.id)
    if gone:
        config.log(f"edgetrain: removed run {run.id}'s containers left running by its edgetrain, which died: on {', '.join(gone)}")


def _worker_command(config: LaunchConfig, rt: runtimes.Runtime, run: runs.Run, plan: placement.Placement,
                    resumed_epoch: int | None, token: str) -> list[str]:
    """The worker command of this attempt, the same for every rank: its runtime's directories, the
    strategy's peers and a resume's checkpoint."""
    resume = [] if resumed_epoch is None else \
        ["--resume-from", str(RunLayout.posix(rt.run_dir(run)).checkpoints / checkpoints.dir_name(resumed_epoch))]
    return runtimes.worker_command(rt.python, runtimes.RankDirs(rt.run_dir(run), rt.store(run), rt.data_dir(run)), config.strategy,
                                   config.program, token, config.strategy.worker_args(plan, config.port, config.ps) + resume)


def _undo(config: LaunchConfig, rt: runtimes.Runtime, created: runs.Run | None, lock: runs.RunLock | None, exc: BaseException) -> None:
    """What a launch that failed before it started leaves: the runtime stopped, the lock released,
    and a new run's directory gone, unless it got as far as its containers. A failure to write
    this machine's files (a full disk, most likely) is raised as one line."""
    rt.stop()
    rt.nodes.close()
    if lock is not None:
        lock.release()
    if created is not None and not (isinstance(exc, EdgetrainError) and created.info_file.exists()):
        shutil.rmtree(created.path, ignore_errors=True)
    if isinstance(exc, OSError):
        raise EdgetrainError(f"cannot write {exc.filename or config.runs_dir}: {exc.strerror or exc}",
                             f"free disk space on this machine ({config.runs_dir})") from None


def _record(launch: Launch, inv: inventory.Inventory) -> None:
    config, now, rt, program = launch.config, launch.attempt, launch.runtime, launch.config.program
    attempt = record.Attempt(started=record.now(), command=list(config.command), np=now.np, mpirun=launch.argv,
                             resumed_from_epoch=launch.resumed_epoch, shipped=[s.__dict__ for s in rt.shipped],
                             excluded=dict(now.excluded))
    before = launch.recorder.held
    previous = before.attempts if before is not None else []
    if before is not None and previous and previous[-1].ended_by is None and before.status in (Status.STARTING, Status.RUNNING):
        # The lock is ours now, so the run was refused to no live command: the one before died unrecorded.
        previous[-1].ended_by = ABANDONED
    recorded = rt.record(launch.run)
    where = record.Where(np=now.np, runtime=rt.name, strategy=config.strategy.name, inventory=str(inv.source),
                         hosts=launch.placement.describe(), oversubscribed=launch.placement.oversubscribed,
                         nodes=recorded.get("nodes"), speeds=list(launch.placement.speeds) if launch.placement.speeds else None,
                         speeds_from=launch.placement.speeds_from)
    shipped = record.ProgramRecord(args=list(program.args))
    if program.is_script:
        shipped.script, shipped.workdir = program.script, str(program.workdir)
    if program.requirements is not None:
        shipped.requirements = requirements.read(program.requirements)
    launch.recorder.update(
        job=program.name,
        kind=record.ProgramKind.SCRIPT if program.is_script else record.ProgramKind.JOB,
        program=shipped,
        workdir={"files": len(launch.manifest.entries), "bytes": launch.manifest.total_bytes} if launch.manifest else None,
        placement=where,
        versions={"edgetrain": __version__, **rt.versions},
        dataset=recorded.get("dataset", {}),
        attempts=[*previous, attempt],
        status=Status.STARTING,
    )


def _die_with_parent() -> None:
    """In the child, before exec: end (SIGTERM) when this edgetrain dies, however it dies. Hydra
    then ends the ranks on the host runtime; on the docker runtime the ssh to the head goes, and
    the containers' leases end the rest."""
    lifetime.end_with_parent(signal.SIGTERM)


def execute(launch: Launch, on_event: Callable[[dict[str, Any]], None], on_output: Callable[[str], None], grace: float = 10.0) -> Outcome:
    """Run mpirun, hand its events and other output to the callbacks, and record the end.

    Whatever the end (success, a failed rank or node, a hang, Ctrl-C), the runtime removes what
    it started and brings the rank logs into the run directory before this returns.
    """
    _mark_running(launch)
    # Nothing a rank does reads the terminal: a child left holding it (or setting it non-blocking) must not matter.
    proc = subprocess.Popen(launch.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, errors="replace", env={**os.environ, "PYTHONUNBUFFERED": "1"},
                            start_new_session=True, preexec_fn=_die_with_parent)  # noqa: PLW1509 - one libc call (prctl), loaded before the fork
    launch.runtime.attach(proc)
    watched = Watched(launch, observers.Observers.start(launch.runtime, launch.run.id, launch.events_token, proc, launch.held), on_event, on_output)
    state, code = Status.FAILED, 1
    try:
        watched.follow()
        code = proc.wait()
        watched.settle(code)
        state = monitor.status(watched.state, code)
    except KeyboardInterrupt:
        state, code = Status.INTERRUPTED, 130
        _interrupt(launch.runtime, proc, grace)
    finally:
        # run.json met a full disk while the ranks trained: the first the run heard of it, and what ended it.
        recording_ended_it = watched.state.record_failed
        cleanup = _finish(launch, proc, watched, state)
    seen, unrecorded = watched.state, launch.recorder.error
    outcome = Outcome(launch.run, code if state != Status.FAILED or code != 0 else 1, state, dict(seen.said.last), cleanup_errors=cleanup,
                      lost=seen.lost, back=seen.back)
    if state == Status.FAILED:
        outcome.finding = blame.find(blame.Observed(launch.run, launch.placement, watched.output, seen.verdict, seen.said.reported,
                                                    lambda line: launch.config.log(f"edgetrain: warning: {line}")))
    if unrecorded is not None:
        if recording_ended_it and failures.DISK_FULL in unrecorded.problem:
            raise full_disk(launch, None)
        # A rank that met a full disk first is reported as such whether or not run.json fitted after it.
        if outcome.finding is None or outcome.finding.disk_full_writing is None:
            raise _unrecorded(launch, outcome, unrecorded)
    return outcome


OUTPUT_LINES = 5000  # of mpirun's output kept in memory (a run may print without end)
POLL = 0.5  # seconds between checks for Ctrl-C while the queue is empty


class Watched:
    """One attempt's monitor carried out, on the launching thread: each event its observers post,
    and each reading of the clock, stepped through the reducer (edgetrain.controller.monitor) in
    order, and each action it returns done here - the runtime stopped or told which nodes are out
    of reach, a node lost, the watcher asked, the program's start recorded, a line said."""

    def __init__(self, launch: Launch, seeing: observers.Observers, on_event: Callable[[dict[str, Any]], None],
                 on_output: Callable[[str], None]) -> None:
        self.launch, self.seeing, self.on_event, self.on_output = launch, seeing, on_event, on_output
        self.state = monitor.State(_facts(launch, seeing.watcher.interval), last_output=time.monotonic())
        # mpirun's last lines that were not events: what a failure is judged by (Hydra's words come last).
        self.output: deque[str] = deque(maxlen=OUTPUT_LINES)

    def follow(self) -> None:
        """Every event until mpirun's stream ends."""
        while self.state.said.open:
            self._next(POLL)

    def settle(self, code: int) -> None:
        """mpirun ended with ``code``: a failed end awaits the watcher's verdict (monitor.State.awaiting)."""
        self.post(monitor.Exited(code, time.monotonic()))
        while self.seeing.watcher.is_alive() and self.state.awaiting(now := time.monotonic()):
            assert self.state.settle is not None
            self._next(min(self.state.settle[1] - now, POLL))

    def close(self) -> None:
        """After any end: the observers stopped, and what they posted last followed for the nodes' reach only."""
        self.seeing.stop()
        self.post(monitor.Closed())
        for event in self.seeing.posted():
            self.post(event)

    def _next(self, timeout: float) -> None:
        try:
            self.post(self.seeing.events.get(timeout=timeout))
        except queue.Empty:
            pass
        self.post(monitor.Clock(time.monotonic()))

    def post(self, event: monitor.Event) -> None:
        self.state, actions = monitor.step(self.state, event)
        for action in actions:
            self._do(action)

    def _do(self, action: monitor.Action) -> None:
        launch, watcher = self.launch, self.seeing.watcher
        if isinstance(action, monitor.Show):
            if action.stream:
                self.output.append(action.text)
            self.on_output(action.text)
        elif isinstance(action, monitor.Progress):
            self.on_event(action.event)
        elif isinstance(action, monitor.Say):
            launch.config.log(action.line)
        elif isinstance(action, monitor.Lose):
            launch.runtime.lose(action.host)
        elif isinstance(action, monitor.LookFor):
            watcher.look_for(h for h in launch.left_out if h.name in action.names)
        elif isinstance(action, monitor.Stop):
            if action.end_watch:
                watcher.end()
            launch.runtime.stop()
        elif isinstance(action, monitor.Hurry):
            watcher.hurry()
        elif isinstance(action, monitor.OutOfReach):
            launch.runtime.out_of_reach(action.names)
        elif isinstance(action, monitor.RecordStart):
            try:
                launch.recorder.program_started(action.versions, action.batches)
            except EdgetrainError:
                self.post(monitor.RecordFailed())


def _facts(launch: Launch, look_every: float) -> monitor.Facts:
    config, plan = launch.config, launch.placement
    return monitor.Facts(hosts=tuple(plan.hosts), np=plan.np, ranks={h.name: tuple(plan.ranks_on(h)) for h in plan.hosts},
                         losable=launch.losable, expendable=frozenset(r for r in range(plan.np) if config.expendable(r)),
                         hang_timeout=config.hang_timeout, started=launch.started,
                         look_for=tuple(launch.attempt.excluded) if config.restarts.rejoin else (), has_nodes=launch.runtime.has_nodes,
                         settle_s=remote.SSH_TIMEOUT + remote.CONFIRM_TIMEOUT + 2 * look_every)


def _mark_running(launch: Launch) -> None:
    try:
        launch.recorder.update(status=Status.RUNNING)
    except EdgetrainError as exc:
        # This machine's disk is full before mpirun starts: nothing runs, what was started goes.
        launch.runtime.stop()
        problems = launch.runtime.finish(launch.run)
        launch.lock.release()
        if failures.DISK_FULL in exc.problem and not problems:
            raise full_disk(launch, None) from None
        raise _unrecorded(launch, Outcome(launch.run, 1, Status.FAILED, cleanup_errors=problems), exc) from None


def _interrupt(rt: runtimes.Runtime, proc: subprocess.Popen[str], grace: float) -> None:
    rt.interrupt()
    try:  # if the ranks do not end in time, the session goes
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _finish(launch: Launch, proc: subprocess.Popen[str], watched: Watched, state: Status) -> list[str]:
    """After any end: mpirun gone, the observers stopped, the runtime's cleanup, the end recorded
    and the lock released. Returns the problems the cleanup met."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    watched.close()
    cleanup = launch.runtime.finish(launch.run)
    try:
        launch.recorder.ended(state, proc.returncode, watched.state.said.first_step, watched.state.went_on_without)
    except EdgetrainError:
        pass  # the recorder keeps it, for execute to report
    finally:
        launch.lock.release()
    return cleanup


def _unrecorded(launch: Launch, outcome: Outcome | None, exc: EdgetrainError) -> EdgetrainError:
    """One line for a run this machine could not record (its disk is full): how it ended, and how
    to go on. run.json keeps its last whole version."""
    state = outcome.state if outcome is not None else Status.FAILED
    how = {Status.COMPLETED: "completed", Status.INTERRUPTED: "was interrupted"}.get(state, "failed")
    finding = outcome.finding if outcome is not None else None
    if finding is not None and finding.error is not None:
        who = f"rank {finding.rank} on {finding.host}" if finding.rank is not None else finding.host
        how += f" ({who + ': ' if who else ''}{finding.error})"
    if outcome is not None and outcome.cleanup_errors:
        how += f" (cleanup: {'; '.join(outcome.cleanup_errors)})"
    cls = Interrupted if state is Status.INTERRUPTED else EdgetrainError
    fix = exc.fix if state is Status.COMPLETED else f"{exc.fix}, then resume with: {launch.resume_command}"
    return cls(f"run {launch.run.id} {how}, and this machine could not record it: {exc.problem}", fix)


def full_disk(launch: Launch, finding: blame.Finding | None) -> EdgetrainError:
    """The one report of a run that failed because its run directory's disk filled, whichever write
    met it first: a rank's (``finding`` names its host and what it was writing: a checkpoint, a
    metrics line) or this machine's run.json (no such finding). Which write meets the disk first is
    chance, and so is whether run.json fits after a rank's: the rank removes its half-written
    checkpoint, which may leave room again, or not. Neither changes the words: one line, no log tail
    (the traceback of a write that met a full disk says no more), where to free space, and the
    command that resumes."""
    writing = finding.disk_full_writing if finding is not None else None
    if finding is None or writing is None:
        host, writing, where = socket.gethostname(), launch.run.info_file.name, str(launch.run.path)
    else:
        # The node's own path where the runtime knows it (a container's differs), else the one its ranks see.
        host = finding.host or "its node"
        where = launch.runtime.node_run_dirs(launch.run).get(host, launch.runtime.run_dir(launch.run))
    what = f"{failures.WRITING}{writing}" if writing else ""
    return EdgetrainError(f"run {launch.run.id} failed: the disk of its run directory on {host} is full ({failures.DISK_FULL}){what}",
                          f"free disk space there ({where}), then resume with: {launch.resume_command}")
