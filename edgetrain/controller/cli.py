"""The ``edgetrain`` command line. Commands stay thin: the work happens in the modules they call."""

from __future__ import annotations

import faulthandler
import json
import os
import shlex
import signal
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Annotated, Any

import typer
from typer.core import TyperCommand
from rich.console import Console
from rich.table import Column, Table
from rich.text import Text

from edgetrain.controller.bench import record as bench_record, runner as bench_runner
from edgetrain.controller import collect as collecting
from edgetrain.controller import containers, shipping, speeds
from edgetrain.shared import datasets, jobs, runs
from edgetrain.controller import config as configs
from edgetrain.controller import allocation, launch, scheduler, supervisor
from edgetrain.controller import program as programs
from edgetrain.controller import requirements as extra
from edgetrain.shared import workdir as workdir_mod
from edgetrain.controller import doctor as doctoring
from edgetrain.controller import images as imaging
from edgetrain.controller import inventory as inventories
from edgetrain.controller import plots
from edgetrain.shared.batches import BatchBy
from edgetrain.shared.errors import EdgetrainError, Interrupted, UsageError
from edgetrain.shared.job_options import JobOptions, with_job_options
from edgetrain.shared.progress import ConsoleProgress
from edgetrain.controller.strategies import STRATEGIES, TfParameterServer
from edgetrain.shared.strategies import DEFAULT
from edgetrain.shared.terminal import shown
from edgetrain.controller.remote import Nodes

app = typer.Typer(no_args_is_help=True, help="Data-parallel training on edge clusters.")
runs_app = typer.Typer(no_args_is_help=True, help="Inspect run directories.")
data_app = typer.Typer(no_args_is_help=True, help="Find, verify, import and fetch datasets.")
images_app = typer.Typer(no_args_is_help=True, help="Build training images offline and ship them to the nodes.")
app.add_typer(runs_app, name="runs")
app.add_typer(data_app, name="data")
app.add_typer(images_app, name="images")
console = Console()
err_console = Console(stderr=True)

InventoryOpt = Annotated[Path | None, typer.Option("--inventory", "-i", help="Ansible inventory (default: inventories/local, this machine).")]
RunsDirOpt = Annotated[Path, typer.Option("--runs-dir", envvar="EDGETRAIN_RUNS", help="Where run directories live.")]
GroupOpt = Annotated[str | None, typer.Option(help="Device group to use: rpi or gpu.")]
StrategyOpt = Annotated[str, typer.Option(help="; ".join(f"{s.name}: {s.help}" for s in STRATEGIES.values()) + ".")]
DataDirOpt = Annotated[Path | None, typer.Option("--data-dir", help="Look here first for datasets (DIR/<dataset>/...).")]
TfPortOpt = Annotated[int, typer.Option(help="tf-multiworker, tf-ps: first port of each host's TensorFlow tasks.")]
MasterPortOpt = Annotated[int, typer.Option(help="torch: MASTER_PORT, the port of rank 0's rendezvous on its host.")]
MaxRestartsOpt = Annotated[int, typer.Option(help="When a node is lost, leave it out and resume on the nodes left, up to this many times (a rank's own error is never retried).")]
MinNodesOpt = Annotated[int, typer.Option(help="With --max-restarts: never restart on fewer nodes than this.")]


def _say(line: str) -> None:
    """A line that came from a program, a node or a run's files: shown as printed, never as markup."""
    console.print(shown(line), highlight=False, soft_wrap=True)


def _warn(problem: str) -> None:
    err_console.print(shown(f"edgetrain: warning: {problem}"), highlight=False, soft_wrap=True)


GIVEN = "edgetrain.given"  # the command's own arguments, as typed (its context's meta)


class _Launching(TyperCommand):
    """run, submit and bench. A closed terminal, a `kill` or a Slurm cancel ends them as Ctrl-C
    does: containers on other machines would outlive us. And each keeps its arguments as typed,
    which `submit` hands to the `edgetrain run` of its batch job."""

    # ctx: typer's click Context, whose class typer does not name publicly.
    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        ctx.meta[GIVEN] = list(args)
        return super().parse_args(ctx, args)

    def invoke(self, ctx: Any) -> Any:
        for sig in (signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, _interrupt)
        return super().invoke(ctx)


def _launch_command(submitting: bool):
    """`run`, or with ``submitting`` `submit`: one set of arguments, resolved and checked alike."""

    @with_job_options("run", programs.parse_options)
    def command(
        ctx: typer.Context,
        target: Annotated[str, typer.Argument(metavar="SCRIPT|JOB", help="Your training script (e.g. ./train.py), or a built-in job: lenet (MNIST), fashion (Fashion-MNIST).")],
        script_args: Annotated[list[str] | None, typer.Argument(metavar="[-- SCRIPT ARGS...]", help="Passed to your script unchanged.")] = None,
        np: Annotated[int | None, typer.Option("--np", help="Number of ranks (default 1; inside a Slurm allocation, the tasks it holds).")] = None,
        inventory: InventoryOpt = None,
        group: GroupOpt = None,
        runtime: Annotated[str | None, typer.Option(help="docker (ranks in the image on each node) or host (default: the inventory's edgetrain_runtime).")] = None,
        strategy: StrategyOpt = DEFAULT,
        tf_port: TfPortOpt = configs.PORT_FLAGS["tf_port"],
        ps: Annotated[int | None, typer.Option("--ps", help=f"tf-ps: how many of the --np tasks are parameter servers (default {TfParameterServer.default_ps}); rank 0 is the chief, the rest workers.")] = None,
        master_port: MasterPortOpt = configs.PORT_FLAGS["master_port"],
        workdir: Annotated[Path | None, typer.Option(help="Folder shipped to every node as the ranks' working directory (default: the script's folder).")] = None,
        max_workdir_mb: Annotated[float, typer.Option(help="Refuse to ship a working directory larger than this.")] = workdir_mod.DEFAULT_MAX_BYTES / 1024**2,
        max_workdir_files: Annotated[int, typer.Option(help="Refuse to ship a working directory of more files than this.")] = workdir_mod.DEFAULT_MAX_FILES,
        ship_secrets: Annotated[bool, typer.Option("--ship-secrets", help=f"Also ship files named like secrets ({', '.join(workdir_mod.SECRETS)}), left out by default.")] = False,
        requirements: Annotated[Path | None, typer.Option(help="Extra Python packages your script needs (default: requirements.txt beside it).")] = None,
        dataset: Annotated[list[str] | None, typer.Option("--dataset", help="A dataset your script needs on every node (mnist, fashion-mnist); repeatable.")] = None,
        resume: Annotated[str | None, typer.Option(help="Continue this run (from its newest checkpoint).")] = None,
        hang_timeout: Annotated[float, typer.Option(help="Stop the run when a node stays unreachable, or nothing is heard from the ranks, this many seconds.")] = 300.0,
        max_restarts: MaxRestartsOpt = configs.RestartPolicy.max_restarts,
        min_nodes: MinNodesOpt = configs.RestartPolicy.min_nodes,
        rejoin: Annotated[bool, typer.Option(help="With --max-restarts: take a left-out node back at the first epoch after it answers again.")] = False,
        batch_by: Annotated[BatchBy, typer.Option(help="Each rank's batch: equal; speed - in proportion to its node's speed, from the newest bench that timed every node alone, else the inventory's edgetrain_speed; the global batch, steps per epoch and learning rate stay (horovod, torch); or auto - the newest such bench's choice of the two (equal without one).")] = BatchBy.EQUAL,
        runs_dir: RunsDirOpt = Path("runs"),
        data_dir: DataDirOpt = None,
        options: JobOptions = JobOptions(),
    ) -> None:
        np = _ranks(np, submitting)
        if target in jobs.JOBS:
            options = bench_record.chosen_sync(options, runs_dir, target, inventory, np, _say)
        program = programs.resolve(target, list(script_args or []), options, workdir, dataset, requirements)
        config = configs.resolve(program, np=np, inventory=inventory, group=group, runtime=runtime, strategy=strategy, tf_port=tf_port,
                                 master_port=master_port, ps=ps, runs_dir=runs_dir, data_dir=data_dir, resume=resume, hang_timeout=hang_timeout,
                                 max_workdir_bytes=int(max_workdir_mb * 1024**2), max_workdir_files=max_workdir_files, ship_secrets=ship_secrets,
                                 restarts=configs.RestartPolicy(max_restarts, min_nodes, rejoin), log=_say,
                                 speeds=speeds.planned(batch_by, runs_dir, program.name, inventory, _say),
                                 run_id=None if submitting else os.environ.get(scheduler.RUN_ID_ENV))
        if submitting:
            _submit(config, ctx.meta[GIVEN])
            return
        _report(*supervisor.supervise(config, _attempt, lambda said: err_console.print(shown(said), highlight=False, soft_wrap=True)))

    return command


LAUNCH_SETTINGS = {"help_option_names": ["-h", "--help"]}
run = app.command("run", cls=_Launching, context_settings=LAUNCH_SETTINGS, help="Train with --np ranks: your script (arguments after --) or a built-in job. "
                  "Progress on the console, the rest in runs/<id>/.")(_launch_command(submitting=False))
submit = app.command("submit", cls=_Launching, context_settings=LAUNCH_SETTINGS, help="Queue a run through Slurm (the arguments of run): prints its run id "
                     "and job id; the job runs `edgetrain run` on whole nodes the scheduler gives it.")(_launch_command(submitting=True))


def _ranks(np: int | None, submitting: bool) -> int:
    """--np; without it, inside a Slurm allocation the tasks it holds (as mpirun and srun take), said
    on the run's first line. `submit` asks Slurm for its own."""
    if np is not None:
        return np
    held = None if submitting else allocation.current()
    if held is None:
        return 1
    _say(f"inside Slurm job {held.job_id}: --np {held.tasks}, the tasks it holds ({held.tasks_from})")
    return held.tasks


def _submit(config: configs.LaunchConfig, argv: list[str]) -> None:
    """The run as a Slurm batch job (``argv``: run's arguments), with its id chosen now so that the queue and the runs directory name it alike."""
    if config.resume:
        resumed = runs.find(config.runs_dir, config.resume)
        ran = resumed.record().job  # a run.json that names no job (damaged, or not a run's) is nothing to resume
        if ran != config.program.name:
            raise EdgetrainError(f"run {resumed.id} holds {f'a {ran}' if ran else 'no'} checkpoint, not {config.program.name}",
                                 f"resume it with: {launch.command_of(resumed, ran)}" if ran else "submit it anew")
        run_id = resumed.id
    else:
        run_id = runs.new_id(config.program.name)
    job = scheduler.submit(config, inventories.load(config.inventory), run_id, argv)
    console.print(f"run {run_id}: Slurm job {job}", markup=False, highlight=False)


def _attempt(started: launch.Launch) -> launch.Outcome:
    """One start of the run, prepared: what the console says before training, the training."""
    config = started.config
    if started.placement.oversubscribed:
        host, n = started.placement.ranks[0]
        err_console.print(f"edgetrain: warning: {n} ranks on the {host.slots} slots of {host.name}: ranks share cores")
    scaled = bench_record.latest(config.runs_dir, config.program.name, config.inventory)
    advice = None
    if scaled:
        try:
            advice = bench_record.advice(scaled, len(started.placement.hosts))
        except Exception as exc:  # noqa: BLE001 - advice from anyone's bench.json, after the run has started: never its end
            advice = f"edgetrain bench's advice left out: {scaled.path} did not read as a bench ({type(exc).__name__}: {exc})"
    if advice:
        _warn(advice)
    console.print(f"run {started.run.id}: logs and outputs in {started.run.path}", markup=False)
    if started.manifest is not None:
        for note in started.manifest.notes:
            _say(note)
        for shipped in started.runtime.shipped:
            console.print(f"{shipped.host}: working directory {len(started.manifest.entries)} files, "
                          f"{shipped.files} shipped ({shipped.bytes / 1024:,.0f} KiB) in {shipped.seconds:.1f} s")
    if started.runtime.has_nodes:
        console.print(f"preflight ok on {', '.join(h.name for h in started.placement.hosts)}")
    with ConsoleProgress(console) as bar:
        outcome = launch.execute(started, bar.event, _say)
    for problem in outcome.cleanup_errors:
        _warn(problem)
    return outcome


def _report(started: launch.Launch, outcome: launch.Outcome) -> None:
    """How the run ended: a line on success, else one error with what to do next."""
    if outcome.state is runs.Status.COMPLETED:
        m = outcome.last_metrics
        done = f": val_accuracy {m['val_accuracy']:.4f} after epoch {m['epoch']}" if "val_accuracy" in m else ""
        tested = started.run.test_score()
        if tested is not None:
            done += f", test accuracy {tested['test_accuracy']:.4f} ({tested.get('examples') or 0:,} test examples, scored once)"
        console.print(f"run {started.run.id} completed{done}", markup=False, soft_wrap=True)
        return
    if outcome.state is runs.Status.INTERRUPTED:
        raise Interrupted(f"run {started.run.id} interrupted", f"continue it with: {started.resume_command}")
    found = outcome.finding
    if found and found.disk_full_writing is not None:  # whether or not run.json fitted after it (launch.full_disk)
        raise launch.full_disk(started, found)
    for line in found.log_tail if found else ():
        err_console.print(shown(f"  | {line}"), highlight=False, soft_wrap=True)
    who = outcome.why
    if found and found.instead_of_resume:
        raise EdgetrainError(f"run {started.run.id}: {who}", f"logs in {started.run.path}; {found.instead_of_resume}")
    raise EdgetrainError(f"run {started.run.id}: {who}", f"logs in {started.run.path}; resume with: {started.resume_command}")


@dataclass(frozen=True)
class BenchCall:
    """What a program that runs `bench` through ``main`` hands it as the context's obj: E(N)'s one
    node, and the command bench.json records. The lab's emulated nodes share one machine, so it
    asks for concurrent one-node runs (lab/emulated_bench.py); real nodes share nothing."""

    reference: bench_runner.Reference
    command: tuple[str, ...]


@app.command(cls=_Launching, context_settings={"help_option_names": ["-h", "--help"]})
@with_job_options("bench", programs.parse_options)
def bench(
    ctx: typer.Context,
    target: Annotated[str, typer.Argument(metavar="SCRIPT|JOB", help="A built-in job (lenet, fashion) or your script (it must use edgetrain.callbacks, or edgetrain.ddp with --strategy torch).")] = "lenet",
    script_args: Annotated[list[str] | None, typer.Argument(metavar="[-- SCRIPT ARGS...]", help="Passed to your script unchanged.")] = None,
    inventory: InventoryOpt = None,
    group: GroupOpt = None,
    nodes: Annotated[str | None, typer.Option(help="Numbers of nodes to measure, e.g. 1,2,4 or 1-4 (default: 1 to every host).")] = None,
    repeat: Annotated[int, typer.Option(help="Runs per number of nodes (their median is reported).")] = 3,
    gradient_mb: Annotated[float | None, typer.Option(help="Scripts: the gradient's size in MB (parameters x 4 / 1e6) for the allreduce measurement.")] = None,
    strategy: StrategyOpt = DEFAULT,
    master_port: MasterPortOpt = configs.PORT_FLAGS["master_port"],
    max_restarts: MaxRestartsOpt = configs.RestartPolicy.max_restarts,
    min_nodes: MinNodesOpt = configs.RestartPolicy.min_nodes,
    runs_dir: RunsDirOpt = Path("runs"),
    sync_candidates: Annotated[str | None, typer.Option(metavar="K,K,..", help="Jobs: also predict E(N) at each N > 1 for each --sync-every K (both modes; given --outer-lr or --outer-momentum, weights only), measure each mode's best right after the N-loop's try there, and record the choice at the largest N for run --sync-every auto, e.g. 1,2,4,8.")] = None,
    options: JobOptions = JobOptions(),
) -> None:
    """Measure how training scales on the cluster (one rank per node), predict it first, plot it."""
    call = ctx.obj if isinstance(ctx.obj, BenchCall) else BenchCall(bench_runner.Reference.ALONE, ("edgetrain", *sys.argv[1:]))
    if gradient_mb is not None and not gradient_mb > 0:
        raise UsageError(f"--gradient-mb {gradient_mb} must be a positive number of megabytes")
    config = bench_runner.configured(target, list(script_args or []), options, strategy=strategy, master_port=master_port,
                                     restarts=configs.RestartPolicy(max_restarts, min_nodes), inventory=inventory, group=group,
                                     runs_dir=runs_dir, command=call.command, log=_say)
    b = bench_runner.Bench(config, options, nodes=bench_runner.parse_nodes(nodes), repeat=repeat,
                           gradient_bytes=int(gradient_mb * 1e6) if gradient_mb else None, reference=call.reference,
                           sync_candidates=bench_runner.parse_nodes(sync_candidates, "--sync-candidates", "--sync-every value"))
    points = b.run()
    goal = b.target_accuracy
    table = Table("N", "img/s", "img/CPU-s", "1 node img/s", "E(N)", "E predicted", "allreduce ms", "allreduce share",
                  f"s to {goal:.1%}" if goal else "s to target", box=None)
    for p in points:
        ar = b.allreduce.get(p.nodes)
        table.add_row(str(p.nodes), f"{p.images_per_sec:,.0f}" if p.images_per_sec else "-",
                      f"{p.images_per_cpu_second:,.0f}" if p.images_per_cpu_second else "-",
                      f"{p.reference:,.0f}" if p.reference else "-", _pct(p.efficiency),
                      _pct(p.predicted_efficiency) + (f" ({p.predicted_range[0]:.0%}-{p.predicted_range[1]:.0%})" if p.predicted_range else ""),
                      f"{ar.seconds * 1e3:.1f}" if ar else "-", _pct(p.comm_share),
                      f"{p.seconds_to_target:.0f}" if p.seconds_to_target is not None else "-")
    console.print(table)
    console.print(f"results: {b.dir}/bench.json" + (f", plot: {b.plot}" if b.plot else ""), highlight=False, soft_wrap=True)


def _pct(value: float | None) -> str:
    return f"{value:.0%}" if value is not None else "-"


@app.command()
def collect(
    run_id: Annotated[str, typer.Argument(metavar="RUN", help="Run id (or a unique prefix).")],
    dest: Annotated[Path, typer.Option(help="Directory to copy the run into (as DEST/<run-id>/).")],
    inventory: Annotated[Path | None, typer.Option("--inventory", "-i", help="Inventory of a container run (default: the one it ran with).")] = None,
    runs_dir: RunsDirOpt = Path("runs"),
) -> None:
    """Copy a run's checkpoints, metrics and logs to DEST (from its rank-0 node for container runs), verifying every checkpoint file."""
    run = runs.find(runs_dir, run_id)
    where = run.record().placement
    if where is not None and where.runtime == "docker":
        inv = inventories.load(inventory or Path(where.inventory))
        result = collecting.collect_remote(run, inv, dest)
    else:
        result = collecting.collect_local(run, dest)
    for problem in result.warnings:
        _warn(problem)
    verified = [f"checkpoints {', '.join(map(str, result.checkpoints))}"] if result.checkpoints else []
    verified += [f"{len(result.outputs)} outputs"] if result.outputs else []
    console.print(f"{result.dest}: {' and '.join(verified)} verified; "
                  f"{len(result.copied)} files copied, {len(result.unchanged)} already there")


@app.command()
def doctor(
    inventory: Annotated[Path | None, typer.Option("--inventory", "-i", help="Check a cluster's nodes and probe MPI across their containers.")] = None,
    np: Annotated[int | None, typer.Option("--np", help="Ranks to probe (default: every slot).")] = None,
    group: GroupOpt = None,
    job: Annotated[str, typer.Option(help="Whose dataset to verify on the nodes.")] = "lenet",
    runs_dir: RunsDirOpt = Path("runs"),
    data_dir: DataDirOpt = None,
) -> None:
    """Check that this machine (or with -i, every node of a cluster) can train."""
    if inventory is None:
        checks = doctoring.local_checks(runs_dir, data_dir)
        table = Table("check", "", "detail", box=None)
        for c in checks:
            table.add_row(c.name, "[green]ok[/]" if c.ok else "[red]FAIL[/]", shown(c.detail))
        console.print(table)
        failed = [c.name for c in checks if not c.ok]
        if failed:
            raise EdgetrainError(f"{len(failed)} check(s) failed: {', '.join(failed)}")
        return
    inv = inventories.load(inventory)
    seen = doctoring.scheduler_checks(inv)
    if seen:
        view = Table("node", "slurm", "", box=None)
        for c in seen:
            view.add_row(c.name, shown(c.detail), "[green]ok[/]" if c.ok else "[red]FAIL[/]")
        console.print(view)
    report = doctoring.check_cluster(inv, np, group, job)
    table = Table("node", "check", "", "detail", box=None)
    for node in report.nodes:
        for c in node.checks:
            table.add_row(node.host.name, c.name, "[green]ok[/]" if c.ok else "[red]FAIL[/]", shown(c.detail))
    console.print(table)
    if report.probe is not None:
        ranks = Table("rank", "host", "arch", "TensorFlow", "Horovod", "MPI", box=None)
        for r in report.probe.ranks:
            ranks.add_row(*(shown(str(r[k])) for k in ("rank", "host", "arch", "tensorflow", "horovod", "mpi")))
        console.print(ranks)
        console.print(f"MPI probe: {len(report.probe.ranks)} ranks, allreduce ok, {report.probe.seconds:.1f} s")
    failed = [f"{n.host.name} ({n.failure.name})" for n in report.nodes if n.failure]
    if failed:
        raise EdgetrainError(f"preflight failed on {', '.join(failed)}")


@app.command()
def clean(inventory: Annotated[Path, typer.Option("--inventory", "-i", help="The cluster whose nodes to clean.")],
          runs_dir: RunsDirOpt = Path("runs"),
          store: Annotated[bool, typer.Option("--store", help="Also prune each node's file store: the shipped files no going run uses.")] = False) -> None:
    """Remove edgetrain containers proven dead (stopped, their run ended here, or their lease run out on the node); any other is kept."""
    def here(run_id: str) -> containers.Here:
        try:
            return containers.Here.LIVE if runs.find(runs_dir, run_id).live() else containers.Here.ENDED
        except EdgetrainError:
            return containers.Here.UNKNOWN  # another runs directory's, another controller's, or a doctor probe's

    inv = inventories.load(inventory)
    with Nodes() as nodes:
        found = containers.clean(nodes, [h for h in inv.hosts if h.runtime == "docker"], here)
    for c in found:
        _say(f"{c.host}: {c.container} ({c.detail})")
    console.print(f"{sum(c.removed for c in found)} container(s) removed, {sum(not c.removed for c in found)} kept")
    if store:
        with Nodes() as nodes:
            pruned = shipping.prune_stores(nodes, inv.hosts, str(runs_dir.resolve()), {r.id for r in runs.all_runs(runs_dir) if r.live()})
        for p in pruned:
            console.print(f"{p.host}: file store: {p.files} file(s) removed ({p.bytes / 1024**2:,.1f} MiB), "
                          f"{p.views} finished run(s) forgotten", markup=False, highlight=False)
    if any(not c.removed and not c.kept_alive for c in found):
        raise EdgetrainError("some containers could not be removed (see above)")


JsonOpt = Annotated[bool, typer.Option("--json", help=f"Print JSON (schema {runs.SCHEMA}) instead of a table.")]


@runs_app.command("list")
def runs_list(runs_dir: RunsDirOpt = Path("runs"), as_json: JsonOpt = False) -> None:
    """One line per run."""
    summaries = [runs.summarize(r) for r in runs.all_runs(runs_dir)]
    try:
        read = scheduler.queue(runs_dir)
    except EdgetrainError as exc:  # the runs directory's records stand without the queue
        _warn(f"Slurm's queue left out: {exc}")
        read = scheduler.Queue([])
    queued = read.jobs
    if read.unreadable:
        _warn(f"{read.unreadable} line(s) of Slurm's queue or of your job records did not read as they must and are left out")
    if as_json:
        print(json.dumps({"schema": runs.SCHEMA, "runs": [s.as_json() for s in summaries],
                          "slurm": [{**asdict(j), "state": j.state.value} for j in queued]}, indent=1))
        return
    table = Table("job", "status", "epochs", "val_accuracy", "img/s", "checkpoint", box=None)
    table.columns.insert(0, Column("run", no_wrap=True, min_width=27))
    problems: list[str] = []
    for s in summaries:
        problems += s.problems
        table.add_row(shown(s.id), shown(s.job), s.status.value, str(s.epochs), f"{s.val_accuracy:.4f}" if s.val_accuracy is not None else "-",
                      f"{s.images_per_sec:,.0f}" if s.images_per_sec else "-", f"epoch {s.checkpoint}" if s.checkpoint else "-")
    console.print(table)
    if queued:
        jobs = Table("run", "slurm job", "state", "user", "nodes", "where / why", box=None)
        for j in queued:
            jobs.add_row(shown(j.run_id), j.job_id, j.state.value.lower(), shown(j.user), str(j.nodes),
                         shown(j.nodelist if j.state is scheduler.JobState.RUNNING else j.reason))
        console.print(jobs)
    for problem in problems:
        _warn(problem)


@app.command()
def cancel(run_id: Annotated[str, typer.Argument(metavar="RUN", help="A run you submitted: its id (or a unique prefix).")],
           runs_dir: RunsDirOpt = Path("runs")) -> None:
    """End a run you submitted: a queued one leaves the queue; a running one stops as after Ctrl-C (containers removed, run recorded interrupted)."""
    job = scheduler.cancel(run_id, runs_dir)
    ended = ("signalled: it removes its containers and records the run interrupted" if job.state is scheduler.JobState.RUNNING
             else "taken out of the queue")
    console.print(f"run {job.run_id}: Slurm job {job.job_id} {ended}", markup=False, highlight=False)


@runs_app.command("show")
def runs_show(run_id: Annotated[str, typer.Argument(metavar="RUN", help="Run id (or a unique prefix).")], runs_dir: RunsDirOpt = Path("runs"),
              as_json: JsonOpt = False,
              plot: Annotated[bool, typer.Option("--plot", help="Also draw its accuracy and img/s over time into RUN/plot.svg.")] = False) -> None:
    """A run's program, placement, versions, per-epoch metrics and rank 0's outputs."""
    r = runs.find(runs_dir, run_id)
    drawn = plots.draw(runs_dir, [r.id]) if plot else None
    rec = r.record()
    # What is intact is shown; each damaged file, one line.
    problems = list(runs.summarize(r).problems)
    try:
        outputs = collecting.outputs_of(r, problems.append)
    except EdgetrainError as exc:
        outputs = {}
        problems.append(str(exc))
    if as_json:
        print(json.dumps({"schema": runs.SCHEMA, "id": r.id, "path": str(r.path), "status": r.status().value, "record": rec.to_json(),
                          "metrics": r.metrics(), "evaluations": r.evaluations(), "test": r.test_score(), "outputs": outputs,
                          "problems": problems}, indent=1, default=str))
        return
    where = rec.placement
    console.print(Text.assemble((shown(r.id).plain, "bold"), shown(f"  {rec.kind.value} {rec.job}  status {r.status().value}  ({r.path})")), highlight=False)
    if r.status() is runs.Status.ABANDONED:
        # soft_wrap: the terminal wraps the command, rich would break it into lines that do not paste back.
        console.print(f"the edgetrain that ran it ended without recording an outcome; continue it with: "
                      f"{launch.command_of(r, rec.job)}", markup=False, highlight=False, soft_wrap=True)
    _say(f"program: {rec.program.script or rec.job} {shlex.join(rec.program.args)}")
    if where is not None:
        console.print(f"placement: {where.np} ranks on " + ", ".join(f"{h['host']}:{h['ranks']}" for h in where.hosts)
                      + f" ({where.runtime} runtime, {where.strategy})", markup=False, highlight=False)
        if where.speeds:
            _say(_batches_line(where))
    _say("versions: " + ", ".join(f"{k} {v}" for k, v in rec.versions.items()))
    for n, a in enumerate(rec.attempts, 1) if len(rec.attempts) > 1 or any(a.went_on_without for a in rec.attempts) else ():
        resumed = f", resumed from epoch {a.resumed_from_epoch}" if a.resumed_from_epoch is not None else ""
        left_out = "".join(f"; {node} left out ({why})" for node, why in a.excluded.items())
        lost = "".join(f"; went on without {node} ({why})" for node, why in a.went_on_without.items())
        ended = f"; ended: {a.ended_by}" if a.ended_by else ""
        _say(f"attempt {n} ({a.started}): {a.np} ranks{resumed}{left_out}{lost}{ended}")
    metrics = r.metrics()
    if metrics:
        columns = [k for k in metrics[-1] if k not in ("epoch", "ranks")]
        table = Table("epoch", *(Column(shown(k)) for k in columns), box=None)
        for m in metrics:
            table.add_row(shown(str(m["epoch"])), *(shown(_cell(m.get(k))) for k in columns))
        console.print(table)
    target = runs.time_to_target(r)
    if target is not None:
        console.print(target, markup=False, highlight=False)
    tested = r.test_score()
    if tested is not None:
        console.print(f"test accuracy {tested['test_accuracy']:.4f} on {tested.get('examples') or 0:,} test examples, scored once "
                      f"after training (validation was held out of the training set)", markup=False, highlight=False)
    if outputs:
        home = "" if where is None or where.runtime != "docker" or not where.hosts else f" (on {where.hosts[0]['host']} until: edgetrain collect {r.id} --dest DIR)"
        console.print(f"outputs of rank 0{home}:", markup=False, highlight=False)
        for rel, digest in outputs.items():
            _say(f"  {rel}  sha256 {digest[:16]}")
    if drawn is not None:
        console.print(f"plot: {drawn}", markup=False, highlight=False, soft_wrap=True)
    for problem in problems:
        _warn(problem)


def _batches_line(where) -> str:
    """Each rank's batch by speed (its share of the global batch until the program reported them)."""
    hosts = [h["host"] for h in where.hosts for _ in range(h["ranks"])]
    total = sum(where.speeds)
    each = (f"rank {r} on {host}: {where.batches[r]}" if where.batches and len(where.batches) == len(hosts)
            else f"rank {r} on {host}: {where.speeds[r] / total:.0%} of the global batch" for r, host in enumerate(hosts))
    return f"batches by speed (from {where.speeds_from}): " + ", ".join(each)


@runs_app.command("plot")
def runs_plot(ids: Annotated[list[str], typer.Argument(metavar="RUN|BENCH", help="Runs, or benches (their directories' names), on one figure.")],
              runs_dir: RunsDirOpt = Path("runs"),
              out: Annotated[Path | None, typer.Option(help="The file to write, .svg, .png or .pdf (default: plot.svg in the one run's or bench's directory).")] = None,
              label: Annotated[list[str] | None, typer.Option(help="A legend name per id, in order (e.g. the emulation bracket of each bench).")] = None) -> None:
    """Runs' accuracy and img/s over time, or benches' img/s, E(N) and time to accuracy against N, on one figure."""
    console.print(f"plot: {plots.draw(runs_dir, ids, out, label)}", markup=False, highlight=False, soft_wrap=True)


def _cell(value) -> str:
    if isinstance(value, float):
        return f"{value:,.0f}" if abs(value) >= 100 else f"{value:.4f}"
    return "-" if value is None else str(value)


@data_app.command("list")
def data_list(data_dir: DataDirOpt = None) -> None:
    """Where each dataset is looked for, and which copy a run would use."""
    for name in datasets.DATASETS:
        try:
            found = datasets.locate(name, data_dir).describe()
        except EdgetrainError as exc:
            console.print(f"[bold]{name}[/]: [red]{exc}[/]")
        else:
            console.print(f"[bold]{name}[/]: {found}")
            console.print(f"  serves Keras' {datasets.KERAS_LOAD_DATA[name]} in host-runtime runs' ranks "
                          "(in containers: the node's staged copy)")
        for loc in datasets.search_path(name, data_dir):
            console.print(f"  {loc.origin}: {loc.path}")


@data_app.command("verify")
def data_verify(
    dataset: Annotated[str | None, typer.Argument(help="mnist or fashion-mnist (default: both).")] = None,
    data_dir: DataDirOpt = None,
) -> None:
    """Check the files a run would use against their sha256."""
    for name in [dataset] if dataset else datasets.DATASETS:
        console.print(f"{name}: ok, {datasets.locate(name, data_dir).describe()}")


@data_app.command("import")
def data_import(files: Annotated[list[Path], typer.Argument(help="Dataset files, any names: they are recognised by sha256.")]) -> None:
    """Copy known dataset files into the user cache under their canonical names."""
    for path in datasets.import_files(files):
        console.print(f"imported {path}")


@data_app.command("fetch")
def data_fetch(
    dataset: Annotated[str, typer.Argument(help="mnist or fashion-mnist.")],
    mirror: Annotated[str | None, typer.Option(help="Base URL to download from instead of the canonical mirrors.")] = None,
) -> None:
    """Download a dataset into the user cache (needs a network; runs never download)."""
    console.print(f"{dataset}: {datasets.fetch(dataset, mirror).describe()}")


ImageArchArg = Annotated[str, typer.Option("--arch", help="arm64 (Raspberry Pi 4), amd64 (x86_64 CPU) or cuda (NVIDIA GPU).")]
CacheOpt = Annotated[Path | None, typer.Option("--cache-dir", envvar="EDGETRAIN_CACHE_DIR", help="Wheelhouse and base root file system cache.")]


@images_app.command("base")
def images_base(
    arch: ImageArchArg,
    mirror: Annotated[str, typer.Option(help="Debian mirror for debootstrap.")] = imaging.DEFAULT_DEBIAN_MIRROR,
    cache_dir: CacheOpt = None,
) -> None:
    """Make a minimal Debian base image with debootstrap + docker import (no registry needed)."""
    tag = imaging.make_base(imaging.target(arch), cache_dir or imaging.default_cache_dir(), mirror=mirror, log=_say)
    console.print(tag)


@images_app.command("build")
def images_build(
    arch: ImageArchArg,
    base_image: Annotated[str | None, typer.Option(help="BASE_IMAGE (default: the local base from `edgetrain images base`, else the Dockerfile's).")] = None,
    apt_mirror: Annotated[str | None, typer.Option(help="Distribution mirror apt uses inside the build.")] = None,
    apt_proxy: Annotated[str | None, typer.Option(help="HTTP proxy apt uses inside the build.")] = None,
    arch_flags: Annotated[str | None, typer.Option(help="HOROVOD_BUILD_ARCH_FLAGS (default: the architecture's baseline).")] = None,
    tag: Annotated[str | None, typer.Option(help="Image tag (default edgetrain:<version>-<arch>).")] = None,
    requirements: Annotated[Path | None, typer.Option(help="Bake these extra Python packages in (wheels downloaded here, installed offline).")] = None,
    cache_dir: CacheOpt = None,
) -> None:
    """Build an image offline from a wheelhouse; fails unless Horovod in it has TensorFlow and MPI."""
    if requirements is not None:
        extra.read(requirements)  # a bad file is refused before the long build
    result = imaging.build(
        imaging.target(arch), cache_dir or imaging.default_cache_dir(), base_image=base_image,
        apt_mirror=apt_mirror, apt_proxy=apt_proxy, arch_flags=arch_flags, tag=tag, log=_say,
    )
    console.print(f"{result.tag}: {result.image_id}, {result.size_bytes / 1e9:.2f} GB, {result.seconds:.0f} s")
    if requirements is not None:
        built = extra.build_image(arch, result.tag, requirements, _say)
        console.print(f"{built}: with {requirements}, {imaging.local_image_id(built)}")


@images_app.command("distribute")
def images_distribute(inventory: InventoryOpt = None) -> None:
    """Ship every docker node the image of its arch (docker save | ssh node docker load), verified by image ID."""
    shipped = imaging.distribute(inventories.load(inventory), log=_say)
    console.print(f"{sum(s.loaded for s in shipped)} node(s) loaded, {sum(not s.loaded for s in shipped)} already up to date")


@images_app.command("list")
def images_list(inventory: InventoryOpt = None) -> None:
    """Per node: tag, image ID, arch, created."""
    table = Table("node", "tag", "image id", "arch", "created", box=None)
    for row in imaging.list_images(inventories.load(inventory)):
        table.add_row(row.host, row.tag, row.image_id[7:19], row.arch, row.created)
    console.print(table)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def main(args: list[str] | None = None, obj: object = None) -> None:
    """The CLI on ``args`` (default: this process's), each command's context holding ``obj``."""
    # `kill -USR1 <pid>` prints every thread's stack to stderr: how a command that seems stuck is diagnosed.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    # A program killed while it held this terminal (an ssh) can leave it non-blocking, which breaks
    # Ansible's inventory reader ("requires blocking IO"): edgetrain needs it blocking, and says so.
    for fd in (0, 1, 2):
        try:
            os.set_blocking(fd, True)
        except OSError:
            pass
    # Typer's standalone mode handles its own usage errors (exit 2); ours become one line here.
    try:
        app(args=args, obj=obj)
    except EdgetrainError as exc:
        err_console.print(shown(f"edgetrain: error: {exc}"), highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
