"""bench.json: what a bench measured, written as it goes and read back by `edgetrain run` (its
advice, ``--sync-every auto``, ``--batch-by speed``) and by the plots."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields, is_dataclass, replace
from enum import Enum
from pathlib import Path
from typing import Any

from edgetrain.controller.bench.model import Allreduce, BatchChoice, SyncCandidate
from edgetrain.controller.program import JobOptions
from edgetrain.shared import jobs, untrusted
from edgetrain.shared.batches import BatchBy
from edgetrain.shared.datasets import trained_on
from edgetrain.shared.errors import UsageError
from edgetrain.shared.sync import EVERY_STEP, SyncMode

BENCH = "bench.json"

# A field a bench writes only where it has a value: newer than the kept benches, whose trials lack it.
_WHERE_KNOWN = {"written_if_none": False}

# bench.json's schema: a bench directory is a run directory, as open to damage as run.json
# (edgetrain.shared.untrusted), so every field the record types is checked before it is read.
_FIGURE = untrusted.Maybe(untrusted.NUMBER)
_NODES = untrusted.Matches(re.compile(r"[1-9][0-9]{0,3}"), "a number of nodes")
_SYNC_MODE = untrusted.Matches(re.compile("|".join(m.value for m in SyncMode)), "a --sync-mode")
_STRINGS = untrusted.ListOf((str,))
_RANGE = untrusted.ListOf(untrusted.NUMBER, 2)
_TRIAL = untrusted.Obj(
    {"nodes": (int,), "run": (str,), "status": (str,)},
    {**{k: _FIGURE for k in ("images_per_sec", "seconds_to_target", "images_per_cpu_second", "test_accuracy",
                             "seconds_to_target_from_launch", "busy_cores")},
     "images_to_target": untrusted.Maybe((int,)), "beside": (int,), "seed": untrusted.Maybe((int,)),
     "lost": untrusted.MapOf((str,)), "sync_every": (int,), "sync_mode": _SYNC_MODE,
     "options": untrusted.Maybe(untrusted.Obj()), "host": untrusted.Maybe((str,))})
_POINT = untrusted.Obj(
    {"nodes": (int,), "trials": untrusted.ListOf(_TRIAL)},
    {**{k: _FIGURE for k in ("images_per_sec", "efficiency", "comm_share", "seconds_to_target", "predicted_efficiency",
                             "images_per_cpu_second", "reference")},
     "predicted_range": untrusted.Maybe(_RANGE)})
_ALLREDUCE = untrusted.Obj(
    {k: untrusted.NUMBER for k in ("seconds", "cpu_seconds", "latency_seconds")} | {"nodes": (int,), "bytes": (int,), "run": (str,)},
    {"transport": (str,), "cycle_seconds": untrusted.NUMBER, "idle_cpu_per_second": untrusted.NUMBER})
_CANDIDATE = untrusted.Obj(
    {"sync_every": (int,), "sync_mode": _SYNC_MODE, "nodes": (int,), "predicted": untrusted.NUMBER, "predicted_range": _RANGE},
    {"images_per_sec": _FIGURE, "seconds_to_target": _FIGURE, "runs": _STRINGS})
# What `run --sync-every auto` takes: checked here, and again as the option it becomes.
_CHOICE = untrusted.Obj({"sync_every": (int,), "nodes": (int,), "by": (str,), "sync_mode": _SYNC_MODE},
                        {"images_per_sec": _FIGURE, "seconds_to_target": _FIGURE})
# What `run --batch-by auto` takes.
_BATCH_CHOICE = untrusted.Obj({"batch_by": untrusted.Matches(re.compile(f"{BatchBy.SPEED.value}|{BatchBy.EQUAL.value}"), "speed or equal"),
                               "nodes": (int,), "by_speed": untrusted.NUMBER, "equal": untrusted.NUMBER})
SCHEMA = untrusted.Obj(
    {"points": untrusted.Maybe(untrusted.ListOf(_POINT))},
    {"program": (str,), "args": _STRINGS, "strategy": (str,), "command": _STRINGS, "inventory": untrusted.Maybe((str,)),
     "hosts": _STRINGS, "repeat": (int,), "reference": (str,), "target_accuracy": _FIGURE, "fp16": (bool,),
     "sync_every": (int,), "sync_mode": _SYNC_MODE, "busy_cores": _FIGURE, "allreduce": untrusted.ListOf(_ALLREDUCE),
     "predicted_efficiency": untrusted.MapOf(_FIGURE, _NODES), "predicted_range": untrusted.MapOf(_RANGE, _NODES),
     "trials": untrusted.ListOf(_TRIAL), "each_node": untrusted.Maybe(untrusted.ListOf(_TRIAL)), "sync_candidates": untrusted.ListOf(_CANDIDATE),
     "sync_choice": untrusted.Maybe(_CHOICE), "batch_choice": untrusted.Maybe(_BATCH_CHOICE), "seconds": untrusted.NUMBER})


@dataclass(frozen=True)
class Trial:
    nodes: int
    run: str
    images_per_sec: float | None
    seconds_to_target: float | None
    images_to_target: int | None
    status: str
    images_per_cpu_second: float | None = None  # per CPU-second of every rank's training, communication included
    test_accuracy: float | None = None  # scored once after training, where --holdout kept validation apart
    # From the launch (preflight, containers, the MPI probe, imports, data, tracing) to the target.
    seconds_to_target_from_launch: float | None = None
    beside: int = 0  # one-node runs of a concurrent reference: how many others ran at the same time
    busy_cores: float | None = None  # the CPU its training kept busy on each node (busy_cores_of)
    seed: int | None = None  # a built-in job's: the same at every N in one try
    # Nodes a restart left out (--max-restarts): the run ended on fewer than ``nodes``, so its
    # figures stand for no N and are left out of the medians.
    lost: dict[str, str] = field(default_factory=dict)
    sync_every: int = 1  # how often its ranks talked, and what they sent
    sync_mode: str = SyncMode.GRADS.value
    # A built-in job's: every option it trained with, the held-out split too.
    options: dict[str, Any] | None = field(default=None, metadata=_WHERE_KNOWN)
    host: str | None = field(default=None, metadata=_WHERE_KNOWN)  # the node of a one-node run, where recorded

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> Trial:
        return cls(**{"images_per_sec": None, "seconds_to_target": None, "images_to_target": None, **_known(cls, body)})


@dataclass(frozen=True)
class Point:
    """One N: the medians of its trials, and what was predicted for it."""

    nodes: int
    images_per_sec: float | None
    efficiency: float | None
    comm_share: float | None
    seconds_to_target: float | None
    predicted_efficiency: float | None
    trials: tuple[Trial, ...]
    predicted_range: tuple[float, float] | None = None
    images_per_cpu_second: float | None = None  # the trials' median
    reference: float | None = None  # the one-node img/s E(N) is relative to

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> Point:
        known: dict[str, Any] = {k: None for k in ("images_per_sec", "efficiency", "comm_share", "seconds_to_target", "predicted_efficiency")}
        known |= _known(cls, body)
        known["trials"] = tuple(Trial.from_json(t) for t in body["trials"])
        known["predicted_range"] = _pair(body.get("predicted_range"))
        return cls(**known)


@dataclass(frozen=True)
class SyncChoice:
    """(s): the --sync-every a bench chose, at which N, by what, and how it did there."""

    sync_every: int
    sync_mode: SyncMode
    nodes: int
    by: str
    images_per_sec: float | None = None
    seconds_to_target: float | None = None

    @classmethod
    def from_json(cls, body: Mapping[str, Any]) -> SyncChoice:
        return cls(**{**_known(cls, body), "sync_mode": SyncMode(body["sync_mode"])})


@dataclass(frozen=True)
class BenchRecord:
    """bench.json, field for field in the order it is written; ``read`` checks it against SCHEMA
    first. A field an older bench lacks reads as today's default."""

    program: str = ""
    args: tuple[str, ...] = ()
    strategy: str = ""
    command: tuple[str, ...] = ()
    inventory: str | None = None  # ``where`` of the inventory it ran on
    hosts: tuple[str, ...] = ()
    repeat: int = 1
    reference: str = "alone"
    target_accuracy: float | None = None
    fp16: bool = False
    sync_every: int = EVERY_STEP.sync_every  # the N-loop's own setting
    sync_mode: SyncMode = EVERY_STEP.sync_mode
    busy_cores: float | None = None
    allreduce: tuple[Allreduce, ...] = ()
    predicted_efficiency: Mapping[int, float | None] = field(default_factory=dict)
    predicted_range: Mapping[int, tuple[float, float]] = field(default_factory=dict)
    trials: tuple[Trial, ...] = ()
    # (t): a short one-node run on each node in turn (None: not timed so, as in older benches).
    each_node: tuple[Trial, ...] | None = field(default=None, metadata=_WHERE_KNOWN)
    points: tuple[Point, ...] | None = None  # None until the N-loop is done
    sync_candidates: tuple[SyncCandidate, ...] = ()
    sync_choice: SyncChoice | None = None
    # (t): whether batches by speed pay on the nodes it timed (None: not chosen, as in older benches).
    batch_choice: BatchChoice | None = field(default=None, metadata=_WHERE_KNOWN)
    seconds: float = 0.0
    path: Path | None = field(default=None, compare=False, metadata={"written": False})  # the file it was read from

    @classmethod
    def from_json(cls, body: Any) -> BenchRecord:
        """A bench.json's body, checked against SCHEMA: ValueError saying what is damaged."""
        untrusted.check(body, SCHEMA)
        known = _known(cls, body)
        points = body.get("points")
        known["points"] = tuple(Point.from_json(p) for p in points) if points is not None else None
        for name in ("args", "command", "hosts"):
            known[name] = tuple(body.get(name) or ())
        known["sync_mode"] = SyncMode(body.get("sync_mode") or EVERY_STEP.sync_mode.value)
        known["allreduce"] = tuple(Allreduce(**_known(Allreduce, a)) for a in body.get("allreduce") or ())
        known["predicted_efficiency"] = {int(n): e for n, e in (body.get("predicted_efficiency") or {}).items()}
        known["predicted_range"] = {int(n): (lo, hi) for n, (lo, hi) in (body.get("predicted_range") or {}).items()}
        known["trials"] = tuple(Trial.from_json(t) for t in body.get("trials") or ())
        each = body.get("each_node")
        known["each_node"] = tuple(Trial.from_json(t) for t in each) if each is not None else None
        known["sync_candidates"] = tuple(
            SyncCandidate(**{**_known(SyncCandidate, c), "predicted_range": _pair(c["predicted_range"]), "runs": tuple(c.get("runs") or ())})
            for c in body.get("sync_candidates") or ())
        choice = body.get("sync_choice")
        known["sync_choice"] = SyncChoice.from_json(choice) if choice is not None else None
        batches = body.get("batch_choice")
        if batches is not None and not (batches["by_speed"] > 0 and batches["equal"] > 0):
            raise ValueError("batch_choice's predicted img/s are not both positive")
        known["batch_choice"] = (BatchChoice(**{**_known(BatchChoice, batches), "batch_by": BatchBy(batches["batch_by"])})
                                 if batches is not None else None)
        return cls(**known)

    def to_json(self) -> dict[str, Any]:
        """The body bench.json holds (what ``from_json`` reads back)."""
        written: dict[str, Any] = _json(self)
        return written

    @property
    def name(self) -> str | None:
        """The bench's id: its directory's name, where it was read from a file."""
        return self.path.parent.name if self.path is not None else None


def _known(cls: type, body: Mapping[str, Any]) -> dict[str, Any]:
    """The fields of ``body`` that dataclass ``cls`` writes (a kept bench may hold fields since dropped)."""
    names = {f.name for f in fields(cls) if f.metadata.get("written", True)}
    return {k: v for k, v in body.items() if k in names}


def _pair(value: list[float] | None) -> tuple[float, float] | None:
    return (value[0], value[1]) if value is not None else None


def _json(value: Any) -> Any:
    """``value`` as JSON holds it: a record's fields in their order, tuples as lists, enums as their values."""
    if is_dataclass(value) and not isinstance(value, type):
        out = {}
        for f in fields(value):
            v = getattr(value, f.name)
            if f.metadata.get("written", True) and (v is not None or f.metadata.get("written_if_none", True)):
                out[f.name] = _json(v)
        return out
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (list, tuple)):
        return [_json(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _json(v) for k, v in value.items()}
    return value


def read(path: Path) -> BenchRecord:
    """A bench.json as its record: OSError where it cannot be read, ValueError saying what is damaged."""
    return replace(BenchRecord.from_json(untrusted.load(path)), path=path)


def write(directory: Path, bench: BenchRecord) -> None:
    """``bench`` as the bench.json of ``directory``, whole or not at all (a reader may come at any time)."""
    tmp = directory / f"{BENCH}.tmp"
    tmp.write_text(json.dumps(bench.to_json(), indent=2) + "\n")
    tmp.replace(directory / BENCH)


def latest(root: Path, program: str, inventory: Path | None,
           having: Callable[[BenchRecord], object] = lambda bench: True) -> BenchRecord | None:
    """The newest finished bench of this program on this inventory (its points, for `edgetrain run`'s
    advice) where ``having`` holds (e.g. it chose a --sync-every, for ``--sync-every auto``); one
    that is damaged is passed over."""
    want = where(inventory)
    for path in sorted(root.glob(f"*-bench-{program}-*/{BENCH}"), reverse=True):
        try:
            bench = read(path)
        except (OSError, ValueError):
            continue
        if bench.points and bench.inventory == want and having(bench):
            return bench
    return None


def steps_per_epoch(program: str, options: JobOptions, np: int) -> int:
    """The steps each of ``np`` ranks takes in an epoch of the built-in job ``program`` (as its ranks count them)."""
    spec = jobs.get(program)
    batch = options.batch_size or spec.batch_size
    steps = max(1, trained_on(spec.dataset, options.holdout) // max(np, 1) // batch)
    return min(steps, options.max_steps) if options.max_steps else steps


def chosen_sync(options: JobOptions, root: Path, program: str, inventory: Path | None, np: int,
                log: Callable[[str], None]) -> JobOptions:
    """``--sync-every auto`` (None) replaced by the newest bench's choice for this program on this
    inventory, said in a line; other options are returned as they are. A bench.json is anyone's
    file: a choice past the steps of one epoch (where every epoch's end syncs anyway) is clipped to
    them, and said."""
    if options.sync_every is not None:
        return options
    bench = latest(root, program, inventory, lambda b: b.sync_choice)
    if bench is None or bench.sync_choice is None:
        raise UsageError(f"--sync-every auto takes the newest bench's choice, and no bench of {program} on {described(inventory)} in {root} "
                         "chose one",
                         f"run edgetrain bench {program} --sync-candidates 1,2,4,8 (with the same -i), or give --sync-every K")
    c = bench.sync_choice
    every, most = c.sync_every, steps_per_epoch(program, options, np)
    clipped = f" (it chose {every}, more than the {most} steps of an epoch on {np} rank(s): clipped)" if every > most else ""
    every = min(every, most)
    log(f"--sync-every auto: {every} --sync-mode {c.sync_mode.value}, chosen by bench {bench.name} "
        f"on {c.nodes} nodes by {c.by}{clipped}")
    return replace(options, sync_every=every, sync_mode=c.sync_mode)


def where(inventory: Path | None) -> str | None:
    return str(Path(inventory).resolve()) if inventory else None


def described(inventory: Path | None) -> str:
    """The inventory a run names, as its lines name it."""
    return f"inventory {inventory}" if inventory else "this machine"


def advice(bench: BenchRecord, n_hosts: int) -> str | None:
    """A warning when the bench says ``n_hosts`` nodes train no faster than fewer did (or would)."""
    by_n = {p.nodes: (p, p.images_per_sec) for p in bench.points or () if p.images_per_sec}
    if n_hosts not in by_n or 1 not in by_n:
        return None
    best = max(((p, ips) for n, (p, ips) in by_n.items() if n < n_hosts), key=lambda found: found[1], default=None)
    here, here_ips = by_n[n_hosts]
    chosen = bench.sync_choice
    if chosen is not None and chosen.nodes == n_hosts and chosen.images_per_sec is not None and chosen.images_per_sec > here_ips:
        # The best --sync-every the bench measured there: the extra nodes pay if it does.
        rate = chosen.images_per_sec
        how = (f" with --sync-every {chosen.sync_every} {chosen.sync_mode.value}, "
               f"E({n_hosts}) = {rate / (n_hosts * by_n[1][1]):.0%}")
    else:
        # A bench without its one-node reference wrote no efficiency (null): the rates still speak.
        rate, how = here_ips, f", E({n_hosts}) = {here.efficiency:.0%}" if here.efficiency is not None else ""
    if best is not None and rate <= 1.05 * best[1]:
        return (f"on {n_hosts} nodes this job trained at {rate:,.0f} img/s, against "
                f"{best[1]:,.0f} img/s on {best[0].nodes} (edgetrain bench{how}): "
                f"the extra nodes do not pay")
    return None
