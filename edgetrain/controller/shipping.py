"""Shipping the script's project folder to a node's store (edgetrain.shared.workdir lists it and
materializes it in each rank): only the files the store lacks are sent, each checked against its
sha256 name on arrival."""

from __future__ import annotations

import shlex
import subprocess
import tarfile
import time
from dataclasses import dataclass

from edgetrain.controller.inventory import Host
from edgetrain.controller.remote import UNREACHABLE, Nodes
from edgetrain.shared.errors import EdgetrainError
from edgetrain.shared.workdir import Entry, Manifest


@dataclass(frozen=True)
class Shipped:
    host: str
    files: int
    bytes: int
    seconds: float


# Receives a tar of files named by their sha256 into the store, checks each against its name, and
# only then moves it in: a file that arrives damaged never enters the store.
_RECEIVE = (
    'set -e; store={store}; mkdir -p "$store"; tmp=$(mktemp -d "$store/.incoming.XXXXXX"); '
    'trap \'rm -rf "$tmp"\' EXIT; tar -x -C "$tmp"; cd "$tmp"; '
    'if [ -n "$(ls)" ]; then ls | sed "s/.*/&  &/" | sha256sum -c --quiet - >&2; chmod 0644 -- *; mv -f -- * "$store"/; fi'
)


def ship(nodes: Nodes, host: Host, store: str, manifest: Manifest, timeout: float = 1800) -> Shipped:
    """Send a node's store the files it lacks; what it already holds is not sent again."""
    start = time.monotonic()
    listing = nodes.check(host, ["sh", "-c", f"mkdir -p {shlex.quote(store)} && ls -1 {shlex.quote(store)}"],
                          f"listing the file store {store}")
    held = set(listing.split())
    missing: dict[str, Entry] = {}
    for e in manifest.entries:
        if e.sha256 not in held:
            missing.setdefault(e.sha256, e)
    if missing:
        proc = subprocess.Popen(nodes.argv(host, ["sh", "-c", _RECEIVE.format(store=shlex.quote(store))]),
                                stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        assert proc.stdin is not None
        try:
            with tarfile.open(fileobj=proc.stdin, mode="w|") as tar:
                for digest, e in missing.items():
                    tar.add(manifest.root / e.path, arcname=digest, recursive=False)
        except BrokenPipeError:
            pass  # the node ended the transfer: its status says why
        finally:
            try:
                proc.stdin.close()
            except BrokenPipeError:
                pass
            proc.stdin = None  # closed: communicate() must not flush it
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            raise EdgetrainError(f"shipping the working directory to {host.name} took over {timeout:.0f} s",
                                 "check the node's link, or make the folder smaller") from None
        if proc.returncode != 0:
            last = (err.decode(errors="replace").strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
            fix = "check that the node is up and reachable" if proc.returncode == UNREACHABLE else "check the node's free disk"
            raise EdgetrainError(f"shipping the working directory to {host.name} failed: {last}", fix)
    return Shipped(host.name, len(missing), sum(e.size for e in missing.values()), time.monotonic() - start)
