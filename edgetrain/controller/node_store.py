"""A node's file store (see edgetrain.shared.workdir), kept by this program on the node itself: the
controller runs its source there with ``python3 -c`` (edgetrain.controller.shipping), so it imports
only the standard library and runs on any node Ansible can manage.

The store holds regular files named by their sha256, readable by the login user alone (0400 in a
0700 directory). A file arrives under a temporary name, is checked against its name and synced to
disk, and only then renamed in; a link or any other kind of member is refused. Every path inside
the store is reached relative to the store's own descriptor and never through a link, so no file
outside it can be written or have its mode changed. A run sees only its own files: its view is a
directory of hard links to them, which its container mounts read-only instead of the store.

Commands (the first argument): ``held STORE`` - "sha256 size" of each file held; ``receive STORE``
- a tar on stdin; ``view STORE VIEW`` - the sha256 names on stdin become VIEW; ``prune RUNS_DIR
KEEP...`` - views of runs not kept, then the files no view links to.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import sys
import tarfile
import time

DIGEST = re.compile(r"[0-9a-f]{64}\Z")
FILE_MODE = 0o400
DIR_MODE = 0o700
STORE = ".store"
VIEWS = ".views"
INCOMING = ".incoming-"
# A view or file this young may belong to a run being staged right now (shipped, its view not yet
# made or its container not yet started): pruning leaves it.
GRACE_SECONDS = 3600
CHUNK = 1024 * 1024


class Refused(Exception):
    """What the store will not take, in one line."""


def private_dir(path: str) -> int:
    """The directory, created if missing, made the login user's alone; its descriptor. A link
    in its place is refused, not followed."""
    os.makedirs(path, exist_ok=True)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except NotADirectoryError:
        raise Refused(f"{path} is not a directory (a link?)") from None
    os.fchmod(fd, DIR_MODE)
    return fd


def held(store: str) -> list[tuple[str, int]]:
    """(sha256, size) of each regular file in the store; a link or anything else is not held."""
    fd = private_dir(store)
    try:
        found = []
        for name in os.listdir(fd):
            if DIGEST.match(name):
                st = os.stat(name, dir_fd=fd, follow_symlinks=False)
                if stat.S_ISREG(st.st_mode):
                    found.append((name, st.st_size))
        return found
    finally:
        os.close(fd)


def _take(store_fd: int, digest: str, source) -> None:
    """One file into the store: written beside its place, checked, synced, renamed in."""
    tmp = f"{INCOMING}{digest}.{os.getpid()}"
    try:
        os.unlink(tmp, dir_fd=store_fd)  # a killed receiver's leftover
    except FileNotFoundError:
        pass
    out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, FILE_MODE, dir_fd=store_fd)
    try:
        sha = hashlib.sha256()
        with os.fdopen(out, "wb") as f:
            for block in iter(lambda: source.read(CHUNK), b""):
                sha.update(block)
                f.write(block)
            f.flush()
            os.fsync(f.fileno())
        if sha.hexdigest() != digest:
            raise Refused(f"{digest}: its content does not match its name")
        os.replace(tmp, digest, src_dir_fd=store_fd, dst_dir_fd=store_fd)
    except BaseException:
        try:
            os.unlink(tmp, dir_fd=store_fd)
        except FileNotFoundError:
            pass
        raise


def receive(store: str, stream) -> int:
    """Every member of the tar on ``stream`` into the store; how many. Only regular files named
    by a sha256 are taken; the store's directory is synced once they are in."""
    fd = private_dir(store)
    count = 0
    try:
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            for member in tar:
                if not (member.isreg() and DIGEST.match(member.name)):
                    raise Refused(f"{member.name}: not a regular file named by its sha256")
                _take(fd, member.name, tar.extractfile(member))
                count += 1
        os.fsync(fd)
    finally:
        os.close(fd)
    return count


def view(store: str, view_dir: str, digests: set[str]) -> None:
    """Make ``view_dir`` hold exactly these files of the store, as hard links."""
    store_fd, view_fd = private_dir(store), private_dir(view_dir)
    try:
        for name in os.listdir(view_fd):
            if name not in digests:
                os.unlink(name, dir_fd=view_fd)
        for digest in sorted(digests):
            if not DIGEST.match(digest):
                raise Refused(f"{digest}: not a sha256")
            try:
                if not stat.S_ISREG(os.stat(digest, dir_fd=store_fd, follow_symlinks=False).st_mode):
                    raise Refused(f"{digest} in {store} is not a regular file")
            except FileNotFoundError:
                raise Refused(f"{digest} left {store} while the run was staged (pruned?)") from None
            try:
                os.unlink(digest, dir_fd=view_fd)
            except FileNotFoundError:
                pass
            os.link(digest, digest, src_dir_fd=store_fd, dst_dir_fd=view_fd, follow_symlinks=False)
        os.fsync(view_fd)
    finally:
        os.close(store_fd)
        os.close(view_fd)


def _old(st: os.stat_result, now: float) -> bool:
    return now - st.st_mtime > GRACE_SECONDS


def _remove(parent: str, name: str, st: os.stat_result) -> None:
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(os.path.join(parent, name))  # never follows a link inside
    else:
        os.unlink(os.path.join(parent, name))


def prune(runs_dir: str, keep: set[str], now: float) -> tuple[int, int, int]:
    """Remove the views of runs not in ``keep``, then every file of the store no view links to
    (and leftovers of interrupted transfers). (files removed, bytes freed, views removed)."""
    views, store = os.path.join(runs_dir, VIEWS), os.path.join(runs_dir, STORE)
    dropped = 0
    if os.path.isdir(views):
        for run_id in os.listdir(views):
            st = os.stat(os.path.join(views, run_id), follow_symlinks=False)
            if run_id not in keep and _old(st, now):
                _remove(views, run_id, st)
                dropped += 1
    files = freed = 0
    if os.path.isdir(store):
        for name in os.listdir(store):
            st = os.stat(os.path.join(store, name), follow_symlinks=False)
            linked = stat.S_ISREG(st.st_mode) and DIGEST.match(name) and st.st_nlink > 1
            if not linked and _old(st, now):
                _remove(store, name, st)
                files, freed = files + 1, freed + st.st_size
    return files, freed, dropped


def main(argv: list[str]) -> int:
    os.umask(0o077)
    command, *args = argv
    try:
        if command == "held":
            print("".join(f"{d} {size}\n" for d, size in held(args[0])), end="")
        elif command == "receive":
            print(receive(args[0], sys.stdin.buffer))
        elif command == "view":
            view(args[0], args[1], set(sys.stdin.read().split()))
        elif command == "prune":
            print(*prune(args[0], set(args[1:]), time.time()))
        else:
            raise Refused(f"no command {command}")
    except (Refused, OSError, tarfile.TarError) as exc:
        print(f"file store: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
