"""Bringing a run home: checkpoints, metrics and logs, each checkpoint verified against its manifest.

Safe to repeat: a file already at the destination with the right content is left alone, a
missing or damaged one is copied again, and every copy lands under a temporary name first.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from . import checkpoints, runs
from .datasets import sha256_file
from .errors import EdgetrainError
from .inventory import Inventory
from .remote import Nodes


@dataclass
class Collected:
    dest: Path
    copied: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    checkpoints: list[int] = field(default_factory=list)


def _same(a: Path, b: Path) -> bool:
    return b.is_file() and a.stat().st_size == b.stat().st_size and sha256_file(a) == sha256_file(b)


def _copy(src: Path, dest: Path, rel: str, result: Collected) -> None:
    if _same(src, dest):
        result.unchanged.append(rel)
        return
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
    os.close(fd)
    try:
        shutil.copyfile(src, tmp)
        os.replace(tmp, dest)
    finally:
        Path(tmp).unlink(missing_ok=True)
    result.copied.append(rel)


def _gather(src: runs.Run, extras: list[Path], dest: Path) -> Collected:
    """Copy the checkpoints (verified before and after), metrics and logs of ``src`` into ``dest``."""
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EdgetrainError(f"cannot write {dest}: {exc.strerror or exc}", "pass a writable --dest") from None
    result = Collected(dest)
    found = checkpoints.all_in(src.checkpoints)
    if not found:
        raise EdgetrainError(f"run {dest.name} has no checkpoint yet", "collect it after its first epoch ends")
    for ckpt in found:
        checkpoints.verify(ckpt)
        rel_dir = Path("checkpoints") / ckpt.path.name
        for name in [*ckpt.manifest["files"], checkpoints.MANIFEST]:
            _copy(ckpt.path / name, dest / rel_dir / name, (rel_dir / name).as_posix(), result)
        # The copy is judged by the same manifest as the original.
        checkpoints.verify(ckpt, base=dest / rel_dir)
        result.checkpoints.append(ckpt.epoch)
    for extra in [*extras, src.metrics_file, *src.logs()]:
        if extra.is_file():
            _copy(extra, dest / extra.name, extra.name, result)
    return result


def collect_local(run: runs.Run, dest_root: Path) -> Collected:
    return _gather(run, [run.info_file], dest_root / run.id)


def collect_remote(run: runs.Run, inv: Inventory, dest_root: Path) -> Collected:
    """Fetch a container run from its rank-0 node over ssh, then gather it like a local one."""
    where = run.info().get("placement", {})
    head_name = where["hosts"][0]["host"]
    node_dir = where.get("nodes", {}).get(head_name, {}).get("runs_dir")
    if node_dir is None:
        raise EdgetrainError(f"run {run.id} records no run directory on {head_name}")
    head = inv.host(head_name)
    try:
        dest_root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(dir=dest_root, prefix=f".{run.id}.incoming-"))
    except OSError as exc:
        raise EdgetrainError(f"cannot write {dest_root}: {exc.strerror or exc}", "pass a writable --dest") from None
    try:
        with Nodes() as nodes:
            nodes.fetch(head, node_dir, ["checkpoints", "metrics.jsonl", "rank.*.log"], staging)
        fetched = {p.name for p in runs.Run(staging).logs()}
        # Ranks on other nodes: their logs were brought home when the run ended.
        others = [p for p in run.logs() if p.name not in fetched]
        return _gather(runs.Run(staging), [run.info_file, *others], dest_root / run.id)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
