"""A container's lease: ``python -m edgetrain.rank.lease FILE SECONDS STATE -- COMMAND...``, the
container's command (under Docker's ``--init``), which runs COMMAND (the container's sshd) for as
long as the lease holds.

The controller renews FILE every few seconds while it runs (edgetrain.controller.containers); the
ranks see it through a read-only mount, so none of them can renew it. When it has not changed for
SECONDS - the controller was killed, lost power, or lost the link to this node - COMMAND is ended,
and with it the container and every rank in it (containers run with --rm, so nothing is left). The
node needs nobody to come back and clean up.

It fails closed: a FILE missing at the start (the controller died before it was made) or gone
later, and any error of the watcher itself, end COMMAND just the same. Time is measured on this
node's monotonic clock, from the moment the watcher saw FILE change: a Pi without a real-time clock
steps its wall clock at NTP sync, and a lease read as ``now - mtime`` would then run out at once or
never.

The watcher keeps in STATE (a path of the container's own, which no rank can write) when it last
saw FILE change, on that clock, and ``python -m edgetrain.rank.lease --age STATE`` prints the
seconds since: ``edgetrain clean`` judges a lease by the very clock the watcher ends it by.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from edgetrain.shared import runs

GRACE_S = 10.0  # COMMAND's time to end on SIGTERM before SIGKILL


def stamp(path: str) -> tuple[int, int, int] | None:
    """What changes when the controller renews the lease (its touch), or None once FILE is gone."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return st.st_mtime_ns, st.st_ino, st.st_ctime_ns


def record(state: str, renewed: float) -> None:
    """Keep the monotonic time of the last renewal seen in ``state``, as a new file renamed in. One
    that cannot be written (a full disk) is removed instead: its lease is then unreadable, and
    ``clean`` keeps the container rather than judge it by a stale renewal."""
    try:
        # Not durable: the state dies with the container, and a Pi's SD card need not sync it
        # at every renewal.
        runs.write_anew(Path(state), f"{renewed!r}\n".encode(), durable=False)
    except OSError:
        Path(state).unlink(missing_ok=True)


def age(state: str) -> float:
    """Seconds since the watcher last saw its lease renewed, on this node's monotonic clock."""
    with open(state) as f:
        return time.monotonic() - float(f.read())


def watch(path: str, limit: float, child: subprocess.Popen[bytes], poll: float, state: str, name: str) -> str:
    """Wait while the lease holds and COMMAND runs, keeping the last renewal in ``state``; returns
    why the wait ended."""
    seen, renewed = stamp(path), time.monotonic()
    record(state, renewed)
    while child.poll() is None:
        now = stamp(path)
        if now is None:
            return f"lease {path} is gone"
        if now != seen:
            seen, renewed = now, time.monotonic()
            record(state, renewed)
        elif time.monotonic() - renewed > limit:
            return f"lease {path} not renewed for {limit:.0f} s: the controller is gone"
        time.sleep(poll)
    return f"{name} ended with status {child.returncode}"


def end(child: subprocess.Popen) -> None:
    if child.poll() is None:
        child.terminate()
        try:
            child.wait(timeout=GRACE_S)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) == 2 and args[0] == "--age":
        try:
            print(f"{age(args[1]):.1f}")
        except (OSError, ValueError) as exc:
            print(f"edgetrain: lease state {args[1]} cannot be read: {exc}", file=sys.stderr)
            return 1
        return 0
    if len(args) < 5 or args[3] != "--":
        print("usage: python -m edgetrain.rank.lease FILE SECONDS STATE -- COMMAND...\n"
              "       python -m edgetrain.rank.lease --age STATE", file=sys.stderr)
        return 2
    path, limit, state, command = args[0], float(args[1]), args[2], args[4:]
    if stamp(path) is None:
        print(f"edgetrain: lease {path} does not exist: not starting {command[0]}", file=sys.stderr, flush=True)
        return 1
    # Docker stops a container with SIGTERM to its command: COMMAND gets it through end().
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    child = subprocess.Popen(command)
    try:
        why = watch(path, limit, child, poll=min(5.0, limit / 4), state=state, name=command[0])
    except SystemExit:
        why = "asked to stop"
        raise
    except BaseException as exc:
        why = f"the lease watcher failed ({type(exc).__name__}: {exc})"
        raise
    finally:
        print(f"edgetrain: {why}; stopping this container", file=sys.stderr, flush=True)
        end(child)
    return 1 if child.returncode != 0 else 0


if __name__ == "__main__":
    sys.exit(main())
