"""The monitor of one training attempt: a pure reducer, ``step(state, event) -> (state, actions)``.

It alone judges the attempt - its verdict, the nodes it went on without, what mpirun's stream
said - from the events its observers post (edgetrain.controller.observers) and the clock readings
and ends that launch adds (``Clock``, ``Exited``, ``RecordFailed``, ``Closed``), and does nothing
itself: no thread, no I/O, no clock of its own. What is to be done (stop the runtime, lose a node,
look for a left-out node, record the program's start, say a line) comes back as actions, which
launch carries out in order. So each verdict is a unit test over a list of events.

An attempt's watch moves through ``Watch``: WATCHING until a verdict, then FAILING (a node or rank
lost for good, a hang, a rank that never started) or TAKING_BACK (a left-out node answers: the
attempt is ended to resume with it); the first verdict stands. Its status follows from the watch
and mpirun's exit code (``status``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any, NamedTuple

from edgetrain.controller import blame, inventory
from edgetrain.controller.observers import Back, Looked, Output, RankEvent, StreamEnded
from edgetrain.shared import failures
from edgetrain.shared.runs import Status

FAILED_GRACE = 30.0  # after rank 0 reported its failure, the other ranks (its MPI_Abort) have this long to end


class Watch(Enum):
    WATCHING = "watching"
    FAILING = "failing"
    TAKING_BACK = "taking back"


class Verdict(NamedTuple):
    """Why the attempt cannot finish: the node that went (None: no one node), and how."""

    host: inventory.Host | None
    why: str


# -- what launch adds to the observers' events ----------------------------------------------------

@dataclass(frozen=True)
class Clock:
    """A reading of the clock (time.monotonic): the hang and the failed rank's grace are judged on it,
    not on the watcher's looks, so a watcher stuck in a look cannot stop them."""

    at: float


@dataclass(frozen=True)
class Exited:
    """mpirun ended with ``code`` at ``at``."""

    code: int
    at: float


@dataclass(frozen=True)
class RecordFailed:
    """The program's start could not be recorded (this machine's disk is full)."""


@dataclass(frozen=True)
class Closed:
    """The attempt is over (settled, or Ctrl-C): from now on only the nodes' reach is followed."""


Event = Output | RankEvent | StreamEnded | Looked | Back | Clock | Exited | RecordFailed | Closed


# -- the actions, carried out by launch ------------------------------------------------------------

@dataclass(frozen=True)
class Say:
    """A line of edgetrain's own (the launch config's log)."""

    line: str


@dataclass(frozen=True)
class Show:
    """Text for the console; ``stream``: mpirun's own, kept in the tail a failure is judged by."""

    text: str
    stream: bool = True


@dataclass(frozen=True)
class Progress:
    """One of rank 0's events, for the progress display."""

    event: dict[str, Any]


@dataclass(frozen=True)
class Lose:
    """The run goes on without ``host``: the runtime no longer watches it."""

    host: inventory.Host


@dataclass(frozen=True)
class LookFor:
    """--rejoin: on the watcher's next look, whether any of these left-out nodes is back."""

    names: tuple[str, ...]


@dataclass(frozen=True)
class Stop:
    """End every rank (runtime.stop), the watcher first where ``end_watch``: no look after a verdict."""

    end_watch: bool = True


@dataclass(frozen=True)
class Hurry:
    """The watcher's next look, at once."""


@dataclass(frozen=True)
class OutOfReach:
    """The nodes the latest looks found out of reach: the runtime's stop and cleanup do not wait on them."""

    names: frozenset[str]


@dataclass(frozen=True)
class RecordStart:
    """Rank 0's program started: the versions it found and each rank's batch, for run.json."""

    versions: Mapping[str, str]
    batches: list[int] | None


Action = Say | Show | Progress | Lose | LookFor | Stop | Hurry | OutOfReach | RecordStart


# -- the state --------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Facts:
    """What the attempt is, for as long as it lasts (from launch.Launch)."""

    hosts: tuple[inventory.Host, ...]  # the placement's
    np: int
    ranks: Mapping[str, tuple[int, ...]]  # each host's ranks
    losable: Mapping[str, str]  # hosts the run goes on without -> what it loses there
    expendable: frozenset[int]  # ranks it can go on without
    hang_timeout: float
    started: float  # when the launch began (the clock's time)
    look_for: tuple[str, ...] = ()  # --rejoin: the left-out nodes to look for once an epoch is trained
    has_nodes: bool = False  # a runtime whose nodes are watched
    settle_s: float = 0.0  # how long a failed mpirun's end awaits the watcher's verdict


@dataclass(frozen=True)
class Said:
    """What mpirun's stream said: whether it is still open, the last epoch's event, seconds from the
    launch to the first step, every rank past the final barrier, the failures rank 0 reported, and
    the ranks whose worker started."""

    open: bool = True
    last: Mapping[str, Any] = field(default_factory=dict)
    first_step: float | None = None
    finished: bool = False
    reported: tuple[failures.Failure, ...] = ()
    started: frozenset[int] = frozenset()


@dataclass(frozen=True)
class State:
    facts: Facts
    last_output: float  # when the ranks were last heard from
    watch: Watch = Watch.WATCHING
    verdict: Verdict | None = None
    back: inventory.Host | None = None  # a left-out node that answered again
    said: Said = field(default_factory=Said)
    rank_failed: float | None = None  # when rank 0 reported its failure
    went_on_without: Mapping[str, str] = field(default_factory=dict)  # nodes lost that the run carries on without -> how
    near_misses: Mapping[str, int] = field(default_factory=dict)  # per node: its shared connection failed, a new one answered
    unreachable: frozenset[str] = frozenset()  # the nodes the latest looks found out of reach
    looks: int = 0
    look_failures: frozenset[str] = frozenset()  # what went wrong with looks, each said once
    # --rejoin: the first epoch this attempt trained (rank 0's step events), and the epoch at whose
    # start the left-out nodes were last looked for.
    first_epoch: int | None = None
    looked_at: int = 0
    record_failed: bool = False  # this machine could not record the program's start
    settle: tuple[int, float] | None = None  # mpirun failed: the watcher's looks awaited, and until when
    closed: bool = False

    @property
    def lost(self) -> Verdict | None:
        """The node whose loss ended the attempt, if that is what ended it."""
        return self.verdict if self.verdict is not None and self.verdict.host is not None else None

    def awaiting(self, now: float) -> bool:
        """Whether a failed mpirun's end still awaits the watcher's verdict (``settle``)."""
        return self.settle is not None and self.watch is Watch.WATCHING and self.looks < self.settle[0] and now < self.settle[1]

    def gone_ranks(self) -> set[int]:
        return {r for name in self.went_on_without for r in self.facts.ranks.get(name, ())}


def status(state: State, code: int) -> Status:
    return Status.COMPLETED if code == 0 and state.watch is Watch.WATCHING and not state.record_failed else Status.FAILED


def unstarted(state: State) -> str | None:
    """What is wrong with a run some of whose ranks never started edgetrain's worker (mpirun ran
    something else in its place, exit status and all), apart from those on nodes it went on
    without; None where every rank started."""
    np = state.facts.np
    missing = sorted(set(range(np)) - state.gone_ranks() - state.said.started)
    if not missing:
        return None
    which = "no rank" if len(missing) == np else f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} never"
    return (f"mpirun exited with 0, but {which} {blame.NOT_THE_WORKER}: mpirun ran something else in its place "
            "(look at the inventory's edgetrain_mpi_env, and at the output above)")


# -- the reducer ------------------------------------------------------------------------------------

class _Step:
    """One step under way: the state so far and the actions so far (kept by ``step`` alone)."""

    def __init__(self, state: State) -> None:
        self.state = state
        self.actions: list[Action] = []

    def set(self, **changes: Any) -> None:
        self.state = replace(self.state, **changes)

    def said(self, **changes: Any) -> None:
        self.state = replace(self.state, said=replace(self.state.said, **changes))

    def do(self, *actions: Action) -> None:
        self.actions.extend(actions)

    @property
    def watching(self) -> bool:
        return self.state.watch is Watch.WATCHING


def step(state: State, event: Event) -> tuple[State, tuple[Action, ...]]:
    """The state after ``event``, and what is to be done, in order."""
    now = _Step(state)
    if isinstance(event, Looked):
        _reach(now, event)
    if state.closed:
        return now.state, tuple(now.actions)
    if isinstance(event, Output):
        if not event.stall:
            now.set(last_output=event.at)
        now.do(Show(event.text))
    elif isinstance(event, RankEvent):
        now.set(last_output=event.at)
        _rank_event(now, event.event, event.at)
        now.do(Progress(event.event))
    elif isinstance(event, Looked):
        _looked(now, event)
    elif isinstance(event, Back):
        if now.watching:
            now.set(watch=Watch.TAKING_BACK, back=event.host)
            now.do(Stop())
    elif isinstance(event, StreamEnded):
        now.said(open=False)
    elif isinstance(event, Clock):
        _timed(now, event.at)
    elif isinstance(event, Exited):
        _exited(now, event)
    elif isinstance(event, RecordFailed):
        # This machine's disk is full: a run it cannot record is ended now, cleanly.
        now.set(record_failed=True)
        now.do(Stop(end_watch=False))
    elif isinstance(event, Closed):
        now.set(closed=True)
    return now.state, tuple(now.actions)


def _reach(now: _Step, event: Looked) -> None:
    """Which nodes are out of reach, as the latest look at each found it (a failed look says nothing)."""
    if event.states is None:
        return
    seen = {st.host.name for st in event.states}
    found = (now.state.unreachable - seen) | {st.host.name for st in event.states if st.out_of_reach}
    if found != now.state.unreachable:
        now.set(unreachable=found)
        now.do(OutOfReach(found))


# -- mpirun's stream --------------------------------------------------------------------------------

def _rank_event(now: _Step, event: dict[str, Any], at: float) -> None:
    kind, said = event["event"], now.state.said
    if kind == "step":
        _stepped(now, event["epoch"])
    if kind in ("step", "keras") and said.first_step is None:
        now.said(first_step=at - now.state.facts.started)
    elif kind == "epoch":
        now.said(last=event)
    elif kind == "finished":
        now.said(finished=True)
    elif kind == "rank":
        now.said(started=said.started | {event["rank"]})
    elif kind == "lost" and event["host"] in now.state.facts.losable:
        _go_on_without(now, event["host"], event["why"])
    elif kind == "failed":
        now.said(reported=(*said.reported, failures.from_event(event)))
        now.set(rank_failed=now.state.rank_failed if now.state.rank_failed is not None else at)
    elif kind == "start" and not now.state.record_failed:
        now.do(RecordStart(event.get("versions", {}), event.get("batches") or None))


def _stepped(now: _Step, epoch: int) -> None:
    """Once an epoch begins after one this attempt trained (and checkpointed), the left-out
    nodes are looked for (--rejoin): one that answers is taken back at that checkpoint."""
    first = epoch if now.state.first_epoch is None else now.state.first_epoch
    now.set(first_epoch=first)
    look_for = now.state.facts.look_for
    if look_for and epoch > max(now.state.looked_at, first):
        now.set(looked_at=epoch)
        now.do(LookFor(look_for))


def _exited(now: _Step, event: Exited) -> None:
    """mpirun ended: was a node lost? Hydra often ends first (its ssh connection to the node
    closes), before Docker has recorded a container's end or while the watcher's look at a node
    out of reach still waits on ssh (a head cut off took 33 s to be named when this asked again
    itself, 25 s being the watcher's own time). So a failed end awaits the watcher's verdict: two
    more of its looks, back to back (the one under way may have begun before mpirun ended), or a
    verdict (``State.awaiting``). A run that exited 0 with ranks that never started fails."""
    if now.state.said.finished and event.code != 0:
        # The ranks passed the final barrier, yet something ended with an error after it: a run
        # is only as good as its exit, so it fails, and says what it did get done.
        now.do(Show(f"every rank finished its program, but mpirun exited with {event.code}: the run is recorded as failed",
                    stream=False))
    if event.code != 0 and now.watching and now.state.facts.has_nodes:
        now.set(settle=(now.state.looks + 2, event.at + now.state.facts.settle_s))
        now.do(Hurry())
    if event.code == 0 and now.watching:
        why = unstarted(now.state)
        if why is not None:
            _fail(now, None, why)


# -- the nodes --------------------------------------------------------------------------------------

def _timed(now: _Step, at: float) -> None:
    state = now.state
    if not now.watching:
        return
    if at - state.last_output > state.facts.hang_timeout:
        _fail(now, None, f"hang: no output from any rank for {state.facts.hang_timeout:.0f} s (--hang-timeout)")
    elif state.rank_failed is not None and at - state.rank_failed > FAILED_GRACE:
        _fail(now, None, f"rank 0 failed and the other ranks had not ended {FAILED_GRACE:.0f} s later")


def _looked(now: _Step, event: Looked) -> None:
    now.set(looks=now.state.looks + 1)
    if event.failed and event.failed not in now.state.look_failures:
        now.set(look_failures=now.state.look_failures | {event.failed})  # said once each: the next look is tried all the same
        now.do(Say(f"edgetrain: warning: a look at the nodes failed ({event.failed}); watching goes on"))
    if now.watching:
        _judged(now, event)
    if now.state.settle is not None and now.watching:
        now.do(Hurry())  # a failed mpirun's end awaits the next look at once; none after a verdict (Watcher)


def _judged(now: _Step, event: Looked) -> None:
    _timed(now, event.at)
    if not now.watching:
        return
    states, losable = event.states or (), now.state.facts.losable
    for st in states:
        if st.alive and st.detail:
            # A near miss: a link this slow is one hiccup from ending the run. Each is
            # said, with how many there were: one is a hiccup, many a failing cable.
            count = now.state.near_misses.get(st.host.name, 0) + 1
            now.set(near_misses={**now.state.near_misses, st.host.name: count})
            now.do(Say(f"edgetrain: warning: {st.host.name}: {st.detail} ({count} time(s) this attempt)"))
    for st in states:
        if not st.alive and st.host.name in losable:
            _go_on_without(now, st.host.name, st.detail)
    # A node Slurm took from the run's job is a lost node: the run goes on without it where it
    # can, else the attempt ends (and --max-restarts leaves it out).
    for host in (h for h in now.state.facts.hosts if h.name in event.taken):
        if host.name in losable:
            _go_on_without(now, host.name, event.taken[host.name])
        else:
            _fail(now, host, event.taken[host.name])
    dead = next((st for st in states if not st.alive and st.host.name not in losable), None)
    if dead is not None:
        _fail(now, dead.host, dead.detail)


def _go_on_without(now: _Step, name: str, why: str) -> None:
    """A node the run can lose was lost: said once, no longer watched, recorded with the attempt."""
    facts = now.state.facts
    if name in now.state.went_on_without or not now.watching:
        return
    now.set(went_on_without={**now.state.went_on_without, name: why})
    now.do(Lose(next(h for h in facts.hosts if h.name == name)),
           Say(f"edgetrain: {name}: {why}; the run goes on without its {facts.losable[name]}"))
    if facts.expendable <= now.state.gone_ranks():
        # The coordinator would wait for one to come back (TensorFlow: up to an hour).
        _fail(now, None, f"every rank the run could go on without was lost ({', '.join(now.state.went_on_without)}), "
                         "and it cannot go on with none")


def _fail(now: _Step, host: inventory.Host | None, why: str) -> None:
    if not now.watching:
        return
    now.set(watch=Watch.FAILING, verdict=Verdict(host, why))
    if host is not None:
        # Said at once: ending the attempt (and any restart) takes a while.
        now.do(Say(f"edgetrain: {host.name}: {why}; ending this attempt"))
    now.do(Stop())
