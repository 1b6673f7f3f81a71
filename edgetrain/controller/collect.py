"""Bringing a run home: checkpoints, rank 0's outputs, metrics and logs, every checkpoint and
output file verified against its sha256.

Rank 0's outputs are what its program wrote in its working directory (new or changed files) and
under ``$EDGETRAIN_OUTPUT_DIR``, as listed in ``outputs.json``; for a rank 0 that was killed
before it could list them, they are found by comparing its working copy with what was shipped.

Safe to repeat: a file already at the destination with the right content is left alone, a
missing or damaged one is copied again, and every copy lands under a temporary name first.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import os
import shutil
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from edgetrain.shared import checkpoints, runs, untrusted, workdir
from edgetrain.shared.datasets import sha256_file
from edgetrain.shared.errors import EdgetrainError
from edgetrain.shared.layout import RankFile, RunLayout
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


def _open_inside(root: Path, rel: str) -> int:
    """A descriptor of the regular file ``rel`` under ``root``, reached without following a link at
    any step: a rank's program may leave links in its run directory that point anywhere on the
    machine. OSError: ELOOP where a step is a link, EINVAL where the file is not a regular file."""
    parts = rel.split("/")
    at = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            try:
                inner = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=at)
            except NotADirectoryError:
                # Linux says a link to a directory is not one, opened this way.
                if stat.S_ISLNK(os.lstat(part, dir_fd=at).st_mode):
                    raise OSError(errno.ELOOP, "a link", rel) from None
                raise
            os.close(at)
            at = inner
        # O_NONBLOCK: a FIFO left there must not hang the collect.
        fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=at)
    finally:
        os.close(at)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, "not a regular file", rel)
    return fd


def _refused(exc: OSError) -> str:
    """What keeps a file from being copied (``_open_inside``'s OSError), in a phrase."""
    if exc.errno == errno.ELOOP:
        return "a link"
    if exc.errno == errno.EINVAL:
        return "not a regular file"
    return f"unreadable ({exc.strerror or exc})"


def _sha256(f: BinaryIO) -> str:
    f.seek(0)
    h = hashlib.sha256()  # not hashlib.file_digest: Python 3.11's, and edgetrain runs on 3.10
    for block in iter(functools.partial(f.read, 1 << 20), b""):
        h.update(block)
    return h.hexdigest()


def _copy(root: Path, rel: str, dest: Path, result: Collected, digest: str | None = None, recorded: str = "") -> str | None:
    """Copy ``root/rel`` to ``dest/rel``, where it is not already there, checked before and after
    against ``digest`` (as ``recorded`` lists it) where one is given. What keeps the source from
    being copied (a link, not a regular file) is returned, and it is left alone; a source that is
    not there is None, or an error where ``digest`` says it must be."""
    try:
        fd = _open_inside(root, rel)
    except FileNotFoundError:
        if digest is None:
            return None
        raise EdgetrainError(f"{root / rel} is missing, though {recorded} lists it", COLLECT_AGAIN) from None
    except OSError as exc:
        return _refused(exc)
    target = dest / rel
    tmp = None
    with os.fdopen(fd, "rb") as src:
        actual = _sha256(src)
        if digest is not None and actual != digest:
            raise EdgetrainError(f"{root / rel} does not match the sha256 {recorded} gives it", COLLECT_AGAIN)
        if target.is_file() and not target.is_symlink() and target.stat().st_size == os.fstat(fd).st_size and sha256_file(target) == actual:
            result.unchanged.append(rel)
            return None
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            out, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
            with os.fdopen(out, "w+b") as copy:
                src.seek(0)
                shutil.copyfileobj(src, copy)
                copy.flush()
                copied = _sha256(copy)
            if copied != actual:
                raise EdgetrainError(f"the copy of {root / rel} in {dest} does not match it", COLLECT_AGAIN)
            os.replace(tmp, target)
        except OSError as exc:
            raise EdgetrainError(f"cannot write {target}: {exc.strerror or exc}",
                                 "free some disk (what was copied is kept; collect again to finish)") from None
        finally:
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)
    result.copied.append(rel)
    return None


COLLECT_AGAIN = "collect again; if it persists, the file changed after the run or the disk is failing"
# What outputs.json holds: rank 0's new or changed files, in its working directory and its output
# directory, keyed by their names in the run directory.
LISTED = (RunLayout.WORK, RunLayout.OUTPUTS)
OUTPUTS = untrusted.Obj({part: untrusted.MapOf(untrusted.SHA256) for part in LISTED})


def outputs_of(run: runs.Run, warn: Callable[[str], None] = lambda line: None) -> dict[str, str]:
    """Rank 0's outputs, ``{path in the run directory: sha256}``; a listed name that would leave
    the run directory (absolute, or with ``..``) is refused, one line to ``warn`` each."""
    listed = run.outputs_list
    if listed.is_file():
        try:
            found = untrusted.check(untrusted.load(listed), OUTPUTS)
        except (OSError, ValueError) as exc:
            raise EdgetrainError(f"{listed} is damaged ({exc})", "collect again after a resume, or copy the run directory by hand") from None
        named = {f"{part}/{k}": v for part in LISTED for k, v in found[part].items()}
        for name in sorted(n for n in named if not checkpoints.confined(n)):
            warn(f"{listed} names {name!r}, outside the run directory: not collected")
        return {n: v for n, v in named.items() if checkpoints.confined(n)}
    shipped = run.workdir_manifest
    try:
        manifest = workdir.Manifest.from_json(shipped.read_text()) if shipped.is_file() else workdir.Manifest(run.work(), ())
    except (OSError, ValueError) as exc:
        raise EdgetrainError(f"{shipped} is damaged ({exc})", "copy the run directory by hand") from None
    work = workdir.changed(manifest, run.work()) if run.work().is_dir() else {}
    out = workdir.changed(workdir.Manifest(run.path, ()), run.outputs()) if run.outputs().is_dir() else {}
    return {f"{part}/{k}": v for part, files in zip(LISTED, (work, out), strict=True) for k, v in files.items()}


def _gather(src: runs.Run, extras: list[Path], dest: Path) -> Collected:
    """Copy the checkpoints and outputs of ``src`` (verified before and after), metrics and logs
    into ``dest``; a link among them is left out, a line in the result's warnings each."""
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
        rel_dir = f"{src.CHECKPOINTS}/{ckpt.path.name}"
        files = {f"{rel_dir}/{name}": digest for name, digest in ckpt.manifest["files"].items()}
        refused = next(((rel, why) for rel in [*files, f"{rel_dir}/{checkpoints.MANIFEST}"] if (why := _refusal(src.path, rel))), None)
        if refused is not None:
            result.warnings.append(f"{src.path / refused[0]} is {refused[1]}: checkpoint {ckpt.path.name} not collected")
            continue
        for rel, digest in files.items():
            _copy(src.path, rel, dest, result, digest, f"{rel_dir}/{checkpoints.MANIFEST}")
        _copy(src.path, f"{rel_dir}/{checkpoints.MANIFEST}", dest, result)
        result.checkpoints.append(ckpt.epoch)
    for rel, digest in outputs.items():
        why = _copy(src.path, rel, dest, result, digest, f"rank 0's {src.OUTPUTS_LIST}")
        if why is None:
            result.outputs.append(rel)
        else:
            result.warnings.append(f"output {src.path / rel} is {why}: not collected")
    for extra in [*extras, src.metrics_file, *src.logs(), *(p for p in src.tensorboard.rglob("*") if not p.is_dir() or p.is_symlink())]:
        root, rel = (src.path, extra.relative_to(src.path).as_posix()) if extra.is_relative_to(src.path) else (extra.parent, extra.name)
        why = _copy(root, rel, dest, result)
        if why is not None:
            result.warnings.append(f"{extra} is {why}: not collected")
    return result


def _refusal(root: Path, rel: str) -> str | None:
    """What keeps ``root/rel`` from being copied (see ``_copy``), or None."""
    try:
        os.close(_open_inside(root, rel))
    except FileNotFoundError:
        return None  # the copy names what is missing
    except OSError as exc:
        return _refused(exc)
    return None


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
            nodes.fetch(head, node_dir, [RunLayout.CHECKPOINTS, RunLayout.METRICS, RunLayout.rank_name("*", RankFile.LOG), RunLayout.OUTPUTS_LIST,
                                         RunLayout.WORKDIR_MANIFEST, *LISTED, RunLayout.TENSORBOARD], staging)
        fetched = {p.name for p in runs.Run(staging).logs()}
        # Ranks on other nodes: their logs were brought home when the run ended.
        others = [p for p in run.logs() if p.name not in fetched]
        return _gather(runs.Run(staging), [run.info_file, *others], dest_root / run.id)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
