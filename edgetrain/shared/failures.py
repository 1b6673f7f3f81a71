"""Failure records: each rank that fails writes ``rank.N.failure.json`` next to its log.

The launcher names the earliest failure from these records rather than from log text, so a line
left in a log by an earlier attempt can never be blamed (a rank clears its record when it starts).
"""

from __future__ import annotations

import enum
import errno
import json
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgetrain.shared import untrusted
from edgetrain.shared.layout import RankFile, RunLayout


# Gloo's transport error naming the peer ("Read error [198.18.0.13]:20128: Connection reset by
# peer"), or Horovod shutting down after its background loop lost a peer.
LOST_PEER = re.compile(r"(?:Read|Write|Connect) error \[([0-9a-fA-F.:]+)\]:\d+: [^\n]*"
                       r"|Connection (?:reset|closed) by peer|Horovod has been shut down[^\n]*")


# CUDA's words when a rank is pinned to a GPU its host does not have (torch's set_device).
NO_SUCH_GPU = "invalid device ordinal"


class Kind(str, enum.Enum):
    EXCEPTION = "exception"  # the program raised
    EXIT = "exit"  # the program exited with a non-zero status
    NO_INIT = "no-init"  # it ended cleanly without what its strategy needs (rank.strategies.Unmet)
    # Its script returned while the others were still in a collective. Its peers then fail too,
    # but it is the cause.
    ENDED_EARLY = "ended-early"
    SIGNAL = "signal"  # a signal it did not catch ended it; its keeper wrote the record (edgetrain.rank.keeper)


@dataclass(frozen=True)
class Failure:
    rank: int
    host: str
    pid: int
    error: str
    time: float
    fix: str | None = None
    traceback: str | None = None
    kind: Kind = Kind.EXCEPTION
    # Seconds the rank had run when it failed, on its monotonic clock: comparable across nodes
    # (their ranks start together under mpirun) where ``time``, a node's wall clock, is not - a Pi
    # without a real-time clock steps it at NTP sync. None in records of earlier versions.
    elapsed: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", Kind(self.kind))  # read back from JSON as its value

    @property
    def lost_peer(self) -> str | None:
        """The address of the peer whose connection broke under this rank's collective (Gloo
        names it), "" when the transport does not say, None when this failure is not of that kind.
        Such a failure is a consequence: the peer was killed, crashed or went off the network."""
        m = self._lost()
        return None if m is None else (m.group(1) or "")

    @property
    def headline(self) -> str:
        """The error in one line: TensorFlow wraps a collective's failure in a graph trace whose
        last lines carry the transport's own words."""
        m = self._lost()
        return self.error if m is None else m.group(0).strip()

    def _lost(self) -> re.Match[str] | None:
        if self.kind is not Kind.EXCEPTION:
            return None
        return LOST_PEER.search(self.error) or LOST_PEER.search(self.traceback or "")


# What a rank's failure record must hold: every field of ``Failure``, with its type.
NONE = type(None)
SCHEMA = untrusted.Obj({"rank": (int,), "host": (str,), "pid": (int,), "error": (str,), "time": untrusted.NUMBER},
                       {"fix": (str, NONE), "traceback": (str, NONE), "kind": (str,), "elapsed": (*untrusted.NUMBER, NONE)})


# When this rank's worker began: the worker imports this module as it starts.
STARTED = time.monotonic()


def path(run_dir: Path, rank: int) -> Path:
    return RunLayout(run_dir).rank_file(rank, RankFile.FAILURE)


def clear(run_dir: Path, rank: int) -> None:
    """Forget how this rank ended in an earlier attempt of the run."""
    path(run_dir, rank).unlink(missing_ok=True)
    ended_path(run_dir, rank).unlink(missing_ok=True)


def clear_all(run_dir: Path) -> None:
    """Forget how every rank ended the run's earlier attempt. The controller's copies need it: a
    node sends home only the records its ranks wrote this attempt, so a rank that could write none
    (its disk full) would leave the last attempt's record to be blamed."""
    layout = RunLayout(run_dir)
    for rank in {*layout.rank_files(RankFile.FAILURE), *layout.rank_files(RankFile.ENDED)}:
        clear(run_dir, rank)


def write(run_dir: Path, rank: int, host: str, error: str, tb: str | None, fix: str | None = None,
          kind: Kind = Kind.EXCEPTION) -> Failure:
    f = Failure(rank, host, os.getpid(), error, time.time(), fix, tb[-4000:] if tb else None, kind,
                time.monotonic() - STARTED)
    # A full disk must not keep a failing rank from ending: what cannot be written is given up.
    final = path(run_dir, rank)
    tmp = final.with_name(f".{final.name}.tmp")
    try:
        tmp.write_text(json.dumps(f.__dict__, indent=1))
        os.replace(tmp, final)
    except OSError:
        try:
            tmp.unlink(missing_ok=True)
        except OSError:
            pass
    try:
        print(f"edgetrain: rank {rank} on {host} failed: {error}", flush=True)
    except OSError:
        pass
    return f


def from_event(event: dict[str, Any]) -> Failure:
    """The failure a rank reported as an event (``failed``) on the launcher's stream; a field
    that does not fit a failure record's is left out."""
    fits = {**SCHEMA.required, **SCHEMA.optional}
    fields = {k: event[k] for k in Failure.__dataclass_fields__ if k in event and untrusted.problem(event[k], fits[k]) is None}
    if fields.get("kind") not in {k.value for k in Kind}:
        fields.pop("kind", None)
    fields.setdefault("pid", 0)
    fields.setdefault("time", time.time())
    fields.setdefault("host", "?")
    return Failure(**{"rank": 0, "error": "?", **fields})


DISK_FULL = "No space left on device"
# A rank's words for a run directory whose disk filled (``disk_full``), which the controller's report
# of that fault reads back: what was being written, after WRITING.
RUN_DIR_FULL = f"its run directory's disk is full ({DISK_FULL})"
WRITING = " while writing "


def disk_full(exc: BaseException, run_dir: Path) -> tuple[str, str] | None:
    """(error, fix) in one line for an exception that is a full disk - an OSError ENOSPC, or
    TensorFlow's ResourceExhaustedError that carries the same words - else None."""
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        where = exc.filename
    elif DISK_FULL in str(exc):
        found = re.search(r"(/\S+?)[;:,]? " + DISK_FULL, str(exc))
        where = found.group(1) if found else None
    else:
        return None
    what = ""
    if where:
        try:
            parts = list(Path(where).relative_to(run_dir).parts)
        except ValueError:
            parts = list(Path(where).parts[-2:])
        if parts[:1] == [RunLayout.CHECKPOINTS] and len(parts) > 1:
            epoch = re.match(r"\.?(epoch-\d+)", parts[1])
            parts = [RunLayout.CHECKPOINTS, epoch.group(1) if epoch else parts[1]]
        what = f"{WRITING}{'/'.join(parts[:2])}"
    return f"{RUN_DIR_FULL}{what}", "free disk space on that node, then resume"


def ended_path(run_dir: Path, rank: int) -> Path:
    return RunLayout(run_dir).rank_file(rank, RankFile.ENDED)


def mark_ended(run_dir: Path, rank: int) -> None:
    """The rank's program returned; it now waits for the others at the final barrier."""
    ended_path(run_dir, rank).write_text(f"{time.time()}\n")


def ended(run_dir: Path) -> list[int]:
    return sorted(RunLayout(run_dir).rank_files(RankFile.ENDED))


def read_all(run_dir: Path, warn: Callable[[str], None] = lambda line: None) -> list[Failure]:
    """Every readable record, the cause first (a rank that ended early, else the earliest); a
    damaged record is skipped rather than blamed, with a line to ``warn`` naming it."""
    found = []
    for p in sorted(run_dir.glob(RunLayout.rank_name("*", RankFile.FAILURE))):
        try:
            data = untrusted.check(untrusted.load(p), SCHEMA)
            record = Failure(**{k: data[k] for k in Failure.__dataclass_fields__ if k in data})
        except OSError:
            continue  # gone since it was listed: a rank of a new attempt cleared it
        except ValueError as exc:
            warn(f"{p} is damaged ({exc}): left out of the failure report")
            continue
        if record.rank == RunLayout.rank_of(p.name, RankFile.FAILURE):  # one rank cannot speak for another
            found.append(record)
    return in_order(found)


def in_order(records: list[Failure]) -> list[Failure]:
    """The cause first: a rank that ended early, else the one that failed soonest after the ranks
    started; a node's wall clock decides only between records that lack ``elapsed``."""
    return sorted(records, key=lambda f: (f.kind is not Kind.ENDED_EARLY, f.elapsed is None, f.elapsed or 0.0, f.time))
