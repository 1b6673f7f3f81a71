"""Shipping the script's project folder to a node's store (edgetrain.shared.workdir lists it and
materializes it in each rank; edgetrain.controller.node_store keeps the store on the node): only the
files the store lacks are sent, each as its content (a link in the folder ships what it points to),
checked against its sha256 name on arrival, and each run is given a view of its own files."""

from __future__ import annotations

import inspect
import os
import stat
import subprocess
import sys
import tarfile
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from edgetrain.controller import containers, node_store
from edgetrain.controller.inventory import Host
from edgetrain.controller.remote import UNREACHABLE, Nodes
from edgetrain.shared.errors import EdgetrainError
from edgetrain.shared.workdir import Entry, Manifest

NODE_STORE = inspect.getsource(node_store)
# A node that accepts no byte of the stream for this long is taken for stuck (a dark link ends
# ssh itself within ~15 s: see remote.ssh_command).
STALL_SECONDS = 60.0
STDERR_KEPT = 4096  # bytes of the node's stderr kept, for the error message


@dataclass(frozen=True)
class Shipped:
    host: str
    files: int
    bytes: int
    seconds: float


@dataclass(frozen=True)
class Pruned:
    host: str
    files: int
    bytes: int
    views: int


def node_command(host: Host, *args: str) -> list[str]:
    """edgetrain.controller.node_store on the node, with these arguments."""
    return [sys.executable if host.is_local else "python3", "-c", NODE_STORE, *args]


class _Stream:
    """The stdin of a process on a node, for tarfile: a watchdog kills the process when one write
    waits over ``stall`` seconds or the whole transfer takes over ``timeout``, which ends the
    write; the process's stderr is read all along (its last lines kept), so it never fills a pipe
    that nobody reads and stops the node from reading."""

    def __init__(self, argv: list[str], timeout: float, stall: float) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        self.timeout, self.stall = timeout, stall
        self.start = self.since = time.monotonic()
        self.writing = False
        self.expired: str | None = None  # why the watchdog ended it
        self.tail = b""
        self._drain = threading.Thread(target=self._read_stderr, daemon=True)
        self._drain.start()
        self._watch = threading.Thread(target=self._watchdog, daemon=True)
        self._watch.start()

    def _read_stderr(self) -> None:
        assert self.proc.stderr is not None
        for chunk in iter(lambda: self.proc.stderr.read(STDERR_KEPT), b""):  # type: ignore[union-attr]
            self.tail = (self.tail + chunk)[-STDERR_KEPT:]

    def _watchdog(self) -> None:
        while self.proc.poll() is None:
            now = time.monotonic()
            if now - self.start > self.timeout:
                self.expired = f"took over {self.timeout:.0f} s"
            elif self.writing and now - self.since > self.stall:
                self.expired = f"accepted nothing for {self.stall:.0f} s"
            if self.expired:
                self.proc.kill()
                return
            time.sleep(min(0.2, self.stall / 4))

    def write(self, data: bytes) -> int:
        assert self.proc.stdin is not None
        self.since, self.writing = time.monotonic(), True
        try:
            self.proc.stdin.write(data)
        finally:
            self.writing = False
        return len(data)

    def close(self) -> tuple[int, str]:
        """End the input and wait for the process: its status and the last line of its stderr."""
        assert self.proc.stdin is not None
        try:
            self.proc.stdin.close()
        except BrokenPipeError:
            pass  # the node ended the transfer: its status says why
        code = self.proc.wait()  # the watchdog bounds this wait too
        self._drain.join(timeout=5)
        return code, (self.tail.decode(errors="replace").strip().splitlines() or [f"exit status {code}"])[-1]


def _add(tar: tarfile.TarFile, root, digest: str, e: Entry) -> None:
    """One file into the archive as its content under its sha256 name: a link is read through,
    never sent as a link."""
    fd = os.open(root / e.path, os.O_RDONLY | os.O_NONBLOCK)  # a fifo put there since the scan must not block
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise EdgetrainError(f"{e.path} in {root} is no longer a regular file", "run again")
        info = tarfile.TarInfo(digest)
        info.size, info.mode = e.size, node_store.FILE_MODE
        tar.addfile(info, f)


def _held(nodes: Nodes, host: Host, store: str) -> set[tuple[str, int]]:
    listing = nodes.check(host, node_command(host, "held", store), f"listing the file store {store}")
    return {(d, int(size)) for d, size in (line.split() for line in listing.splitlines())}


def ship(nodes: Nodes, host: Host, store: str, manifest: Manifest, timeout: float = 1800,
         stall: float = STALL_SECONDS) -> Shipped:
    """Send a node's store the files it lacks; what it already holds whole is not sent again."""
    start = time.monotonic()
    held = _held(nodes, host, store)
    missing: dict[str, Entry] = {}
    for e in manifest.entries:
        if (e.sha256, e.size) not in held:  # a file cut short (a zero-length one) is not held
            missing.setdefault(e.sha256, e)
    if missing:
        stream = _Stream(nodes.argv(host, node_command(host, "receive", store)), timeout, stall)
        try:
            with tarfile.open(fileobj=stream, mode="w|") as tar:  # type: ignore[call-overload]
                for digest, e in missing.items():
                    _add(tar, manifest.root, digest, e)
        except BrokenPipeError:
            pass  # the node ended the transfer: its status says why
        except BaseException as exc:
            stream.proc.kill()
            stream.close()
            if isinstance(exc, OSError):
                raise EdgetrainError(f"shipping the working directory to {host.name} failed: {exc}",
                                     f"a file of {manifest.root} changed while it was shipped; run again") from None
            raise
        code, last = stream.close()
        if stream.expired:
            raise EdgetrainError(f"shipping the working directory to {host.name} {stream.expired}",
                                 "check the node's link, or make the folder smaller")
        if code != 0:
            fix = "check that the node is up and reachable" if code == UNREACHABLE else "check the node's free disk"
            raise EdgetrainError(f"shipping the working directory to {host.name} failed: {last}", fix)
    return Shipped(host.name, len(missing), sum(e.size for e in missing.values()), time.monotonic() - start)


def give_view(nodes: Nodes, host: Host, store: str, view: str, manifest: Manifest) -> None:
    """The run's view of the store on a node: its own files, and nothing else the store holds."""
    nodes.check(host, node_command(host, "view", store, view), "giving the run its files",
                "run again (the file store was pruned meanwhile?)", input="".join(f"{e.sha256}\n" for e in manifest.entries))


def prune(nodes: Nodes, host: Host, runs_dir: str, keep: set[str]) -> Pruned:
    """Remove from a node's store what no run in ``keep`` uses (edgetrain.controller.node_store.prune)."""
    out = nodes.check(host, node_command(host, "prune", runs_dir, *sorted(keep)), f"pruning the file store in {runs_dir}")
    files, freed, views = (int(x) for x in out.split())
    return Pruned(host.name, files, freed, views)


def prune_stores(nodes: Nodes, hosts: Sequence[Host], runs_dir: str, live: set[str]) -> list[Pruned]:
    """Prune the store of every node (``edgetrain clean --store``): a run whose container is still
    on a node, or that a command here holds (``live``), keeps its files; the host runtime's store
    is the one beside this machine's run directories (``runs_dir``, absolute)."""
    def one(host: Host) -> Pruned:
        if host.runtime == "docker":
            return prune(nodes, host, host.runs_dir, live | set(containers.leftovers(nodes, host).values()))
        return prune(nodes, host, runs_dir, live)

    seen: set[tuple[str, str]] = set()
    targets = []
    for h in hosts:
        key = ("this machine" if h.is_local else h.name, h.runs_dir if h.runtime == "docker" else runs_dir)
        if key not in seen:
            seen.add(key)
            targets.append(h)
    with ThreadPoolExecutor(max_workers=min(16, len(targets) or 1)) as pool:
        return list(pool.map(one, targets))
