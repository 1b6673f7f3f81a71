"""What bench predicts and chooses: pure functions of the numbers it measured (no I/O)."""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from edgetrain.controller import overlap
from edgetrain.shared.batches import BatchBy
from edgetrain.shared.sync import EVERY_STEP, Sync, SyncMode

# (t): batches by speed are chosen where they are predicted to train at least this much faster than
# equal ones. The prediction is an upper bound: the allreduce, which both pay alike, is left out of
# it, so the real gain is smaller (by a third where E(N) is about 2/3, as on Pi 4s at 1 Gbit/s); and
# each rate is one short run per node, under whatever else the node did then. A 10% prediction
# clears both; two boards of one model, a few percent apart, stay on equal batches.
BY_SPEED_PAYS = 0.10


@dataclass(frozen=True)
class Allreduce:
    nodes: int
    bytes: int
    seconds: float  # the slowest rank's wall time per allreduce
    cpu_seconds: float  # the busiest rank's CPU time per allreduce (every thread: polling included)
    latency_seconds: float
    run: str
    transport: str = "mpi"  # whose collectives Horovod used: gloo or mpi
    cycle_seconds: float = 0.001  # the launch's Horovod cycle (the probe times its own short one)
    idle_cpu_per_second: float = 0.0  # the busiest rank's CPU per second between allreduces, at that cycle

    @property
    def mb_per_s(self) -> float:
        return self.bytes / self.seconds / 1e6

    @property
    def per_update(self) -> float:
        """What one gradient allreduce adds to a training step: the transfer, and on average half
        a cycle's wait for Horovod's next turn (a step's gradients arrive at no particular point of it)."""
        return self.seconds + self.cycle_seconds / 2

    def cpu_per_update(self, update_seconds: float) -> float:
        """A rank's communication CPU over an update of that length: the allreduce's, and its
        threads' between allreduces (Horovod's cycle turns while the training computes)."""
        return self.cpu_seconds + self.idle_cpu_per_second * update_seconds

@dataclass(frozen=True)
class SyncCandidate:
    """One --sync-every setting at one N: predicted, and measured where it was among the best."""

    sync_every: int
    sync_mode: str
    nodes: int
    predicted: float
    predicted_range: tuple[float, float]
    images_per_sec: float | None = None  # the tries' median, where measured
    seconds_to_target: float | None = None
    runs: tuple[str, ...] = ()

    @property
    def sync(self) -> Sync:
        return Sync(self.sync_every, SyncMode(self.sync_mode))


def choose(measured: list[SyncCandidate]) -> tuple[SyncCandidate, str] | None:
    """The candidate that reached the target soonest (median of its tries), or where none reached
    it the one that trained the most img/s; and what decided it."""
    timed = [c for c in measured if c.seconds_to_target is not None]
    if timed:
        return min(timed, key=lambda c: (c.seconds_to_target, c.sync_every)), "time to the target"
    rated = [c for c in measured if c.images_per_sec is not None]
    if rated:
        return max(rated, key=lambda c: (c.images_per_sec, -c.sync_every)), "img/s (no try reached the target)"
    return None


def best_per_mode(candidates: list[SyncCandidate], per_mode: int = 1) -> list[SyncCandidate]:
    """The best-predicted candidates of each mode (fewer syncs break ties): the model predicts
    throughput, not how many images a mode needs, so each mode's best is measured."""
    out: list[SyncCandidate] = []
    for mode in SyncMode:
        ranked = sorted((c for c in candidates if c.sync_mode == mode.value), key=lambda c: (-c.predicted, c.sync_every))
        out += ranked[:per_mode]
    return out

@dataclass(frozen=True)
class BatchChoice:
    """(t): the batches a bench chose for its nodes, and the img/s predicted for each way."""

    batch_by: BatchBy  # speed or equal
    nodes: int
    by_speed: float  # predicted img/s, compute only
    equal: float

    @property
    def gain(self) -> float:
        return self.by_speed / self.equal - 1

    def said(self) -> str:
        return f"predicted {self.by_speed:,.0f} img/s by speed against {self.equal:,.0f} equal ({self.gain:+.0%})"


def choose_batches(rates: Sequence[float]) -> BatchChoice:
    """From each node's img/s alone (all positive): with equal batches every step waits for the
    slowest node, so N nodes train N x its rate; by speed each node's batch takes it as long as any
    other's, so they train the rates' sum. Speed where that gains at least BY_SPEED_PAYS."""
    predicted = BatchChoice(BatchBy.EQUAL, len(rates), sum(rates), len(rates) * min(rates))
    return replace(predicted, batch_by=BatchBy.SPEED) if predicted.gain >= BY_SPEED_PAYS else predicted


@dataclass(frozen=True)
class Prediction:
    """E(N) between two bounds, and the estimate set beside the measurement. Horovod starts a
    gradient's allreduce as soon as backprop has produced it, while earlier layers' backprop still
    runs; how much that hides depends on the order the model produces its bytes in (LeNet's Dense
    kernel first), which one node's step time does not tell, but its layers do."""

    low: float  # nothing hidden: compute, the allreduce, half a cycle's wait, and the communication's CPU
    high: float  # the allreduce hidden behind the step's compute, up to its length, its CPU free
    expected: float  # from when backprop produces each gradient (half hidden without a model), its CPU paid


def predict(step_seconds: float, ar: Allreduce, sync: Sync = EVERY_STEP,
            gradients: list[overlap.Gradient] | None = None, cores: float | None = None) -> Prediction:
    """E(N) from one node's step and one allreduce measured on these nodes (so a slow node's CPU cost
    of communicating is in it), shared over the ``sync.sync_every`` steps between syncs; accumulating
    gradients, only the last of them hides any of it; syncing weights, none does (the models are
    averaged between steps).

    ``cores``: the CPU one node's training keeps busy (``busy_cores_of``). Where the
    training fills the node's CPU - a Pi's four cores, an emulated Pi's quota - every CPU second
    the communication spends is a CPU second the training waits for, hidden allreduce or not: the
    communication's CPU over ``cores`` is added to the update. None (a run that does not clock its
    CPU): the communication is taken to run on CPU the training leaves idle."""
    update = step_seconds * sync.sync_every
    paid = ar.cpu_per_update(update) / cores if cores else 0.0
    low = update / (update + ar.per_update + paid)
    if sync.sync_mode is SyncMode.WEIGHTS:
        return Prediction(low, update / (update + ar.per_update), low)
    hidden = min(ar.seconds, update)
    high = update / (update + ar.per_update - hidden)
    late = overlap.exposed(step_seconds, gradients, ar.seconds, ar.cycle_seconds) if gradients else ar.per_update - hidden / 2
    return Prediction(low, high, update / (update + late + paid))


def evaluation_interval(steps: int, steps_per_execution: int, per_epoch: int = 4) -> int:
    """The ``--eval-every`` that evaluates an epoch of ``steps`` steps ``per_epoch`` times, the last
    being the epoch's own validation: a multiple of the steps per execution (evaluations fall between
    executions), rounded up so that none lands just before the epoch's end."""
    return math.ceil(steps / per_epoch / steps_per_execution) * steps_per_execution


def median(values: list[float | None]) -> float | None:
    found = [v for v in values if v is not None]
    return statistics.median(found) if found else None
