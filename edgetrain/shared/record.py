"""What run.json holds: a run's record and its attempts, typed, with a schema version.

The controller writes it (edgetrain.controller.recorder) and reads it (resume, ``runs``, ``collect``);
``runs show --json`` prints it as it is. A record of an older schema is read with defaults for what
it lacks; one of a newer schema than this edgetrain knows is refused, naming both versions.
"""

from __future__ import annotations

import enum
import time
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from edgetrain.shared import untrusted
from edgetrain.shared.errors import EdgetrainError
from edgetrain.shared.layout import RunLayout
from edgetrain.shared.untrusted import NUMBER, ListOf, MapOf, Maybe, Obj

# 1: the first versioned record (before it, the same fields without "schema").
SCHEMA = 1


class Status(str, enum.Enum):
    """A run's status. Recorded in run.json: STARTING (checks passed, containers starting) ->
    RUNNING (mpirun started) -> COMPLETED, FAILED or INTERRUPTED; a resume starts again at
    STARTING. Read, never recorded: ABANDONED (STARTING or RUNNING, but no command holds the run:
    its edgetrain was killed or lost power) and DAMAGED (run.json unreadable)."""

    STARTING = "starting"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    ABANDONED = "abandoned"
    DAMAGED = "damaged"


_ENDED = frozenset({Status.COMPLETED, Status.FAILED, Status.INTERRUPTED})
# Where a recorded status may go next (None: no run.json yet), checked by every write (runs.Run.write).
# A new attempt (a resume, even of a run whose command died while STARTING or RUNNING) starts again at
# STARTING; a launch whose containers would not start is FAILED before its attempt is recorded.
NEXT: dict[Status | None, frozenset[Status]] = {
    None: frozenset({Status.STARTING, Status.FAILED}),
    Status.STARTING: frozenset({Status.STARTING, Status.RUNNING, Status.FAILED, Status.INTERRUPTED}),
    Status.RUNNING: frozenset({Status.STARTING, Status.FAILED} | _ENDED),
    **{ended: frozenset({Status.STARTING, Status.FAILED}) for ended in _ENDED},
}


class ProgramKind(str, enum.Enum):
    JOB = "job"  # a built-in job (lenet, fashion)
    SCRIPT = "script"  # the user's own script or module


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class Attempt:
    """One start of the run: the first, then one per resume."""

    started: str
    command: list[str]
    np: int
    mpirun: list[str]
    resumed_from_epoch: int | None = None
    shipped: list[dict[str, Any]] = field(default_factory=list)  # per node: what the working directory cost to send
    first_step_s: float | None = None  # seconds from the launch to the first training step
    excluded: dict[str, str] = field(default_factory=dict)  # nodes a restart left out -> how each was lost
    went_on_without: dict[str, str] = field(default_factory=dict)  # nodes lost mid-attempt that it carried on without -> how
    ended_by: str | None = None  # what ended it, in a phrase: completed, a node lost, a rank's failure, abandoned


@dataclass
class ProgramRecord:
    args: list[str] = field(default_factory=list)
    script: str | None = None
    workdir: str | None = None
    requirements: list[str] | None = None


@dataclass
class Where:
    """Where the latest attempt ran."""

    np: int
    runtime: str
    strategy: str
    inventory: str
    hosts: list[dict[str, Any]]  # {"host", "ranks"} in rank order
    oversubscribed: bool = False
    nodes: dict[str, dict[str, Any]] | None = None  # docker runtime: per node its runs directory and image
    speeds: list[float] | None = None  # --batch-by speed: each rank's speed, in rank order; None: equal batches
    speeds_from: str | None = None  # where the nodes' speeds came from (a bench, the inventory)
    batches: list[int] | None = None  # each rank's batch where they differ, as rank 0's program reported them


@dataclass
class RunRecord:
    id: str
    job: str
    status: Status
    kind: ProgramKind = ProgramKind.JOB
    program: ProgramRecord = field(default_factory=ProgramRecord)
    placement: Where | None = None
    attempts: list[Attempt] = field(default_factory=list)
    versions: dict[str, str] = field(default_factory=dict)
    dataset: dict[str, dict[str, Any]] = field(default_factory=dict)
    workdir: dict[str, Any] | None = None  # {"files", "bytes"} shipped, for a script with a working directory
    ended: str | None = None
    returncode: int | None = None
    error: str | None = None
    schema: int = SCHEMA

    def __post_init__(self) -> None:
        self.status, self.kind = Status(self.status), ProgramKind(self.kind)

    @property
    def command(self) -> list[str] | None:
        """The command that started the run (its first attempt's)."""
        return self.attempts[0].command if self.attempts else None

    def to_json(self) -> dict[str, Any]:
        return asdict(self, dict_factory=_plain)

    @classmethod
    def from_json(cls, data: Any, run_id: str) -> RunRecord:
        if not isinstance(data, dict):
            raise EdgetrainError(f"run {run_id}'s {RunLayout.RECORD} is not a record")
        schema = data.get("schema", 0)
        if not isinstance(schema, int) or schema > SCHEMA:
            raise EdgetrainError(f"run {run_id}'s {RunLayout.RECORD} has schema {schema}, this edgetrain reads up to {SCHEMA}",
                                 "read it with the edgetrain that wrote it, or a newer one")
        try:
            untrusted.check(data, RUN_JSON)
            known = _known(cls, data)
            known["program"] = ProgramRecord(**_known(ProgramRecord, known.get("program") or {}))
            if known.get("placement") is not None:
                known["placement"] = Where(**_known(Where, known["placement"]))
            known["attempts"] = [Attempt(**_known(Attempt, a)) for a in known.get("attempts") or []]
            known["schema"] = SCHEMA
            return cls(**known)
        except ValueError as exc:
            raise EdgetrainError(f"run {run_id}'s {RunLayout.RECORD} is damaged ({exc})",
                                 "restore it from a copy (edgetrain collect keeps one), or remove the run") from None


NONE = type(None)
STRINGS = ListOf((str,))
# What run.json must hold for this version to read it: every field that something reads (the
# console, resume, collect), with its type. Fields of a later schema travel along unread.
RUN_JSON = Obj(
    {"id": (str,), "job": (str,), "status": (str,)},
    {"kind": (str,), "schema": (int,),
     "program": Maybe(Obj(optional={"args": STRINGS, "script": (str, NONE), "workdir": (str, NONE), "requirements": Maybe(STRINGS)})),
     "placement": Maybe(Obj({"np": (int,), "runtime": (str,), "strategy": (str,), "inventory": (str,),
                             "hosts": ListOf(Obj({"host": (str,), "ranks": (int,)}))},
                            {"oversubscribed": (bool,), "nodes": Maybe(MapOf(Obj(optional={"runs_dir": (str,), "image": (str, NONE)}))),
                             "speeds": Maybe(ListOf(NUMBER)), "speeds_from": (str, NONE), "batches": Maybe(ListOf((int,)))})),
     "attempts": Maybe(ListOf(Obj({"started": (str,), "command": STRINGS, "np": (int,), "mpirun": STRINGS},
                                  {"resumed_from_epoch": (int, NONE), "shipped": ListOf((dict,)), "first_step_s": (*NUMBER, NONE),
                                   "excluded": MapOf((str,)), "went_on_without": MapOf((str,)),
                                   "ended_by": (str, NONE)}))),
     "versions": (dict,), "dataset": MapOf((dict,)), "workdir": (dict, NONE), "ended": (str, NONE), "returncode": (int, NONE),
     "error": (str, NONE)},
)


def _known(cls: type[Any], data: dict[str, Any]) -> dict[str, Any]:
    """The fields of ``cls`` in ``data``: what a later schema added is not this version's to read."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def _plain(items: list[tuple[str, Any]]) -> dict[str, Any]:
    return {k: v.value if isinstance(v, enum.Enum) else v for k, v in items}
