"""bench.json: what a bench measured, written as it goes and read back by `edgetrain run` (its
advice, ``--sync-every auto``, ``--batch-by speed``) and by the plots."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from edgetrain.controller.program import JobOptions
from edgetrain.shared import jobs, untrusted
from edgetrain.shared.datasets import trained_on
from edgetrain.shared.errors import UsageError
from edgetrain.shared.sync import SyncMode

BENCH = "bench.json"

# What of bench.json is read back (run's advice, plots): a bench directory is a run directory,
# as open to damage as run.json (edgetrain.shared.untrusted).
_FIGURE = untrusted.Maybe(untrusted.NUMBER)
_TRIAL = untrusted.Obj(optional={"images_per_sec": _FIGURE, "seconds_to_target": _FIGURE})
_NODES = untrusted.Matches(re.compile(r"[1-9][0-9]{0,3}"), "a number of nodes")
_SYNC_MODE = untrusted.Matches(re.compile("|".join(m.value for m in SyncMode)), "a --sync-mode")
SCHEMA = untrusted.Obj(
    {"points": untrusted.Maybe(untrusted.ListOf(untrusted.Obj(
        {"nodes": (int,), "trials": untrusted.ListOf(_TRIAL)},
        {k: _FIGURE for k in ("images_per_sec", "efficiency", "reference", "seconds_to_target")})))},
    {"inventory": untrusted.Maybe((str,)), "target_accuracy": _FIGURE,
     "predicted_efficiency": untrusted.MapOf(_FIGURE, _NODES),
     "predicted_range": untrusted.MapOf(untrusted.ListOf(untrusted.NUMBER, 2), _NODES),
     "sync_every": (int,), "sync_mode": _SYNC_MODE,
     "sync_candidates": untrusted.ListOf(untrusted.Obj(
         {"sync_every": (int,), "sync_mode": _SYNC_MODE, "nodes": (int,)},
         {"predicted": _FIGURE, "images_per_sec": _FIGURE, "seconds_to_target": _FIGURE})),
     # What `run --sync-every auto` takes: checked here, and again as the option it becomes.
     "sync_choice": untrusted.Maybe(untrusted.Obj(
         {"sync_every": (int,), "nodes": (int,), "by": (str,), "sync_mode": _SYNC_MODE},
         {"images_per_sec": _FIGURE, "seconds_to_target": _FIGURE}))})


def read(path: Path) -> dict[str, Any]:
    """A bench.json, checked against SCHEMA: OSError where it cannot be read, ValueError saying what is damaged."""
    body: dict[str, Any] = untrusted.check(untrusted.load(path), SCHEMA)
    return body


def write(directory: Path, body: dict[str, Any]) -> None:
    """``body`` as the bench.json of ``directory``, whole or not at all (a reader may come at any time)."""
    tmp = directory / f"{BENCH}.tmp"
    tmp.write_text(json.dumps(body, indent=2) + "\n")
    tmp.replace(directory / BENCH)


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
    options: dict[str, Any] = field(default_factory=dict)  # a built-in job's: every option it trained with, the held-out split too

@dataclass(frozen=True)
class Point:
    """One N: the medians of its trials, and what was predicted for it."""

    nodes: int
    images_per_sec: float | None
    efficiency: float | None
    comm_share: float | None
    seconds_to_target: float | None
    predicted_efficiency: float | None
    trials: list[Trial]
    predicted_range: tuple[float, float] | None = None
    images_per_cpu_second: float | None = None  # the trials' median
    reference: float | None = None  # the one-node img/s E(N) is relative to

def latest(root: Path, program: str, inventory: Path | None, having: str = "points") -> dict[str, Any] | None:
    """The newest finished bench of this program on this inventory that holds ``having`` (its
    points, for `edgetrain run`'s advice; its sync_choice, for ``--sync-every auto``); one that is
    damaged is passed over."""
    want = where(inventory)
    for path in sorted(root.glob(f"*-bench-{program}-*/bench.json"), reverse=True):
        try:
            body = read(path)
        except (OSError, ValueError):
            continue
        if body.get(having) and body.get("points") and body.get("inventory") == want:
            body.setdefault("path", str(path))
            return body
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
    body = latest(root, program, inventory, having="sync_choice")
    if body is None:
        where = f"inventory {inventory}" if inventory else "this machine"
        raise UsageError(f"--sync-every auto takes the newest bench's choice, and no bench of {program} on {where} in {root} chose one",
                         f"run edgetrain bench {program} --sync-candidates 1,2,4,8 (with the same -i), or give --sync-every K")
    c = body["sync_choice"]
    every, most = c["sync_every"], steps_per_epoch(program, options, np)
    clipped = f" (it chose {every}, more than the {most} steps of an epoch on {np} rank(s): clipped)" if every > most else ""
    every = min(every, most)
    log(f"--sync-every auto: {every} --sync-mode {c['sync_mode']}, chosen by bench {Path(body['path']).parent.name} "
        f"on {c['nodes']} nodes by {c['by']}{clipped}")
    return replace(options, sync_every=every, sync_mode=SyncMode(c["sync_mode"]))


def where(inventory: Path | None) -> str | None:
    return str(Path(inventory).resolve()) if inventory else None


def advice(body: dict[str, Any], n_hosts: int) -> str | None:
    """A warning when the bench says ``n_hosts`` nodes train no faster than fewer did (or would)."""
    by_n = {p["nodes"]: p for p in body["points"] if p.get("images_per_sec")}
    if n_hosts not in by_n or 1 not in by_n:
        return None
    best = max((p for n, p in by_n.items() if n < n_hosts), key=lambda p: p["images_per_sec"], default=None)
    here = by_n[n_hosts]
    chosen = body.get("sync_choice") or {}
    if chosen.get("nodes") == n_hosts and (chosen.get("images_per_sec") or 0) > here["images_per_sec"]:
        # The best --sync-every the bench measured there: the extra nodes pay if it does.
        rate = chosen["images_per_sec"]
        how = f" with --sync-every {chosen['sync_every']} {chosen['sync_mode']}, E({n_hosts}) = {rate / (n_hosts * by_n[1]['images_per_sec']):.0%}"
    else:
        # A bench without its one-node reference wrote no efficiency (null): the rates still speak.
        rate, how = here["images_per_sec"], f", E({n_hosts}) = {here['efficiency']:.0%}" if here.get("efficiency") is not None else ""
    if best is not None and rate <= 1.05 * best["images_per_sec"]:
        return (f"on {n_hosts} nodes this job trained at {rate:,.0f} img/s, against "
                f"{best['images_per_sec']:,.0f} img/s on {best['nodes']} (edgetrain bench{how}): "
                f"the extra nodes do not pay")
    return None
