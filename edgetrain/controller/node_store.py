"""A node's file store (see edgetrain.shared.workdir), kept by this program on the node itself: the
controller runs its source there with ``python3 -c`` (edgetrain.controller.shipping), so it imports
only the standard library and runs on any node Ansible can manage.

The store holds regular files named by their sha256, readable by the login user alone (0400 in a
0700 directory). A file arrives under a temporary name, is checked against its name and synced to
disk, and only then renamed in; a link or any other kind of member is refused. Every path inside
the store is reached relative to the store's own descriptor and never through a link, so no file
outside it can be written, have its mode changed or be pruned (a link in place of ``.store`` or
``.views`` is refused). A run sees only its own files: its view is a directory of hard links to
them, which its container mounts read-only instead of the store.

Commands (the first argument): ``held STORE`` - "sha256 size" of each file held; ``receive STORE``
- a tar on stdin; ``view STORE VIEW`` - the sha256 names on stdin become VIEW; ``prune RUNS_DIR
KEEP...`` - views of runs not kept, then the files no view links to.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
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
        # Two stagings of one view may run at once (two inventory names for one machine): whatever
        # the other removed or linked first is taken as done, where it is the store's own file.
        for name in os.listdir(view_fd):
            if name not in digests:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=view_fd)
        for digest in sorted(digests):
            if not DIGEST.match(digest):
                raise Refused(f"{digest}: not a sha256")
            try:
                kept = os.stat(digest, dir_fd=store_fd, follow_symlinks=False)
            except FileNotFoundError:
                raise Refused(f"{digest} left {store} while the run was staged (pruned?)") from None
            if not stat.S_ISREG(kept.st_mode):
                raise Refused(f"{digest} in {store} is not a regular file")
            with contextlib.suppress(FileNotFoundError):
                os.unlink(digest, dir_fd=view_fd)
            try:
                os.link(digest, digest, src_dir_fd=store_fd, dst_dir_fd=view_fd, follow_symlinks=False)
            except FileExistsError:
                there = os.stat(digest, dir_fd=view_fd, follow_symlinks=False)
                if (there.st_dev, there.st_ino) != (kept.st_dev, kept.st_ino):
                    raise
        os.fsync(view_fd)
    finally:
        os.close(store_fd)
        os.close(view_fd)


def _old(st: os.stat_result, now: float) -> bool:
    return now - st.st_mtime > GRACE_SECONDS


def _own_dir(parent: str, name: str) -> int | None:
    """The descriptor of a directory of the store's own (``.views``, ``.store``), None when there is
    none; a link in its place is refused, not followed."""
    try:
        return os.open(os.path.join(parent, name), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    except NotADirectoryError:
        raise Refused(f"{os.path.join(parent, name)} is not a directory (a link?): not pruned") from None


def _remove(dir_fd: int, name: str, st: os.stat_result) -> None:
    """Remove an entry and, for a directory, what it holds, each reached by descriptor, never through
    a link (shutil.rmtree takes dir_fd only from Python 3.11; Ubuntu jammy's nodes have 3.10)."""
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(name, dir_fd=dir_fd)
        return
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=dir_fd)
    try:
        for inner in os.listdir(fd):
            _remove(fd, inner, os.stat(inner, dir_fd=fd, follow_symlinks=False))
    finally:
        os.close(fd)
    os.rmdir(name, dir_fd=dir_fd)


def _pruned(runs_dir: str, name: str, now: float, unused) -> list[os.stat_result]:
    """Remove each entry of ``runs_dir/name`` older than the grace that ``unused(entry, its lstat)``
    says no run needs; the lstat of each removed."""
    fd = _own_dir(runs_dir, name)
    removed: list[os.stat_result] = []
    if fd is None:
        return removed
    try:
        for entry in os.listdir(fd):
            st = os.stat(entry, dir_fd=fd, follow_symlinks=False)
            if unused(entry, st) and _old(st, now):
                _remove(fd, entry, st)
                removed.append(st)
    finally:
        os.close(fd)
    return removed


def prune(runs_dir: str, keep: set[str], now: float) -> tuple[int, int, int]:
    """Remove the views of runs not in ``keep``, then every file of the store no view links to
    (and leftovers of interrupted transfers). (files removed, bytes freed, views removed)."""
    views = _pruned(runs_dir, VIEWS, now, lambda run_id, st: run_id not in keep)
    files = _pruned(runs_dir, STORE, now, lambda name, st: not (stat.S_ISREG(st.st_mode) and DIGEST.match(name) and st.st_nlink > 1))
    return len(files), sum(st.st_size for st in files), len(views)


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
