"""Checkpoints: one directory per epoch, written atomically, described by a sha256 manifest.

``checkpoints/epoch-0003/`` holds the files a job saved and ``manifest.json`` (job, epoch,
metrics, and the sha256 of every file). The directory is assembled under a temporary name and
renamed into place, so a reader sees either a whole checkpoint or none.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgetrain.shared import untrusted
from edgetrain.shared.datasets import sha256_file
from edgetrain.shared.errors import EdgetrainError

MANIFEST = "manifest.json"
PREFIX = "epoch-"


@dataclass(frozen=True)
class Checkpoint:
    path: Path
    manifest: dict[str, Any]

    @property
    def epoch(self) -> int:
        return int(self.manifest["epoch"])

    @property
    def job(self) -> str:
        return str(self.manifest["job"])


@contextmanager
def naming(path: Path) -> Iterator[None]:
    """Writes to ``path`` whose failure names it: an OSError raised by a write or a flush on an open
    file carries no file name, and a full disk's failure record says what was being written."""
    try:
        yield
    except OSError as exc:
        if exc.filename is None:
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise


def fsync_dir(path: Path) -> None:
    """Make a rename in ``path`` durable: until its directory is synced, a power cut may undo it."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def dir_name(epoch: int) -> str:
    """The directory of epoch ``epoch``'s checkpoint, in the run's checkpoints directory."""
    return f"{PREFIX}{epoch:04d}"


def write(root: Path, epoch: int, job: str, metrics: dict[str, Any], save: Callable[[Path], None], extra: dict[str, Any] | None = None) -> Checkpoint:
    """Let ``save`` write files into a fresh directory, then publish it as epoch ``epoch``."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / dir_name(epoch)
    tmp = Path(tempfile.mkdtemp(dir=root, prefix=f".{final.name}."))
    try:
        save(tmp)
        files = {}
        for p in sorted(tmp.rglob("*")):
            if p.is_file():
                with open(p, "rb") as f:
                    os.fsync(f.fileno())
                files[p.relative_to(tmp).as_posix()] = sha256_file(p)
        manifest = {
            "job": job,
            "epoch": epoch,
            "metrics": metrics,
            "files": files,
            "written_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "host": socket.gethostname(),
            **(extra or {}),
        }
        with naming(tmp / MANIFEST), open(tmp / MANIFEST, "w") as f:
            json.dump(manifest, f, indent=2, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        _publish(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Checkpoint(final, manifest)


def _publish(tmp: Path, final: Path) -> None:
    """Rename ``tmp`` to ``final``. A resumed run re-doing an epoch replaces its own older copy of
    that epoch, which is set aside under a hidden name and removed only once the new one is in
    place (and put back if it cannot be)."""
    aside = None
    if final.exists():
        aside = Path(tempfile.mkdtemp(dir=final.parent, prefix=f".{final.name}.replaced.")) / final.name
        os.rename(final, aside)
    try:
        os.rename(tmp, final)
        fsync_dir(final.parent)
    except BaseException:
        if aside is not None and not final.exists():
            os.rename(aside, final)
            aside.parent.rmdir()
        raise
    if aside is not None:
        # The new copy is in place: an old one that cannot be removed is only space, not a failed epoch.
        shutil.rmtree(aside.parent, ignore_errors=True)


def confined(name: object) -> bool:
    """Whether a file name from a manifest a node wrote stays inside its directory: a relative
    POSIX path of plain parts, never absolute, never ``..``."""
    if not isinstance(name, str) or not name or name.startswith("/") or "\\" in name or "\0" in name or "\n" in name:
        return False
    return all(part not in ("", ".", "..") for part in name.split("/"))


# What a manifest must hold for anything to read it: the resume reads its ranks and options, and
# every file's digest goes into a ``sha256sum -c`` list on the node, one line each.
SCHEMA = untrusted.Obj({"job": (str,), "epoch": (int,), "files": untrusted.MapOf(untrusted.SHA256)},
                       {"metrics": untrusted.Obj(optional={"ranks": (int,)}), "options": (dict,), "written_at": (str,), "host": (str,)})


def parse(text: str | bytes) -> dict[str, Any]:
    """The manifest ``text`` holds, if it has the shape ``write`` gives it; else ValueError saying what is wrong."""
    manifest: dict[str, Any] = untrusted.check(untrusted.loads(text), SCHEMA)
    outside = sorted(repr(n) for n in manifest["files"] if not confined(n))
    if outside:
        raise ValueError(f"it names files outside the checkpoint: {', '.join(outside[:3])}")
    return manifest


def read(path: Path) -> Checkpoint:
    try:
        return Checkpoint(path, parse((path / MANIFEST).read_bytes()))
    except (OSError, ValueError) as exc:
        raise EdgetrainError(f"checkpoint {path} has no readable manifest ({exc})") from None


def all_in(root: Path, warn: Callable[[str], None] = lambda line: None) -> list[Checkpoint]:
    """Published checkpoints, oldest first; half-written temporary directories are not listed,
    nor one whose manifest is damaged (``warn`` gets one line for each)."""
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        if p.is_dir() and p.name.startswith(PREFIX) and (p / MANIFEST).is_file():
            try:
                found.append(read(p))
            except EdgetrainError as exc:
                warn(f"{exc} - left out")
    return sorted(found, key=lambda c: c.epoch)


def latest(root: Path) -> Checkpoint | None:
    found = all_in(root)
    return found[-1] if found else None


def verify(ckpt: Checkpoint, base: Path | None = None) -> None:
    """Check every file of a checkpoint (or of a copy of it under ``base``) against the manifest."""
    where = base or ckpt.path
    for name, digest in ckpt.manifest["files"].items():
        p = where / name
        if not p.is_file():
            raise EdgetrainError(f"checkpoint {where} is missing {name}")
        actual = sha256_file(p)
        if actual != digest:
            raise EdgetrainError(f"checkpoint file {p} does not match its manifest (sha256 {actual[:16]}..., expected {digest[:16]}...)")
