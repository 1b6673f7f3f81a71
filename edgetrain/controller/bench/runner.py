"""The bench's runs: the allreduce probes, the job at every N, the --sync-every candidates, each node alone (the package's docstring says which, in what order)."""

from __future__ import annotations

import threading
import time
from dataclasses import replace
from enum import Enum
from pathlib import Path
from typing import Any

from edgetrain.controller import config as configs
from edgetrain.controller import inventory, launch, overlap, placement, plots, supervisor
from edgetrain.controller import program as programs
from edgetrain.controller import speeds, strategies
from edgetrain.controller.bench import record
from edgetrain.controller.bench.model import (Allreduce, BatchChoice, Prediction, SyncCandidate, best_per_mode, choose, choose_batches,
                                              evaluation_interval, median, predict)
from edgetrain.controller.bench.record import BenchRecord, Point, SyncChoice, Trial
from edgetrain.controller.config import Attempt
from edgetrain.controller.program import JobOptions, Program
from edgetrain.controller.strategies import STRATEGIES
from edgetrain.shared import job_options, jobs, runs
from edgetrain.shared.datasets import trained_on
from edgetrain.shared.errors import EdgetrainError, Interrupted, UsageError
from edgetrain.shared.strategies import DEFAULT
from edgetrain.shared.sync import Sync, SyncMode


# (t)'s runs: enough steps for evaluations past the first execution's tracing, short beside a try.
TIMING_STEPS = 64


class Reference(str, Enum):
    """What E(N) divides by: N times one node's img/s, measured how."""

    ALONE = "alone"  # one node's run by itself: real nodes share nothing, so this is theirs
    CONCURRENT = "concurrent"  # at each N, N one-node runs at once: nodes that share one machine


def parse_nodes(spec: str | None, flag: str = "--nodes", what: str = "node count") -> list[int] | None:
    """``1,2,4`` or ``1-4``."""
    if spec is None:
        return None
    found: list[int] = []
    try:
        for part in spec.split(","):
            lo, sep, hi = part.partition("-")
            found += list(range(int(lo), int(hi) + 1)) if sep else [int(lo)]
    except ValueError:
        raise UsageError(f"{flag} {spec!r} is not a list of {what}s", f"e.g. {flag} 1,2,4 or {flag} 1-4") from None
    if not found:
        raise UsageError(f"{flag} {spec!r} names no {what}", f"e.g. {flag} 1-4")
    return found


def _steady_evaluations(run: runs.Run, *needs: str) -> list[dict[str, Any]]:
    """The run's evaluations that count training images and hold ``needs``, in the attempt that
    started it (a resume restarts the clocks)."""
    return [e for e in run.evaluations() if e.get("images") and all(e.get(k) is not None for k in needs)
            and "resumed_after_epoch" not in e]


def steady_rate(run: runs.Run) -> float | None:
    """Training img/s after warm-up: between the first and the last evaluation, in training steps
    only (the records' ``train_seconds``; from runs that predate it, their clock less the evaluations,
    which also counts the work between epochs), else the last epoch's. A run stopped at its target
    inside epoch 1 has only that epoch, whose figure carries TensorFlow's tracing."""
    evals = _steady_evaluations(run, "seconds", "eval_seconds")
    if len(evals) >= 2:
        first, last = evals[0], evals[-1]
        if first.get("train_seconds") is not None and last.get("train_seconds") is not None:
            seconds = last["train_seconds"] - first["train_seconds"]
        else:
            seconds = last["seconds"] - first["seconds"] - sum(e["eval_seconds"] for e in evals[1:])
        if seconds > 0 and last["images"] > first["images"]:
            return float((last["images"] - first["images"]) / seconds)
    epochs = [m for m in run.metrics() if m.get("images_per_sec")]
    return epochs[-1]["images_per_sec"] if epochs else None


def cpu_rate(run: runs.Run) -> float | None:
    """Images per CPU-second of training, all ranks' processes summed (every thread: the framework's
    and the communication's), between the first and the last evaluation as ``steady_rate`` takes
    img/s; None for runs whose records lack the CPU clock (tf-multiworker, older runs). Where
    it falls as N grows, the nodes spend CPU on communicating or waiting, not only on training."""
    evals = _steady_evaluations(run, "train_cpu_seconds")
    if len(evals) < 2:
        return None
    first, last = evals[0], evals[-1]
    cpu = last["train_cpu_seconds"] - first["train_cpu_seconds"]
    return (last["images"] - first["images"]) / cpu if cpu > 0 and last["images"] > first["images"] else None


def busy_cores_of(run: runs.Run) -> float | None:
    """The CPU a run's training kept busy on each node: its ranks' CPU seconds in training steps over
    the steps' wall seconds, per rank (bench runs one a node), at its last evaluation - so a run
    stopped at its first has it too; None for runs whose records lack the CPU clock."""
    evals = _steady_evaluations(run, "train_cpu_seconds", "train_seconds")
    if not evals or not evals[-1]["train_seconds"]:
        return None
    last = evals[-1]
    return float(last["train_cpu_seconds"] / last["train_seconds"] / last.get("ranks", 1))


def configured(target: str, passthrough: list[str], options: JobOptions, *, strategy: str = DEFAULT,
               **settings: Any) -> configs.LaunchConfig:
    """What every run of a bench of ``target`` starts from, as `edgetrain run` would resolve it with
    one rank per node (``settings``: configs.resolve's, and LaunchConfig's other fields); each run
    replaces its program and N. Its ``log`` says the bench's lines (its runs' own are not said)."""
    script = target not in jobs.JOBS
    # A script's target accuracy is only read from its metrics: it is not the script's option.
    program = programs.resolve(target, passthrough, replace(options, target_accuracy=None) if script else options)
    chosen = strategies.named(strategy)
    if chosen.probe is None:
        raise UsageError(f"bench cannot time --strategy {strategy}'s communication",
                         f"bench measures --strategy {' or '.join(s.name for s in STRATEGIES.values() if s.probe)}")
    if program.job is not None and not chosen.builtin_jobs:
        raise UsageError(f"the built-in job {program.job.name} trains with {DEFAULT}, not --strategy {strategy}",
                         f"drop --strategy, or bench your own script: edgetrain bench SCRIPT --strategy {strategy} --gradient-mb MB")
    return configs.resolve(program, strategy=strategy, per_node=1, **settings)


class Bench:
    def __init__(self, config: configs.LaunchConfig, options: JobOptions, *, nodes: list[int] | None = None, repeat: int = 3,
                 gradient_bytes: int | None = None, reference: Reference = Reference.ALONE,
                 sync_candidates: list[int] | None = None):
        """A bench from ``config`` (``configured``'s, of the same ``options``) on ``nodes`` (default
        1..every host of its group), ``repeat`` tries each; ``gradient_bytes`` a script's gradient
        (default: a built-in job's parameter count x 4); ``sync_candidates`` the K of (s)."""
        self.options, self.repeat, self.reference_mode, self.sync_candidates = options, repeat, reference, sync_candidates
        self.log = config.log
        self.program = config.program
        job = self.program.job
        self.target_accuracy = options.target_accuracy or (job.target_accuracy if job else None)
        if self.target_accuracy is not None and not 0 < self.target_accuracy <= 1:
            raise UsageError(f"--target-accuracy {self.target_accuracy} must be a fraction in (0, 1]", "e.g. --target-accuracy 0.985")
        self.fp16 = options.fp16_allreduce
        self.sync = job_options.sync_of(options.__dict__)
        self.strategy = config.strategy
        inv = inventory.load(config.inventory)
        self.hosts = placement.select(inv, config.group)
        most = len(self.hosts)
        self.nodes = sorted(set(nodes or range(1, most + 1)))
        if self.nodes[0] < 1 or self.nodes[-1] > most:
            raise UsageError(f"--nodes {self.nodes[-1] if self.nodes[-1] > most else self.nodes[0]} is not between 1 and "
                             f"the {most} hosts of the inventory", f"use --nodes 1..{most}")
        if repeat < 1:
            raise UsageError(f"--repeat {repeat} must be at least 1")
        if sync_candidates and job is None:
            raise UsageError("--sync-candidates is for the built-in jobs: a script talks as it is written",
                             "bench the script with its own setting, e.g. -- --sync-every 4")
        if sync_candidates and min(sync_candidates) < 1:
            raise UsageError(f"--sync-candidates {min(sync_candidates)} must be at least 1", "e.g. --sync-candidates 1,2,4,8")
        self.gradients: list[overlap.Gradient] | None = None  # a built-in job's, from its spec's layers
        if job is not None:
            self.gradient = gradient_bytes or job.gradient_bytes(self.program.checkpoint_options)
            self.gradients = overlap.schedule(job.layers(self.program.checkpoint_options))
        elif gradient_bytes:
            self.gradient = gradient_bytes
        else:
            raise UsageError("bench cannot count a script's parameters", "give the gradient's size: --gradient-mb MB (float32 parameters x 4 / 1e6)")
        # Every run of the bench is this config with its own program and N (one rank per node).
        self.config = replace(config, log=lambda line: None)
        self.lost: dict[str, str] = {}  # nodes restarts left out: later runs go without them
        self.root = runs.ensure_writable(config.runs_dir)
        self.dir = self.root / runs.new_id(f"bench-{self.program.name}")
        self.allreduce: dict[int, Allreduce] = {}
        self.trials: list[Trial] = []
        self.predicted: dict[int, Prediction] = {}
        self.sync_predicted: dict[int, list[SyncCandidate]] = {}  # (s), by N
        self.candidates: list[SyncCandidate] = []  # (s), at every N: predicted, and measured where tried
        self.choice: SyncChoice | None = None
        self.each_node: list[Trial] | None = None  # (t), once timed
        self.batch_choice: BatchChoice | None = None  # (t), once chosen
        self.plot: Path | None = None  # bench.svg, once drawn
        self.started = time.monotonic()

    # -- one launch ---------------------------------------------------------------------------
    def _launch(self, program: Program, n: int, what: str, on: str | None = None) -> tuple[runs.Run, launch.Outcome, list[dict[str, Any]], dict[str, str]]:
        """One run on the first ``n`` hosts left, or on host ``on`` alone, under the supervisor (a
        lost node restarts a training run as it would `edgetrain run`'s): the run, how it ended,
        its events, and the nodes its restarts left out."""
        seen: list[dict[str, Any]] = []
        others = {h.name: f"bench: a one-node run on {on}" for h in self.hosts if on is not None and h.name != on}
        restarts = self.config.restarts if program.keeps_checkpoints else configs.RestartPolicy()
        config = replace(self.config, program=program, np=n, restarts=restarts, command=(*self.config.command, f"# {what}"))
        configs.check(config)

        def on_event(e: dict[str, Any]) -> None:
            seen.append(e)
            if e["event"] == "epoch":
                acc = f", val_accuracy {e['val_accuracy']:.4f}" if "val_accuracy" in e else ""
                ips = f", {e['images_per_sec']:,.0f} img/s" if e.get("images_per_sec") else ""
                self.log(f"  {what}: epoch {e['epoch']}{acc}{ips}")

        first = Attempt.first(config, excluded={**others, **self.lost})
        started, outcome = supervisor.supervise(config, lambda one: launch.execute(one, on_event, lambda line: None),
                                                lambda said: self.log(f"  {what}: {said}"), first)
        if outcome.state is runs.Status.INTERRUPTED:  # the user's stop ends the bench, not only this run
            raise Interrupted(f"bench {self.dir.name} interrupted during run {started.run.id}",
                              f"what it measured before is in {self.dir / 'bench.json'}")
        lost = {k: v for k, v in started.attempt.excluded.items() if k not in first.excluded}
        self.lost.update(lost)
        return started.run, outcome, seen, lost

    def measure_allreduce(self, n: int, nbytes: int) -> Allreduce:
        args = ["--bytes", str(nbytes)] + (["--fp16"] if self.fp16 else [])
        probe = Program("allreduce", tuple(args), module=self.strategy.probe)
        run, outcome, seen, _ = self._launch(probe, n, f"allreduce on {n} nodes")
        found = [e for e in seen if e["event"] == "allreduce"]
        if outcome.state is not runs.Status.COMPLETED or not found:
            why = outcome.why if outcome.state is not runs.Status.COMPLETED else "it reported no allreduce"
            raise EdgetrainError(f"the allreduce probe on {n} nodes failed ({why})",
                                 f"its logs: {run.path}")
        e = found[-1]
        return Allreduce(n, nbytes, e["seconds"], e["cpu_seconds"], e["latency_seconds"], run.id, e["transport"], e["cycle_seconds"],
                         e["idle_cpu_per_second"])

    def _reached(self, trial: Trial) -> str:
        """What a try's (c) line says of its target and its test score."""
        if trial.seconds_to_target_from_launch is not None:
            out = f", target at {trial.seconds_to_target:.0f} s ({trial.seconds_to_target_from_launch:.0f} s from the launch)"
        elif self.target_accuracy and trial.status == runs.Status.COMPLETED.value:
            out = f", {self.target_accuracy:.1%} not reached"
        else:
            out = ""
        return out + (f", test accuracy {trial.test_accuracy:.4f}" if trial.test_accuracy is not None else "")

    def program_for(self, n: int, attempt: int = 1, sync: Sync | None = None, timing: bool = False) -> Program:
        """The job as it runs on ``n`` nodes in try ``attempt``: timed to the target, evaluated four
        times an epoch unless told, and seeded by the try - the same seed at every N, so each try
        compares N on one trajectory and the median is over several, not over one replayed. With
        ``timing``, (t)'s run: one epoch of at most TIMING_STEPS steps, not to the target."""
        if self.program.job is None:
            return self.program
        o = self.options
        if timing:
            o = replace(o, epochs=1, max_steps=min(o.max_steps or TIMING_STEPS, TIMING_STEPS))
        steps = trained_on(self.program.job.dataset, o.holdout) // n // self.batch_size()
        # An epoch cut short by --max-steps is evaluated four times too: otherwise a short run at few
        # nodes had only its last evaluation, its img/s carried the warm-up, and E(N) set it against
        # a steady rate at more nodes (docs/scaling-history.md, the fashion model).
        steps = min(steps, o.max_steps) if o.max_steps else steps
        if sync is not None:
            o = replace(o, sync_every=sync.sync_every, sync_mode=sync.sync_mode)
        return programs.resolve(self.program.name, [], replace(o, target_accuracy=None if timing else self.target_accuracy, seed=self._seed(attempt),
                                                              eval_every=o.eval_every or evaluation_interval(steps, o.steps_per_execution)))

    def _seed(self, attempt: int) -> int:
        return self.options.seed + attempt - 1

    def train(self, n: int, attempt: int, on: str | None = None, beside: int = 0, sync: Sync | None = None,
              timing: bool = False) -> Trial:
        what = f"{n} node{'s' if n > 1 else ''}, try {attempt}/{self.repeat}" + (f", on {on} beside {beside} more" if on else "")
        if sync is not None:
            what += f", --sync-every {sync.sync_every} {sync.sync_mode.value}"
        if timing:
            what = f"{on} alone, timed"
        program = self.program_for(n, attempt, sync, timing)
        run, outcome, _, lost = self._launch(program, n, what, on)
        metrics = run.metrics()
        epochs = [m for m in metrics if m.get("images_per_sec")]
        if outcome.state is not runs.Status.COMPLETED:
            self.log(f"  {n} node{'s' if n > 1 else ''}, try {attempt}: run {run.id} {outcome.state.value}: {outcome.why}")
        elif not epochs:
            raise EdgetrainError(f"run {run.id} recorded no img/s in {run.METRICS}",
                                 f"bench reads a script's figures from {self.strategy.progress}: add it to the script")
        ips = steady_rate(run)
        got = runs.to_target(run, self.target_accuracy) if self.target_accuracy is not None else runs.ToTarget()
        tested = run.test_score()
        return Trial(n, run.id, ips, got.seconds_to_target, got.images_to_target, outcome.state.value, cpu_rate(run),
                     tested["test_accuracy"] if tested else None, got.seconds_to_target_from_launch, beside, busy_cores_of(run),
                     self._seed(attempt) if self.program.job is not None else None, lost,
                     *(((sync or self.sync).sync_every, (sync or self.sync).sync_mode.value)), program.trained_with, on)

    def train_concurrently(self, n: int, attempt: int) -> list[Trial]:
        """The one-node job on each of the first ``n`` hosts at once (each run's own threads: a run
        waits on its processes, so they overlap; daemons, so an interrupted bench does not wait for
        them, and their containers end themselves once the controller is gone)."""
        hosts = [h.name for h in self.left[:n]]
        done: dict[str, Trial | Exception] = {}

        def one(host: str) -> None:
            try:
                done[host] = self.train(1, attempt, on=host, beside=n - 1)
            except Exception as exc:  # noqa: BLE001 - raised in the bench's thread below
                done[host] = exc

        threads = [threading.Thread(target=one, args=(h,), name=f"bench-{h}", daemon=True) for h in hosts]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        trials = []
        for h in hosts:
            got = done[h]
            if isinstance(got, Exception):
                raise got
            trials.append(got)
        return trials

    # -- the whole bench ----------------------------------------------------------------------
    def run(self) -> list[Point]:
        log = self.log
        self.dir.mkdir()
        nbytes = self.gradient
        log(f"bench {self.dir.name}: {self.program.name} ({self.strategy.name}) on {', '.join(h.name for h in self.hosts[:self.nodes[-1]])}, "
            f"one rank per node, N = {', '.join(map(str, self.nodes))}, {self.repeat} tries each; gradient {nbytes / 1e6:.2f} MB"
            + (" (fp16 on the wire)" if self.fp16 else ""))
        for n in (n for n in self.nodes if n > 1):
            ar = self.allreduce[n] = self.measure_allreduce(n, nbytes)
            log(f"(a) allreduce on {n} nodes ({ar.transport}): {ar.seconds * 1e3:.1f} ms ({ar.mb_per_s:.0f} MB/s of gradient), "
                f"CPU {ar.cpu_seconds * 1e3:.1f} ms per rank, and {ar.idle_cpu_per_second * 1e3:.1f} ms a second between allreduces; "
                f"latency {ar.latency_seconds * 1e3:.2f} ms; training's cycle {ar.cycle_seconds * 1e3:g} ms")
            self.save()
        for attempt in range(1, self.repeat + 1):
            for n in self.nodes:
                if n > len(self.left):
                    log(f"(c) {n} nodes, try {attempt}: skipped, {len(self.left)} left after losing {', '.join(self.lost)}")
                    continue
                if n > 1 and not self.predicted and 1 in self.nodes:
                    self._predict()
                trial = self.train(n, attempt)
                self.trials.append(trial)
                log(f"(c) {n} node{'s' if n > 1 else ''}, try {attempt}: "
                    + (f"{trial.images_per_sec:,.0f} img/s" if trial.images_per_sec else "no img/s") + self._reached(trial) + f"  ({trial.run})")
                self.save()
                if n > 1 and self.reference_mode is Reference.CONCURRENT:
                    alongside = self.train_concurrently(n, attempt)
                    self.trials.extend(alongside)
                    log(f"(r) {n} one-node runs at once, try {attempt}: "
                        + ", ".join(f"{host.name} " + (f"{t.images_per_sec:,.0f}" if t.images_per_sec else "no") + " img/s"
                                    for host, t in zip(self.left, alongside, strict=False)))  # the first n of them
                    self.save()
                if n > 1 and self.sync_candidates:
                    self.try_syncs(n, attempt)
        if self.sync_candidates:
            self.choose_sync()
        self.time_each_node()
        self.choose_batches()
        points = self.points()
        saved = self.save(points)
        if not any(t.status == runs.Status.COMPLETED.value for t in self.trials):
            raise EdgetrainError(f"bench {self.dir.name}: no run completed, so nothing was measured",
                                 f"each run's logs are in its directory under {self.root} (the bench's lines above name them)")
        try:
            self.plot = plots.save(plots.bench_figure([(f"{self.program.name} ({self.strategy.name})", saved)]), self.dir / "bench.svg")
        except EdgetrainError as exc:  # the measurements are saved: a missing plot costs none of them
            log(f"edgetrain: warning: no plot: {exc.problem} ({exc.fix})")
        return points

    def time_each_node(self) -> None:
        """(t): each node's own rate, for ``run --batch-by speed``: a short one-node run on each node
        in turn (a script as given), unless no node but the first was benched or concurrent
        one-node runs timed them all."""
        if self.nodes[-1] == 1 or self.reference_mode is Reference.CONCURRENT:
            return
        self.each_node = []
        for host in self.left[:self.nodes[-1]]:
            self.each_node.append(self.train(1, 1, on=host.name, timing=True))
            self.save()
        self.log("(t) each node alone: " + ", ".join(
            f"{t.host} " + (f"{t.images_per_sec:,.0f} img/s" if t.images_per_sec else "no img/s") + f" ({t.run})" for t in self.each_node))

    def choose_batches(self) -> None:
        """(t): whether batches by speed pay on the benched nodes, from the rates `run --batch-by speed`
        takes from this bench."""
        hosts = [h.name for h in self.left[:self.nodes[-1]]]
        if len(hosts) < 2:
            return
        rates = speeds.from_bench(self.save(), self.root).measured
        missing = [h for h in hosts if h not in rates]
        if missing:
            self.log(f"(t) no --batch-by chosen: no img/s of {', '.join(missing)} alone")
            return
        c = self.batch_choice = choose_batches([rates[h] for h in hosts])
        self.log(f"(t) on {c.nodes} nodes, chose --batch-by {c.batch_by.value}: {c.said()}")

    @property
    def left(self) -> list[inventory.Host]:
        """The hosts no restart has left out."""
        return [h for h in self.hosts if h.name not in self.lost]

    def _trials(self, n: int, beside: int = 0, sync: Sync | None = None) -> list[Trial]:
        """The tries at ``n`` nodes (one-node ones run beside ``beside`` others) that talked as the bench's options say, or as ``sync``."""
        sync = sync or self.sync
        return [t for t in self.trials if t.nodes == n and t.beside == beside and not t.lost
                and (t.sync_every, t.sync_mode) == (sync.sync_every, sync.sync_mode.value)]

    # -- (s): how often to talk ---------------------------------------------------------------------
    def predict_syncs(self, n: int) -> list[SyncCandidate]:
        """E(n) for every candidate K in both modes, from one node's measured step and (a) at n."""
        one = median([t.images_per_sec for t in self._trials(1)])
        ar = self.allreduce.get(n)
        if one is None or ar is None:
            return []
        step, cores = self.batch_size() / one, self.busy_cores()
        found = []
        # An outer step (--outer-lr, --outer-momentum) is the weights mode's: given one, only it is a candidate.
        modes = list(SyncMode) if self.sync.plain_average else [SyncMode.WEIGHTS]
        for k in sorted(set(self.sync_candidates or ())):
            for mode in modes:
                if k == 1 and mode is SyncMode.WEIGHTS:
                    continue  # averaging every step sends what an allreduce of gradients does, later
                e = predict(step, ar, Sync(k, mode), self.gradients, cores)
                found.append(SyncCandidate(k, mode.value, n, e.expected, (e.low, e.high)))
        return found

    def syncs_at(self, n: int) -> list[SyncCandidate]:
        """(s): every candidate predicted at ``n`` (once, said in a line), or none where one node was not measured."""
        if n not in self.sync_predicted:
            self.sync_predicted[n] = self.predict_syncs(n) if 1 in self.nodes else []
            if self.sync_predicted[n]:
                self.log(f"(s) E({n}) predicted for each --sync-every: " + ", ".join(
                    f"{c.sync_every} {c.sync_mode} {c.predicted:.0%} ({c.predicted_range[0]:.0%}-{c.predicted_range[1]:.0%})"
                    for c in self.sync_predicted[n]))
        return self.sync_predicted[n]

    def try_syncs(self, n: int, attempt: int) -> None:
        """(s): each mode's best-predicted candidate at ``n``, tried right after the N-loop's own try."""
        for c in best_per_mode(self.syncs_at(n)):
            if c.sync == self.sync:
                continue  # the N-loop's own try just measured it
            trial = self.train(n, attempt, sync=c.sync)
            self.trials.append(trial)
            self.log(f"(s) {n} nodes, --sync-every {c.sync_every} {c.sync_mode}, try {attempt}: "
                         + (f"{trial.images_per_sec:,.0f} img/s" if trial.images_per_sec else "no img/s") + self._reached(trial)
                         + f"  ({trial.run})")
            self.save()

    def choose_sync(self) -> None:
        """(s): the choice at the largest N the candidates were measured at, among each mode's best and the N-loop's own."""
        log = self.log
        n = max((m for m in self.sync_predicted if self.sync_predicted[m]), default=None)
        if n is None:
            log("(s) no --sync-every chosen: a choice needs 1 and a larger N in --nodes, measured")
            return
        self.candidates = [self._measured_if_tried(c, m) for m, at in sorted(self.sync_predicted.items()) for c in at]
        # What was tried at n: each mode's best, and the N-loop's own setting, which may be best.
        measured = [c for c in self.candidates if c.nodes == n and c.runs]
        picked = choose(measured)
        if picked is None:
            log(f"(s) no --sync-every chosen: no try at {n} nodes trained")
            return
        chosen, why = picked
        self.choice = SyncChoice(chosen.sync_every, SyncMode(chosen.sync_mode), n, why, chosen.images_per_sec, chosen.seconds_to_target)
        log(f"(s) chose --sync-every {chosen.sync_every} --sync-mode {chosen.sync_mode} on {n} nodes, by {why}: "
            + "; ".join(f"{m.sync_every} {m.sync_mode} " + (f"{m.images_per_sec:,.0f} img/s" if m.images_per_sec else "no img/s")
                        + (f", target at {m.seconds_to_target:.0f} s" if m.seconds_to_target is not None else "") for m in measured))

    def _measured_if_tried(self, c: SyncCandidate, n: int) -> SyncCandidate:
        return self._measured(c, n) if self._trials(n, sync=c.sync) else c

    def _measured(self, c: SyncCandidate, n: int) -> SyncCandidate:
        tries = self._trials(n, sync=c.sync)
        return replace(c, images_per_sec=median([t.images_per_sec for t in tries]),
                       seconds_to_target=median([t.seconds_to_target for t in tries]), runs=tuple(t.run for t in tries))

    def reference(self, n: int) -> float | None:
        """One node's img/s for E(N): alone, or the median of the one-node runs made beside n - 1 others."""
        if n > 1 and self.reference_mode is Reference.CONCURRENT:
            return median([t.images_per_sec for t in self._trials(1, beside=n - 1)])
        return median([t.images_per_sec for t in self._trials(1)])

    def busy_cores(self) -> float | None:
        """The CPU one node's training keeps busy, the one-node runs' median (None where the runs do
        not clock their CPU)."""
        return median([t.busy_cores for t in self._trials(1)])

    def _predict(self) -> None:
        one = median([t.images_per_sec for t in self._trials(1)])
        if one is None:
            return
        step = self.batch_size() / one
        cores = self.busy_cores()
        for n, ar in self.allreduce.items():
            self.predicted[n] = predict(step, ar, self.sync, self.gradients, cores)
        how = "when backprop produces each gradient" if self.gradients else "half of the allreduce hidden"
        cpu = (f"the communication's CPU taken from the training's {cores:.2f} cores" if cores
               else "the communication's CPU not counted (the one-node run did not clock its CPU)")
        self.log(f"(d) predicted from one node's {one:,.0f} img/s ({step * 1e3:.0f} ms a step), (a), {how} and {cpu}; "
                     "in brackets, nothing hidden and its CPU paid to all of it hidden and its CPU free: "
                     + ", ".join(f"E({n}) = {e.expected:.0%} ({e.low:.0%}-{e.high:.0%})" for n, e in sorted(self.predicted.items())))

    def batch_size(self) -> int:
        return int(self.program.checkpoint_options.get("batch_size", 64))

    def points(self) -> list[Point]:
        out = []
        for n in self.nodes:
            trials = self._trials(n)
            ips = median([t.images_per_sec for t in trials])
            one = self.reference(n)
            eff = ips / (n * one) if ips and one else None
            # The allreduce as measured alone (a), against a rank's measured step at N.
            ar = self.allreduce.get(n)
            step = n * self.batch_size() / ips if ips else None
            share = min(1.0, ar.per_update / self.sync.sync_every / step) if ar and step else None
            guess = self.predicted.get(n)
            out.append(Point(n, ips, eff, share, median([t.seconds_to_target for t in trials]),
                             guess.expected if guess else None, tuple(trials), (guess.low, guess.high) if guess else None,
                             median([t.images_per_cpu_second for t in trials]), one))
        return out

    def save(self, points: list[Point] | None = None) -> BenchRecord:
        bench = BenchRecord(
            program=self.program.name, args=self.program.args, strategy=self.strategy.name, command=self.config.command,
            inventory=record.where(self.config.inventory), hosts=tuple(h.name for h in self.hosts[:self.nodes[-1]]),
            repeat=self.repeat, reference=self.reference_mode.value, target_accuracy=self.target_accuracy, fp16=self.fp16,
            sync_every=self.sync.sync_every, sync_mode=self.sync.sync_mode, busy_cores=self.busy_cores(),
            allreduce=tuple(self.allreduce.values()),
            predicted_efficiency={n: e.expected for n, e in self.predicted.items()},
            predicted_range={n: (e.low, e.high) for n, e in self.predicted.items()},
            trials=tuple(self.trials), each_node=tuple(self.each_node) if self.each_node is not None else None,
            points=tuple(points) if points else None,
            sync_candidates=tuple(self.candidates), sync_choice=self.choice, batch_choice=self.batch_choice,
            seconds=round(time.monotonic() - self.started, 1))
        record.write(self.dir, bench)
        return bench
