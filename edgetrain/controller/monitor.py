"""The monitor of one training attempt: the one consumer of its observers' events
(edgetrain.controller.observers), on the launching thread, and the one owner of what the attempt
is judged by - its verdict, the nodes it went on without, what mpirun's stream said.

An attempt's watch moves through ``Watch``: WATCHING until a verdict, then FAILING (a node or rank
lost for good, a hang, a rank that never started) or TAKING_BACK (a left-out node answers: the
attempt is ended to resume with it); the first verdict stands. Its status follows from the watch
and mpirun's exit code (``status``).
"""

from __future__ import annotations

import queue
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, replace
from enum import Enum
from typing import TYPE_CHECKING, Any, NamedTuple

from edgetrain.controller import blame, inventory, remote
from edgetrain.controller.observers import Back, Event, Looked, Output, RankEvent, Reader, StreamEnded, Watcher
from edgetrain.shared import failures
from edgetrain.shared.errors import EdgetrainError
from edgetrain.shared.runs import Status

if TYPE_CHECKING:
    import subprocess

    from edgetrain.controller.launch import Launch

OUTPUT_LINES = 5000  # of mpirun's output kept in memory (a run may print without end)
FAILED_GRACE = 30.0  # after rank 0 reported its failure, the other ranks (its MPI_Abort) have this long to end
POLL = 0.5  # seconds between checks for Ctrl-C while the queue is empty


class Watch(Enum):
    WATCHING = "watching"
    FAILING = "failing"
    TAKING_BACK = "taking back"


class Verdict(NamedTuple):
    """Why the attempt cannot finish: the node that went (None: no one node), and how."""

    host: inventory.Host | None
    why: str


@dataclass
class Observers:
    """The attempt's reader and watcher, and the queue they post on."""

    events: queue.Queue[Event]
    reader: Reader
    watcher: Watcher

    @classmethod
    def start(cls, launch: Launch, proc: subprocess.Popen[str]) -> Observers:
        events: queue.Queue[Event] = queue.Queue()
        assert proc.stdout is not None
        found = cls(events, Reader(proc.stdout, launch.events_token, events.put),
                    Watcher(launch.runtime, launch.run.id, events.put))
        found.reader.start()
        found.watcher.start()
        return found

    def stop(self) -> None:
        """After mpirun is gone: the watcher's look under way, and the rest of the stream, awaited."""
        self.watcher.end()
        self.watcher.join(timeout=remote.SSH_TIMEOUT + remote.CONFIRM_TIMEOUT)
        self.reader.join(timeout=10)


class Monitor:
    def __init__(self, launch: Launch, on_event: Callable[[dict[str, Any]], None], on_output: Callable[[str], None]) -> None:
        self.launch, self.on_event, self.on_output = launch, on_event, on_output
        self.watch = Watch.WATCHING
        self.verdict: Verdict | None = None
        self.back: inventory.Host | None = None
        self.last_output = time.monotonic()
        self.rank_failed: float | None = None  # when rank 0 reported its failure
        self.went_on_without: dict[str, str] = {}  # nodes lost that the run carries on without -> how
        self.near_misses: dict[str, int] = {}  # per node: its shared connection failed, a new one answered
        # --rejoin: the epoch rank 0 trains (its step events), the first this attempt trained, and
        # the epoch at whose start the left-out nodes were last looked for.
        self.epoch, self.looked_at = 0, 0
        self.first_epoch: int | None = None
        self.looks = 0
        self.look_failures: set[str] = set()
        self.stream_open = True
        # What mpirun's stream said: the last epoch's event, the last lines that were not events
        # (what a failure is judged by: Hydra's words come last), seconds from the launch to the
        # first step, every rank past the final barrier, failures rank 0 reported, ranks whose
        # worker started, and why this machine could not record the run (a full disk).
        self.last: dict[str, Any] = {}
        self.output: deque[str] = deque(maxlen=OUTPUT_LINES)
        self.first_step: float | None = None
        self.finished = False
        self.reported: list[failures.Failure] = []
        self.started: set[int] = set()
        self.record_error: EdgetrainError | None = None
        self.watcher: Watcher | None = None

    # -- the loop ---------------------------------------------------------------------------------

    def follow(self, observers: Observers) -> None:
        """Every event until mpirun's stream ends."""
        self.watcher = observers.watcher
        while self.stream_open:
            self._next(observers.events, POLL)

    def settle(self, code: int, observers: Observers) -> None:
        """mpirun ended with ``code``: was a node lost? Hydra often ends first (its ssh connection
        to the node closes), before Docker has recorded a container's end or while the watcher's
        look at a node out of reach still waits on ssh (a head cut off took 33 s to be named when
        this asked again itself, 25 s being the watcher's own time). So the watcher's verdict is
        awaited: two more of its looks, back to back (the one under way may have begun before mpirun
        ended), or a verdict. Then a run that exited 0 with ranks that never started fails."""
        if self.finished and code != 0:
            # The ranks passed the final barrier, yet something ended with an error after it: a run
            # is only as good as its exit, so it fails, and says what it did get done.
            self.on_output(f"every rank finished its program, but mpirun exited with {code}: the run is recorded as failed")
        if code != 0 and self.watch is Watch.WATCHING and self.launch.runtime.has_nodes:
            wanted = self.looks + 2
            deadline = time.monotonic() + remote.SSH_TIMEOUT + remote.CONFIRM_TIMEOUT + 2 * observers.watcher.interval
            observers.watcher.hurry()
            while self.watch is Watch.WATCHING and self.looks < wanted and observers.watcher.is_alive():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                seen = self.looks
                self._next(observers.events, min(left, POLL))
                if self.looks > seen and self.watch is Watch.WATCHING:
                    observers.watcher.hurry()  # the next look at once; none after a verdict (Watcher)
        if code == 0 and self.watch is Watch.WATCHING:
            unstarted = self.unstarted()
            if unstarted is not None:
                self._fail(None, unstarted)

    def status(self, code: int) -> Status:
        return Status.COMPLETED if code == 0 and self.watch is Watch.WATCHING and self.record_error is None else Status.FAILED

    def _next(self, events: queue.Queue[Event], timeout: float) -> None:
        try:
            self.handle(events.get(timeout=timeout))
        except queue.Empty:
            pass
        # Judged on the clock, not on the watcher's looks: a watcher stuck in a look (a Slurm
        # controller that does not answer) must not stop the hang checks.
        self._timed(time.monotonic())

    def handle(self, event: Event) -> None:
        if isinstance(event, Output):
            self._output(event)
        elif isinstance(event, RankEvent):
            self.last_output = event.at
            self._rank_event(event.event)
            self.on_event(event.event)
        elif isinstance(event, Looked):
            self.looks += 1
            if event.failed and event.failed not in self.look_failures:
                self.look_failures.add(event.failed)  # said once each: the next look is tried all the same
                self.launch.config.log(f"edgetrain: warning: a look at the nodes failed ({event.failed}); watching goes on")
            if self.watch is Watch.WATCHING:
                self._looked(event)
        elif isinstance(event, Back):
            if self.watch is Watch.WATCHING:
                self.watch, self.back = Watch.TAKING_BACK, event.host
                self._end_watch()
        elif isinstance(event, StreamEnded):
            self.stream_open = False

    # -- mpirun's stream --------------------------------------------------------------------------

    def _output(self, event: Output) -> None:
        if not event.stall:
            self.last_output = event.at
        self.output.append(event.text)
        self.on_output(event.text)

    def _rank_event(self, event: dict[str, Any]) -> None:
        kind = event["event"]
        if kind == "step":
            self._stepped(event["epoch"])
        if kind in ("step", "keras") and self.first_step is None:
            self.first_step = time.monotonic() - self.launch.started
        elif kind == "epoch":
            self.last = event
        elif kind == "finished":
            self.finished = True
        elif kind == "rank":
            self.started.add(event["rank"])
        elif kind == "lost" and event["host"] in self.launch.losable:
            self.go_on_without(event["host"], event["why"])
        elif kind == "failed":
            self.reported.append(failures.from_event(event))
            self.rank_failed = self.rank_failed or time.monotonic()
        elif kind == "start" and self.record_error is None:
            self._record_start(event)

    def _stepped(self, epoch: int) -> None:
        """Once an epoch begins after one this attempt trained (and checkpointed), the left-out
        nodes are looked for (--rejoin): one that answers is taken back at that checkpoint."""
        self.epoch = epoch
        first_epoch = self.first_epoch = epoch if self.first_epoch is None else self.first_epoch
        config, excluded = self.launch.config, self.launch.attempt.excluded
        if not (config.restarts.rejoin and excluded) or self.epoch <= max(self.looked_at, first_epoch):
            return
        self.looked_at = self.epoch
        if self.watcher is not None:
            self.watcher.look_for(h for h in inventory.load(config.inventory).hosts if h.name in excluded)

    def _record_start(self, event: dict[str, Any]) -> None:
        run = self.launch.run
        try:
            # The program adds the versions it found; what edgetrain recorded of itself and the runtime stands.
            before = run.record()
            where = before.placement
            if event.get("batches") and where is not None:
                where = replace(where, batches=event["batches"])  # each rank's batch, as the program sized it
            run.update(versions={**event.get("versions", {}), **before.versions}, placement=where)
        except EdgetrainError as exc:
            # This machine's disk is full: a run it cannot record is ended now, cleanly.
            self.record_error = exc
            self.launch.runtime.stop()

    # -- the nodes --------------------------------------------------------------------------------

    def _timed(self, now: float) -> None:
        if self.watch is not Watch.WATCHING:
            return
        if now - self.last_output > self.launch.config.hang_timeout:
            self._fail(None, f"hang: no output from any rank for {self.launch.config.hang_timeout:.0f} s (--hang-timeout)")
        elif self.rank_failed is not None and now - self.rank_failed > FAILED_GRACE:
            self._fail(None, f"rank 0 failed and the other ranks had not ended {FAILED_GRACE:.0f} s later")

    def _looked(self, event: Looked) -> None:
        self._timed(event.at)
        if self.watch is not Watch.WATCHING:
            return
        states = event.states or ()
        for st in states:
            if st.alive and st.detail:
                # A near miss: a link this slow is one hiccup from ending the run. Each is
                # said, with how many there were: one is a hiccup, many a failing cable.
                self.near_misses[st.host.name] = self.near_misses.get(st.host.name, 0) + 1
                self.launch.config.log(f"edgetrain: warning: {st.host.name}: {st.detail} "
                                       f"({self.near_misses[st.host.name]} time(s) this attempt)")
        losable = self.launch.losable
        for st in states:
            if not st.alive and st.host.name in losable:
                self.go_on_without(st.host.name, st.detail)
        # A node Slurm took from the run's job is a lost node: the run goes on without it where it
        # can, else the attempt ends (and --max-restarts leaves it out).
        for host in (h for h in self.launch.placement.hosts if h.name in event.taken):
            if host.name in losable:
                self.go_on_without(host.name, event.taken[host.name])
            else:
                self._fail(host, event.taken[host.name])
        dead = next((st for st in states if not st.alive and st.host.name not in losable), None)
        if dead is not None:
            self._fail(dead.host, dead.detail)

    def go_on_without(self, name: str, why: str) -> None:
        """A node the run can lose was lost: said once, no longer watched, recorded with the attempt."""
        if name in self.went_on_without or self.watch is not Watch.WATCHING:
            return
        self.went_on_without[name] = why
        launch = self.launch
        launch.runtime.lose(next(h for h in launch.placement.hosts if h.name == name))
        launch.config.log(f"edgetrain: {name}: {why}; the run goes on without its {launch.losable[name]}")
        if all(r in self.gone_ranks() for r in range(launch.placement.np) if launch.config.expendable(r)):
            # The coordinator would wait for one to come back (TensorFlow: up to an hour).
            self._fail(None, f"every rank the run could go on without was lost ({', '.join(self.went_on_without)}), "
                             "and it cannot go on with none")

    def gone_ranks(self) -> set[int]:
        plan = self.launch.placement
        return {r for h in plan.hosts if h.name in self.went_on_without for r in plan.ranks_on(h)}

    def _fail(self, host: inventory.Host | None, why: str) -> None:
        if self.watch is not Watch.WATCHING:
            return
        self.watch, self.verdict = Watch.FAILING, Verdict(host, why)
        if host is not None:
            # Said at once: ending the attempt (and any restart) takes a while.
            self.launch.config.log(f"edgetrain: {host.name}: {why}; ending this attempt")
        self._end_watch()

    def _end_watch(self) -> None:
        if self.watcher is not None:
            self.watcher.end()
        self.launch.runtime.stop()

    # -- the end ----------------------------------------------------------------------------------

    def unstarted(self) -> str | None:
        """What is wrong with a run some of whose ranks never started edgetrain's worker (mpirun ran
        something else in its place, exit status and all), apart from those on nodes it went on
        without; None where every rank started."""
        np = self.launch.placement.np
        missing = sorted(set(range(np)) - self.gone_ranks() - self.started)
        if not missing:
            return None
        which = "no rank" if len(missing) == np else f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} never"
        return (f"mpirun exited with 0, but {which} {blame.NOT_THE_WORKER}: mpirun ran something else in its place "
                "(look at the inventory's edgetrain_mpi_env, and at the output above)")

    @property
    def lost(self) -> Verdict | None:
        """The node whose loss ended the attempt, if that is what ended it."""
        return self.verdict if self.verdict is not None and self.verdict.host is not None else None
