"""The two observers of a training attempt, each on a thread of its own, and the typed events
they post on one queue for the attempt's monitor (edgetrain.controller.monitor), which alone
judges them.

The reader turns mpirun's stream into its text and rank 0's events; the watcher looks at the
nodes every few seconds and, when the monitor asks, for left-out nodes that answer again. Neither
keeps, changes or writes anything the attempt is judged by.
"""

from __future__ import annotations

import queue
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import IO, Any

from edgetrain.controller import allocation, containers, inventory, remote, runtimes, scheduler
from edgetrain.shared import progress
from edgetrain.shared.errors import EdgetrainError

# Horovod's warning while some ranks wait in a collective that others have not reached.
HOROVOD_STALL = "submitted to be reduced, gathered or broadcasted by subset of ranks"
LINE_CHARS = 64 * 1024  # the longest piece of one line read at once


@dataclass(frozen=True)
class Output:
    """A piece of mpirun's stream that is not an event (``at``: when its line was read). A stall
    warning is not a sign of life: Horovod repeats it every minute while ranks wait for each other."""

    text: str
    at: float
    stall: bool = False


@dataclass(frozen=True)
class RankEvent:
    """One of rank 0's events (edgetrain.shared.progress.SCHEMA), or a Keras progress update."""

    event: dict[str, Any]
    at: float


@dataclass(frozen=True)
class StreamEnded:
    """mpirun's stream closed: it has ended, or is about to."""


@dataclass(frozen=True)
class Looked:
    """One look at the nodes: each one's state, or None where the look itself failed; and, inside
    a Slurm job, the nodes the scheduler took from it (set down, drained, failed), each with why."""

    states: tuple[containers.NodeState, ...] | None
    at: float
    taken: Mapping[str, str] = field(default_factory=dict)
    failed: str | None = None  # what went wrong with the look itself, where something unforeseen did


@dataclass(frozen=True)
class Back:
    """A left-out node answers again and runs nothing of this run."""

    host: inventory.Host


Event = Output | RankEvent | StreamEnded | Looked | Back


class Reader(threading.Thread):
    """Reads mpirun's stream to its end. A line is read up to LINE_CHARS at a time: a program that
    prints without a newline is text in pieces, not a line that grows in memory without end."""

    def __init__(self, stream: IO[str], token: str | None, post: Callable[[Event], None]) -> None:
        super().__init__(daemon=True, name="edgetrain-reader")
        self.stream, self.token, self.post = stream, token, post

    def run(self) -> None:
        try:
            for line in iter(lambda: self.stream.readline(LINE_CHARS), ""):
                at, stall = time.monotonic(), HOROVOD_STALL in line
                for piece in progress.parse(line, self.token):
                    self.post(Output(piece, at, stall) if isinstance(piece, str) else RankEvent(piece, at))
        except (OSError, ValueError):
            pass  # the stream was closed under it: mpirun was ended
        finally:
            self.post(StreamEnded())


# Seconds between the end of one look at the nodes and the start of the next.
LOOK_EVERY = 2.0
# A link gone dark is noticed within this, however loaded the machine: the next look starts within
# LOOK_EVERY; its check through the node's shared connection is killed after ssh's timeout; the
# second opinion, a new connection, after CONFIRM_TIMEOUT. Each is a wall-clock limit on a process
# (remote.Nodes.run, remote.Nodes.answers), not a count of keepalives that a busy machine stretches.
# Inside a Slurm allocation the look also asks Slurm which nodes it took, within SLURM_LOOK_S: a
# controller slower than that says nothing this time (the next look asks again).
# README promises about half a minute.
SLURM_LOOK_S = 3.0
DARK_LINK_NOTICED_S = LOOK_EVERY + remote.SSH_TIMEOUT + remote.CONFIRM_TIMEOUT + SLURM_LOOK_S


class Watcher(threading.Thread):
    """Looks at the run's nodes (runtime.states) every ``interval`` seconds, at once when hurried,
    and for the left-out nodes when asked (look_for).

    A node is out of reach when the shared connection to it failed (ssh's keepalives unanswered,
    or no answer within ssh's timeout) and a new connection did not answer either (the runtime's
    ``states``): within DARK_LINK_NOTICED_S of a link going dark. Hydra's own ssh gives up after
    15 s, and MPICH cannot carry on without the node anyway.

    A hurry asks for a look that starts after it: one asked for while a look is under way is
    answered by that look's Looked, and the asker hurries again if it wants another. So no look
    starts after one whose verdict ends the watch: such a look at a node just found out of reach
    would wait on ssh again (a new shared connection, then a new one to confirm), and ending the
    attempt waits for the look under way (Observers.stop) - a head cut off took 45 s to end
    the run where 27 s went to its verdict."""

    def __init__(self, runtime: runtimes.Runtime, run_id: str, post: Callable[[Event], None],
                 held: allocation.Allocation | None = None, interval: float = LOOK_EVERY) -> None:
        super().__init__(daemon=True, name="edgetrain-watcher")
        self.runtime, self.container, self.post, self.interval = runtime, f"edgetrain-{run_id}", post, interval
        self._ended = threading.Event()
        self._hurry = threading.Event()
        self._asked: queue.SimpleQueue[tuple[inventory.Host, ...]] = queue.SimpleQueue()
        self.held = held  # the Slurm job the run is inside, whose nodes Slurm may take away

    def end(self) -> None:
        self._ended.set()
        self._hurry.set()

    def hurry(self) -> None:
        self._hurry.set()

    def look_for(self, hosts: Iterable[inventory.Host]) -> None:
        """Asked by the monitor: on the next look, whether any of ``hosts`` is back."""
        self._asked.put(tuple(hosts))
        self._hurry.set()

    def run(self) -> None:
        while not self._ended.is_set():
            self._hurry.wait(self.interval)
            self._hurry.clear()
            if self._ended.is_set():
                return
            try:
                self._look()
            except Exception as exc:  # noqa: BLE001 - a watcher that died would leave the run unwatched for good
                self.post(Looked(None, time.monotonic(), failed=f"{type(exc).__name__}: {exc}"))

    def _look(self) -> None:
        self._look_for_asked()
        try:
            states = tuple(self.runtime.states())
        except EdgetrainError:
            states = None
        taken = self._taken()
        if not self._ended.is_set():
            self._hurry.clear()  # asked for while this look was under way: its Looked answers
        self.post(Looked(states, time.monotonic(), taken))

    def _taken(self) -> dict[str, str]:
        if self.held is None:
            return {}
        try:
            taken = scheduler.taken([h.name for h in self.runtime.plan.hosts], timeout=SLURM_LOOK_S)
        except EdgetrainError:
            return {}  # the controller out of reach says nothing about the nodes
        return {name: f"Slurm took it from job {self.held.job_id} ({state})" for name, state in taken.items()}

    def _look_for_asked(self) -> None:
        while not self._asked.empty():
            for host in self._asked.get():
                try:
                    if self.runtime.nodes.answers(host) and self.container not in containers.leftovers(self.runtime.nodes, host):
                        self.post(Back(host))
                        return
                except EdgetrainError:
                    continue  # not back yet


@dataclass
class Observers:
    """The attempt's reader and watcher, and the queue they post on."""

    events: queue.Queue[Event]
    reader: Reader
    watcher: Watcher

    @classmethod
    def start(cls, runtime: runtimes.Runtime, run_id: str, token: str | None, proc: subprocess.Popen[str],
              held: allocation.Allocation | None) -> Observers:
        events: queue.Queue[Event] = queue.Queue()
        assert proc.stdout is not None
        found = cls(events, Reader(proc.stdout, token, events.put), Watcher(runtime, run_id, events.put, held))
        found.reader.start()
        found.watcher.start()
        return found

    def stop(self) -> None:
        """After mpirun is gone: the watcher's look under way, and the rest of the stream, awaited."""
        self.watcher.end()
        self.watcher.join(timeout=remote.SSH_TIMEOUT + remote.CONFIRM_TIMEOUT)
        self.reader.join(timeout=10)

    def posted(self) -> list[Event]:
        """What was posted and not yet taken: once both have stopped, the last of it."""
        found = []
        while True:
            try:
                found.append(self.events.get_nowait())
            except queue.Empty:
                return found
