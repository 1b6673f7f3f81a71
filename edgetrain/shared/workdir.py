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
import re
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path

from edgetrain.shared import untrusted
from edgetrain.shared.datasets import sha256_file
from edgetrain.shared.errors import EdgetrainError, UsageError

IGNORE_FILES = (".edgetrainignore", ".dockerignore")
# Never worth shipping, whatever the ignore file says: version control, caches, virtualenvs,
# and edgetrain's own run directories (a script's folder is often where the user runs from).
ALWAYS_IGNORED = (".git/", "__pycache__/", "*.pyc", ".venv/", "venv/", "runs/", ".ipynb_checkpoints/")
# Names that look like credentials: left out unless asked for (--ship-secrets, or a ``!`` line in
# the ignore file), since the nodes and everyone who runs there would hold a copy. A file is judged
# by what its path ends with (case aside: ".aws/credentials" at any depth), and by the real path it
# reaches through links as well. Taken from what secret scanners flag (gitleaks' config/gitleaks.toml,
# detect-secrets' plugins):
# - gitleaks' one rule by file name alone, pkcs12-file, path (?i)(?:^|/)[^/]+\.p(?:12|fx)$: "*.p12", "*.pfx";
# - the files their content rules are written for: private keys (gitleaks private-key,
#   detect-secrets PrivateKeyDetector, which knows PuTTY's too): "*.pem", "*.key", "*.ppk", ssh's
#   "id_*"; npm tokens (gitleaks npm-access-token, NpmDetector's ``//host/:_authToken=`` line):
#   .npmrc; PyPI tokens (gitleaks pypi-upload-token, PypiTokenDetector): .pypirc; AWS keys
#   (gitleaks aws-access-token, AWSKeyDetector): .aws/credentials; https://user:token@ URLs
#   (BasicAuthDetector): .git-credentials; passwords (KeywordDetector): .netrc; base64 logins
#   (Base64HighEntropyString): .docker/config.json; service-account tokens (gitleaks jwt,
#   JwtTokenDetector) and client keys: .kube/config; NAME=value secrets (gitleaks generic-api-key,
#   KeywordDetector): .env and its variants (.env.local, ...).
SECRETS = (".env", ".env.*", "*.pem", "*.key", "*.ppk", "*.p12", "*.pfx", "id_*", ".netrc", ".git-credentials",
           ".pypirc", ".npmrc", ".docker/config.json", ".kube/config", ".aws/credentials")
# A private key under any name (server.crt, a key pasted into config.txt): the header gitleaks'
# private-key rule and detect-secrets' PrivateKeyDetector look for, PEM's and PuTTY's, in the part
# of a file a key file starts with.
PRIVATE_KEY = re.compile(rb"-----BEGIN[ A-Z0-9_-]{0,100}PRIVATE KEY(?: BLOCK)?-----|PuTTY-User-Key-File-\d")
KEY_HEAD_BYTES = 8192
DEFAULT_MAX_BYTES = 256 * 1024**2
# Every file is a tar member, a store entry and a hard link in each run's view, and a copy in each
# rank's working copy: a folder of tens of thousands is a dataset or a mistake, not a project.
DEFAULT_MAX_FILES = 10_000
# The working copy is the login user's alone: a shipped file keeps only its owner's bits.
PRIVATE_BITS = 0o700


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
    withheld: tuple[str, ...] = ()  # left out for looking like secrets (SECRETS)
    looped: tuple[str, ...] = ()  # links to a folder they are in: followed, they would never end

    @property
    def notes(self) -> list[str]:
        """What the console says of what was left out."""
        said = []
        if self.withheld:
            said.append(f"left out of the working directory, as they look like secrets: {', '.join(self.withheld)} "
                        "(ship them with --ship-secrets, or a '!NAME' line in the ignore file)")
        if self.looped:
            said.append(f"left out of the working directory, as links to a folder they are in: {', '.join(self.looped)}")
        return said

    @property
    def total_bytes(self) -> int:
        return sum(e.size for e in self.entries)

    def to_json(self) -> str:
        return json.dumps({"root": str(self.root), "files": [e.__dict__ for e in self.entries]}, indent=1)

    @staticmethod
    def from_json(text: str) -> Manifest:
        """The manifest ``text`` holds; ValueError saying what is wrong where it is damaged (a rank
        can write where it lies)."""
        data = untrusted.check(untrusted.loads(text), SHIPPED)
        return Manifest(Path(data["root"]), tuple(Entry(e["path"], e["sha256"], e["size"], e["mode"]) for e in data["files"]))


# What workdir.json holds: the folder shipped, and each of its files.
SHIPPED = untrusted.Obj({"root": (str,), "files": untrusted.ListOf(untrusted.Obj({"path": (str,), "sha256": untrusted.SHA256,
                                                                                  "size": (int,), "mode": (int,)}))})


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


def _looks_secret(path: str) -> bool:
    """Whether a path ends with a name of SECRETS, as many of its last parts as the name has."""
    parts = path.lower().split("/")
    return any(fnmatch.fnmatchcase("/".join(parts[-(p.count("/") + 1):]), p) for p in SECRETS)


def _secret(rules: list[tuple[bool, str]], rel: str, path: Path) -> bool:
    """Whether a file shipping so far is held back as a secret: its path in the folder, or the real
    path it reaches through links (its own, or a linked folder's), looks like one and no rule of
    the ignore file asks for it."""
    return (_looks_secret(rel) or _looks_secret(os.path.realpath(path))) and not _asked_for(rules, rel)


def _asked_for(rules: list[tuple[bool, str]], rel: str) -> bool:
    """Whether a ``!`` line of the ignore file names the file: it ships, secret or not."""
    return any(negated and _matches(p, rel, False) for negated, p in rules)


def _holds_private_key(path: Path, rules: list[tuple[bool, str]], rel: str) -> bool:
    """Whether a file that shipping so far starts like a private key, and no rule of the ignore
    file asks for it."""
    try:
        with open(path, "rb") as f:
            head = f.read(KEY_HEAD_BYTES)
    except OSError:
        return False
    return PRIVATE_KEY.search(head) is not None and not _asked_for(rules, rel)


def _too_much(root: Path, what: str, rel: str, option: str) -> UsageError:
    return UsageError(f"working directory {root} holds more than {what} to ship (at {rel})",
                      f"list what the ranks do not need in {root / IGNORE_FILES[0]}, or raise {option}")


def scan(root: Path, max_bytes: int = DEFAULT_MAX_BYTES, secrets: bool = False, max_files: int = DEFAULT_MAX_FILES) -> Manifest:
    """Every file of the folder that ships, hashed; refused before hashing when it holds too much.
    A link ships as its content, a link to a folder as the folder's files, except one to a folder
    it is in (``looped``). Names that look like secrets are left out (``withheld``) unless ``secrets``."""
    root = root.resolve()
    if not root.is_dir():
        raise UsageError(f"working directory {root} is not a directory", "pass --workdir DIR")
    rules, ignore_file = _patterns(root)
    found: list[tuple[str, Path, os.stat_result]] = []
    withheld: list[str] = []
    looped: list[str] = []
    # The real paths of the folders each folder being walked is in, itself included.
    within = {str(root): frozenset({str(root)})}
    total = 0
    for dirpath, dirnames, filenames in os.walk(root, followlinks=True):
        here = Path(dirpath)
        rel_dir = here.relative_to(root).as_posix()
        rel_dir = "" if rel_dir == "." else rel_dir + "/"
        chain = within.pop(dirpath)
        walked = []
        for d in sorted(dirnames):
            if _ignored(rules, rel_dir + d, True):
                continue
            real = os.path.realpath(here / d)
            if real in chain:
                looped.append(rel_dir + d)
                continue
            within[os.path.join(dirpath, d)] = chain | {real}
            walked.append(d)
        dirnames[:] = walked
        for name in sorted(filenames):
            rel = rel_dir + name
            if _ignored(rules, rel, False):
                continue
            if not secrets and _secret(rules, rel, here / name):
                withheld.append(rel)
                continue
            try:
                st = (here / name).stat()  # follows a link to a file: its content ships
            except OSError:
                continue  # a dangling link
            if not stat.S_ISREG(st.st_mode):
                continue
            if not secrets and _holds_private_key(here / name, rules, rel):
                withheld.append(rel)
                continue
            total += st.st_size
            if total > max_bytes:
                raise _too_much(root, f"{max_bytes / 1024**2:.0f} MiB", rel, "--max-workdir-mb")
            if len(found) >= max_files:
                raise _too_much(root, f"{max_files} files", rel, "--max-workdir-files")
            found.append((rel, here / name, st))
    entries = tuple(Entry(rel, sha256_file(p), st.st_size, stat.S_IMODE(st.st_mode)) for rel, p, st in found)
    return Manifest(root, entries, ignore_file, tuple(withheld), tuple(looped))


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
        _copy_private(store / e.sha256, tmp, e.mode & PRIVATE_BITS)
        if sha256_file(tmp) != e.sha256:
            tmp.unlink()
            raise EdgetrainError(f"{store / e.sha256} in the node's file store is damaged", f"remove it; the next run ships {e.path} again")
        os.replace(tmp, target)


def _copy_private(src: Path, tmp: Path, mode: int) -> None:
    """Copy into a new file of this mode; whatever was at ``tmp`` (a link a script left there) is
    replaced, never written or chmod-ed through."""
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as out, open(src, "rb") as f:
        shutil.copyfileobj(f, out)
        os.fchmod(fd, mode)


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
