"""The script's project folder, shipped to every node content-addressed.

The controller lists the folder (minus what ``.edgetrainignore`` or ``.dockerignore`` excludes)
with each file's sha256. Every node keeps a store of files named by their sha256; only the files
a node's store lacks are sent, and each is verified against its name on arrival. The ranks then
build their working copies from the store (``materialize``), so a second run of an unchanged
folder sends nothing, and a script that writes next to itself writes into its run's own copy.
"""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from edgetrain.shared.datasets import sha256_file
from edgetrain.shared.errors import EdgetrainError, UsageError

IGNORE_FILES = (".edgetrainignore", ".dockerignore")
# Never worth shipping, whatever the ignore file says: version control, caches, virtualenvs,
# and edgetrain's own run directories (a script's folder is often where the user runs from).
ALWAYS_IGNORED = (".git/", "__pycache__/", "*.pyc", ".venv/", "venv/", "runs/", ".ipynb_checkpoints/")
DEFAULT_MAX_BYTES = 256 * 1024**2
MANIFEST = "workdir.json"


@dataclass(frozen=True)
class Entry:
    path: str  # relative, POSIX
    sha256: str
    size: int
    mode: int


@dataclass(frozen=True)
class Manifest:
    root: Path
    entries: tuple[Entry, ...]
    ignore_file: str | None = None

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.entries)

    def to_json(self) -> str:
        return json.dumps({"root": str(self.root), "files": [e.__dict__ for e in self.entries]}, indent=1)

    @staticmethod
    def from_json(text: str) -> Manifest:
        data = json.loads(text)
        return Manifest(Path(data["root"]), tuple(Entry(**e) for e in data["files"]))


def _patterns(root: Path) -> tuple[list[tuple[bool, str]], str | None]:
    """(negated, pattern) rules: the built-in ones, then the folder's ignore file (the first found)."""
    rules = [(False, p) for p in ALWAYS_IGNORED]
    for name in IGNORE_FILES:
        f = root / name
        if f.is_file():
            for line in f.read_text(errors="replace").splitlines():
                line = line.strip()
                if line and not line.startswith("#"):
                    rules.append((True, line[1:]) if line.startswith("!") else (False, line))
            return rules, name
    return rules, None


def _matches(pattern: str, rel: str, is_dir: bool) -> bool:
    """gitignore-style: ``dir/`` only matches directories; a pattern with a slash is anchored at
    the folder, one without matches a name at any depth."""
    if pattern.endswith("/"):
        if not is_dir:
            return False
        pattern = pattern.rstrip("/")
    pattern = pattern.lstrip("/") if "/" in pattern.rstrip("/") or pattern.startswith("/") else pattern
    if "/" in pattern:
        return fnmatch.fnmatchcase(rel, pattern) or fnmatch.fnmatchcase(rel, pattern + "/*")
    return fnmatch.fnmatchcase(rel.rsplit("/", 1)[-1], pattern)


def _ignored(rules: list[tuple[bool, str]], rel: str, is_dir: bool) -> bool:
    ignored = False
    for negated, pattern in rules:
        if _matches(pattern, rel, is_dir):
            ignored = not negated
    return ignored


def scan(root: Path, max_bytes: int = DEFAULT_MAX_BYTES) -> Manifest:
    """Every file of the folder that ships, hashed; refused before hashing when it is too large."""
    root = root.resolve()
    if not root.is_dir():
        raise UsageError(f"working directory {root} is not a directory", "pass --workdir DIR")
    rules, ignore_file = _patterns(root)
    found: list[tuple[str, Path, os.stat_result]] = []
    total = 0
    for dirpath, dirnames, filenames in os.walk(root):
        here = Path(dirpath)
        rel_dir = here.relative_to(root).as_posix()
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        dirnames[:] = sorted(d for d in dirnames if not _ignored(rules, rel_dir + d, True))
        for name in sorted(filenames):
            rel = rel_dir + name
            if _ignored(rules, rel, False):
                continue
            try:
                st = (here / name).stat()  # follows a link to a file: its content ships
            except OSError:
                continue  # a dangling link
            if not stat.S_ISREG(st.st_mode):
                continue
            total += st.st_size
            if total > max_bytes:
                raise UsageError(
                    f"working directory {root} holds more than {max_bytes / 1024**2:.0f} MiB to ship (at {rel})",
                    f"list what the ranks do not need in {root / IGNORE_FILES[0]}, or raise --max-workdir-mb",
                )
            found.append((rel, here / name, st))
    entries = tuple(Entry(rel, sha256_file(p), st.st_size, stat.S_IMODE(st.st_mode)) for rel, p, st in found)
    return Manifest(root, entries, ignore_file)


def materialize(manifest: Manifest, store: Path, dest: Path) -> None:
    """Make ``dest`` hold the shipped files (a resumed run keeps what its script wrote there).

    Files are copied, not linked: a script that rewrites a file in place must not change the store.
    """
    dest.mkdir(parents=True, exist_ok=True)
    for e in manifest.entries:
        target = dest / e.path
        if target.is_file() and target.stat().st_size == e.size and sha256_file(target) == e.sha256:
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{target.name}.edgetrain-tmp")
        shutil.copyfile(store / e.sha256, tmp)
        if sha256_file(tmp) != e.sha256:
            tmp.unlink()
            raise EdgetrainError(f"{store / e.sha256} in the node's file store is damaged", f"remove it; the next run ships {e.path} again")
        os.chmod(tmp, e.mode)
        os.replace(tmp, target)


def changed(manifest: Manifest, workdir: Path) -> dict[str, str]:
    """Files in a working copy that the script created or changed: ``{path: sha256}``."""
    shipped = {e.path: e.sha256 for e in manifest.entries}
    found = {}
    for p in sorted(workdir.rglob("*")):
        if p.is_file() and not p.is_symlink():
            rel = p.relative_to(workdir).as_posix()
            digest = sha256_file(p)
            if shipped.get(rel) != digest:
                found[rel] = digest
    return found
