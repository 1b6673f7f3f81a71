"""Who a failed run's failure belongs to: what was observed, and an ordered list of rules.

Each rule takes what the launcher observed (failure records the ranks wrote or reported, what
the watcher saw, mpirun's output) and returns a finding or nothing; the first finding names the
failure. The order is the argument: a rank's own exception beats what its peers said about it,
the watcher's view of a dead node beats Hydra's, and a rank that only lost a peer names the peer.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from edgetrain.shared import failures, mpi, runs
from edgetrain.controller import containers, placement
from edgetrain.controller.inventory import Host

# How a run whose ranks mpirun never started as edgetrain's workers is described (launch's _unstarted).
NOT_THE_WORKER = "started edgetrain's worker"
# Failures a resume repeats, each with what to do instead: a module the script imports is missing;
# a local rank was pinned to a GPU its host does not have; mpirun ran something else than the worker.
UNRESUMABLE = (
    (re.compile(r"^(?:ModuleNotFoundError|ImportError)\b"),
     "add what is missing to a requirements.txt beside the script (or --requirements FILE), then run it again"),
    (re.compile(re.escape(failures.NO_SUCH_GPU)),
     "run it again with no more ranks on a host than it has GPUs (a lower --np, or fewer slots for it in the inventory)"),
    (re.compile(re.escape(NOT_THE_WORKER)),
     "fix what mpirun starts on the nodes (the inventory's edgetrain_mpi_env, the environment it passes), then run it again"),
)
TAIL_BYTES = 64 * 1024  # of a rank's log, for its last lines
LINE_CHARS = 4096  # of a rank's log line, for the line its worker logs when it starts
# That line: "rank 1/4 on node2 (pid 812, keeper 811)"; logs of earlier versions name no keeper.
STARTED = re.compile(r"rank (?P<rank>\d+)/\d+ on (?P<host>\S+) \(pid (?P<pid>\d+)(?:, keeper (?P<keeper>\d+))?\)")


@dataclass(frozen=True)
class Finding:
    rank: int | None
    host: str | None
    error: str | None
    log_tail: tuple[str, ...] = ()

    @property
    def instead_of_resume(self) -> str | None:
        """What to do where a resume would only repeat the failure, whose cause is then the nodes'
        environment rather than how far the run got; None where a resume may help."""
        return next((fix for pattern, fix in UNRESUMABLE if pattern.search(self.error or "")), None)

    @property
    def disk_full_writing(self) -> str | None:
        """What the rank was writing when its run directory's disk filled ("checkpoints/epoch-0002";
        "" where it did not say), from its own words (failures.disk_full); None for any other failure."""
        error = self.error or ""
        if not error.startswith(failures.RUN_DIR_FULL):
            return None
        rest = error[len(failures.RUN_DIR_FULL):]
        return rest[len(failures.WRITING):].split(" - ")[0] if rest.startswith(failures.WRITING) else ""


@dataclass(frozen=True)
class Observed:
    """What a failed attempt left: its run directory, its placement, mpirun's output lines, what
    the watcher saw (a host or None, and why), the failures rank 0 reported on its stream, and
    where to say that a failure record is damaged."""

    run: runs.Run
    plan: placement.Placement
    output: Sequence[str]
    watched: tuple[Host | None, str] | None = None
    reported: Sequence[failures.Failure] = field(default_factory=tuple)
    warn: Callable[[str], None] = lambda line: None  # a line for each failure record that is damaged

    @cached_property
    def records(self) -> list[failures.Failure]:
        """The ranks' failure records, with what rank 0 reported where its disk could not take the record."""
        records = failures.read_all(self.run.path, self.warn)
        recorded = {f.rank for f in records}
        if any(f.rank not in recorded for f in self.reported):
            records = failures.in_order([*records, *(f for f in self.reported if f.rank not in recorded)])
        return records

    @cached_property
    def ended(self) -> list[int]:
        """The ranks whose script returned."""
        return failures.ended(self.run.path)

    @cached_property
    def rank_hosts(self) -> dict[str, list[tuple[int, str]]]:
        """pid -> [(rank, hostname)], the rank's and its keeper's (the process Hydra reports),
        from the line each rank's worker logs when it starts."""
        pids: dict[str, list[tuple[int, str]]] = {}
        for log in self.run.logs():
            with open(log, errors="replace") as f:
                # A line is read in bounded pieces: a rank may print megabytes without a newline.
                while line := f.readline(LINE_CHARS):
                    if m := STARTED.match(line):
                        for pid in filter(None, (m["pid"], m["keeper"])):
                            pids.setdefault(pid, []).append((int(m["rank"]), m["host"]))
        return pids

    def tail(self, rank: int, n: int = 15) -> tuple[str, ...]:
        """The last lines of the rank's log, read from its last TAIL_BYTES: a log may be gigabytes."""
        log = self.run.log(rank)
        if not log.is_file():
            return ()
        with open(log, "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - TAIL_BYTES))
            return tuple(f.read(TAIL_BYTES).decode(errors="replace").splitlines()[-n:])

    def output_tail(self) -> tuple[str, ...]:
        return tuple(self.output)[-15:]

    def host_of(self, address: str) -> Host | None:
        return next((h for h in self.plan.hosts if h.address == address or h.name == address), None)

    def of_rank(self, record: failures.Failure, error: str) -> Finding:
        return Finding(record.rank, record.host, error, self.tail(record.rank))


def collective_after_a_script_ended(o: Observed) -> Finding | None:
    """A collective (Horovod's, or one that lost its peer: torch's Gloo) failed under the others
    after some ranks' scripts had returned; those may have been ended by Hydra before they could
    write their own record."""
    first = o.records[0] if o.records else None
    if first is None or first.kind is failures.Kind.ENDED_EARLY or not o.ended or len(o.ended) >= o.plan.np:
        return None
    if "Horovod" not in (first.traceback or first.error) and first.lost_peer is None:
        return None  # not a collective's failure
    hosts = {rank: host for entries in o.rank_hosts.values() for rank, host in entries}
    rank = o.ended[0]
    return Finding(rank, hosts.get(rank), "its script ended while other ranks were still training - run the same "
                   f"collective steps on every rank (rank {first.rank}: {first.error.splitlines()[0][:200]})", o.tail(rank))


def a_rank_failed(o: Observed) -> Finding | None:
    """The earliest record of a rank that failed by itself (not by losing a peer)."""
    first = next((f for f in o.records if f.lost_peer is None), None)
    return o.of_rank(first, first.error + (f" - {first.fix}" if first.fix else "")) if first else None


def the_watcher_saw_it(o: Observed) -> Finding | None:
    """A node's container gone or out of reach, a hang, or ranks left after rank 0 failed."""
    if o.watched is None:
        return None
    host, why = o.watched
    if host is None and o.ended and len(o.ended) < o.plan.np:
        waiting = sorted(set(range(o.plan.np)) - set(o.ended))
        why = (f"{why}; ranks {', '.join(map(str, o.ended))} ended their script while ranks "
               f"{', '.join(map(str, waiting))} had not - a script must run the same collective steps on every rank")
    ranks = o.plan.ranks_on(host) if host else []
    if host and ranks:
        return Finding(ranks[0], host.name, why, o.tail(ranks[0]))
    return Finding(None, host.name if host else None, why, o.output_tail())


def the_peer_a_rank_lost(o: Observed) -> Finding | None:
    """That rank only failed because its peer went (killed, crashed, off the network), and the
    peer could not say so itself."""
    record = o.records[0] if o.records else None
    peer = o.host_of(record.lost_peer) if record is not None and record.lost_peer else None
    if record is None or peer is None:
        return None
    ranks = o.plan.ranks_on(peer)
    return Finding(ranks[0] if len(ranks) == 1 else None, peer.name,
                   f"it went away during a collective (rank {record.rank} on {record.host}: {record.headline})",
                   o.tail(ranks[0]) if ranks else ())


def hydra_names_a_process(o: Observed) -> Finding | None:
    """The process Hydra reports as ended badly. Hydra names the machinefile entry; the rank log
    knows the hostname. Pids can repeat across hosts, so only an unambiguous match names the rank."""
    ended = mpi.terminated("\n".join(o.output))
    if ended is None:
        return None
    pid, entry, code = ended
    error = f"process {pid} ended abnormally" + (f" (exit code {code})" if code is not None else "")
    candidates = o.rank_hosts.get(pid, [])
    if len(candidates) == 1:
        rank, host = candidates[0]
        return Finding(rank, host, error, o.tail(rank))
    return Finding(None, getattr(o.host_of(entry), "name", entry), error, o.output_tail())


def hydra_lost_a_node(o: Observed) -> Finding | None:
    lost = mpi.lost_node("\n".join(o.output))
    if lost is None:
        return None
    return Finding(None, getattr(o.host_of(lost), "name", lost), "lost its connection to mpirun", o.output_tail())


def hydra_could_not_reach_a_node(o: Observed) -> Finding | None:
    unreached = mpi.unreached("\n".join(o.output))
    if unreached is None:
        return None
    address, reason = unreached
    return Finding(None, getattr(o.host_of(address), "name", address),
                   f"mpirun could not reach it over ssh ({reason}) - {containers.REACH_FIX} (edgetrain doctor -i INVENTORY probes it)", o.output_tail())


def the_first_record(o: Observed) -> Finding | None:
    return o.of_rank(o.records[0], o.records[0].headline) if o.records else None


RULES: tuple[Callable[[Observed], Finding | None], ...] = (
    collective_after_a_script_ended,
    a_rank_failed,
    the_watcher_saw_it,
    the_peer_a_rank_lost,
    hydra_names_a_process,
    hydra_lost_a_node,
    hydra_could_not_reach_a_node,
    the_first_record,
)


def find(observed: Observed) -> Finding:
    """The first rule's finding; with none, the failure is unnamed and mpirun's output tail is shown."""
    for rule in RULES:
        finding = rule(observed)
        if finding is not None:
            return finding
    return Finding(None, None, None, observed.output_tail())
