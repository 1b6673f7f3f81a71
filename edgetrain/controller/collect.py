"""Bringing a run home: checkpoints, rank 0's outputs, metrics and logs, every checkpoint and
output file verified against its sha256.

Rank 0's outputs are what its program wrote in its working directory (new or changed files) and
under ``$EDGETRAIN_OUTPUT_DIR``, as listed in ``outputs.json``; for a rank 0 that was killed
before it could list them, they are found by comparing its working copy with what was shipped.

Safe to repeat: a file already at the destination with the right content is left alone, a
missing or damaged one is copied again, and every copy lands under a temporary name first.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from edgetrain.shared import checkpoints, runs, workdir
from edgetrain.shared.datasets import sha256_file
from edgetrain.shared.errors import EdgetrainError
from edgetrain.controller.inventory import Inventory
from edgetrain.controller.remote import Nodes


@dataclass
class Collected:
    dest: Path
    copied: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    checkpoints: list[int] = field(default_factory=list)
    outputs: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # what was left out, and why


def _same(a: Path, b: Path) -> bool:
    return b.is_file() and a.stat().st_size == b.stat().st_size and sha256_file(a) == sha256_file(b)


def _copy(src: Path, dest: Path, rel: str, result: Collected) -> None:
    if _same(src, dest):
        result.unchanged.append(rel)
        return
    tmp = None
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.")
        os.close(fd)
        shutil.copyfile(src, tmp)
        os.replace(tmp, dest)
    except OSError as exc:
        raise EdgetrainError(f"cannot write {dest}: {exc.strerror or exc}",
                             "free some disk (what was copied is kept; collect again to finish)") from None
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)
    result.copied.append(rel)


def _verify_output(path: Path, digest: str) -> None:
    if not path.is_file() or sha256_file(path) != digest:
        raise EdgetrainError(f"output {path} does not match the sha256 rank 0 recorded",
                             "collect again; if it persists, the file changed after the run or the disk is failing")


def outputs_of(run: runs.Run, warn: Callable[[str], None] = lambda line: None) -> dict[str, str]:
    """Rank 0's outputs, ``{path in the run directory: sha256}``; a listed name that would leave
    the run directory (absolute, or with ``..``) is refused, one line to ``warn`` each."""
    listed = run.path / runs.OUTPUTS
    if listed.is_file():
        try:
            found = json.loads(listed.read_text())
            named = {f"{part}/{k}": v for part in ("work", "outputs") for k, v in found[part].items()}
            if not all(isinstance(v, str) for v in named.values()):
                raise ValueError("a digest is not a string")
        except (ValueError, KeyError, AttributeError, TypeError):
            raise EdgetrainError(f"{listed} is damaged", "collect again after a resume, or copy the run directory by hand") from None
        for name in sorted(n for n in named if not checkpoints.confined(n)):
            warn(f"{listed} names {name!r}, outside the run directory: not collected")
        return {n: v for n, v in named.items() if checkpoints.confined(n)}
    shipped = run.path / workdir.MANIFEST
    manifest = workdir.Manifest.from_json(shipped.read_text()) if shipped.is_file() else workdir.Manifest(run.path / "work", ())
    work = workdir.changed(manifest, run.path / "work") if (run.path / "work").is_dir() else {}
    out = workdir.changed(workdir.Manifest(run.path, ()), run.path / "outputs") if (run.path / "outputs").is_dir() else {}
    return {**{f"work/{k}": v for k, v in work.items()}, **{f"outputs/{k}": v for k, v in out.items()}}


def _gather(src: runs.Run, extras: list[Path], dest: Path) -> Collected:
    """Copy the checkpoints and outputs of ``src`` (verified before and after), metrics and logs into ``dest``."""
    try:
        dest.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise EdgetrainError(f"cannot write {dest}: {exc.strerror or exc}", "pass a writable --dest") from None
    result = Collected(dest)
    found = checkpoints.all_in(src.checkpoints, result.warnings.append)
    outputs = outputs_of(src, result.warnings.append)
    if not found and not outputs:
        raise EdgetrainError(f"run {dest.name} has no checkpoint or output yet", "collect it once its first epoch ends")
    for ckpt in found:
        checkpoints.verify(ckpt)
        rel_dir = Path("checkpoints") / ckpt.path.name
        for name in [*ckpt.manifest["files"], checkpoints.MANIFEST]:
            _copy(ckpt.path / name, dest / rel_dir / name, (rel_dir / name).as_posix(), result)
        # The copy is judged by the same manifest as the original.
        checkpoints.verify(ckpt, base=dest / rel_dir)
        result.checkpoints.append(ckpt.epoch)
    for rel, digest in outputs.items():
        _verify_output(src.path / rel, digest)
        _copy(src.path / rel, dest / rel, rel, result)
        _verify_output(dest / rel, digest)
        result.outputs.append(rel)
    tensorboard = src.path / "tensorboard"
    for extra in [*extras, src.metrics_file, *src.logs(), *(p for p in tensorboard.rglob("*") if p.is_file())]:
        if extra.is_file():
            rel = extra.relative_to(src.path).as_posix() if extra.is_relative_to(src.path) else extra.name
            _copy(extra, dest / rel, rel, result)
    return result


def collect_local(run: runs.Run, dest_root: Path) -> Collected:
    return _gather(run, [run.info_file], dest_root / run.id)


def collect_remote(run: runs.Run, inv: Inventory, dest_root: Path) -> Collected:
    """Fetch a container run from its rank-0 node over ssh, then gather it like a local one."""
    where = run.record().placement
    if where is None or not where.hosts:
        raise EdgetrainError(f"run {run.id} records no placement")
    head_name = where.hosts[0]["host"]
    node_dir = (where.nodes or {}).get(head_name, {}).get("runs_dir")
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
            nodes.fetch(head, node_dir, ["checkpoints", "metrics.jsonl", "rank.*.log", runs.OUTPUTS, workdir.MANIFEST,
                                         "work", "outputs", "tensorboard"], staging)
        fetched = {p.name for p in runs.Run(staging).logs()}
        # Ranks on other nodes: their logs were brought home when the run ended.
        others = [p for p in run.logs() if p.name not in fetched]
        return _gather(runs.Run(staging), [run.info_file, *others], dest_root / run.id)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
