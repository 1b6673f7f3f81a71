"""A rank's keeper: the process Hydra starts runs the rank in a child and says how it ended.

A rank that a signal ends - the kernel's out-of-memory killer, a crash in a native library, a
``kill -9`` - writes nothing, and Hydra's report does not reliably name it: its proxy ends the
node's other ranks with SIGKILL as soon as it sees one go, then reports the lowest rank whose
status is not 0, which under load can be one it killed itself (MPICH 4.0.2: rank 1 killed in
``hvd.init`` beside another training, Hydra named rank 0 in 2 runs of 6). So the worker forks
first thing (``keep``): the child is the rank, the parent its keeper, which waits for it and, when
a signal ends it that did not come for both, writes the rank's failure record, then ends by the
same signal. Hydra watches the keeper - its exit, its output pipes and its PMI connection, all
open until it ends - so it ends the other ranks only after the record is written.

Both stay in the process group Hydra made for the rank: what Hydra and mpirun send to end a run
(Ctrl-C, a SIGTERM, its cleanup's SIGKILL) reaches the rank, anything the rank started, and the
keeper at once. The keeper takes note of such a signal rather than dying of it, and a rank it
ended is not a failure; a keeper ended without its rank takes it along (the kernel's parent-death
signal).
"""

from __future__ import annotations

import os
import resource
import signal
import socket
import sys
from pathlib import Path

from edgetrain.shared import failures, lifetime

# What Hydra passes on to a rank's process group (mpirun's Ctrl-C, a SIGTERM, the SIGUSR1/2 it
# forwards): each would end the keeper by default, and a rank ended by it has not failed.
ENDING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)

# What usually sends each signal to a rank that did not ask for it.
LIKELY_CAUSE = {
    signal.SIGKILL: "on a node short of memory the kernel's out-of-memory killer sends it (`dmesg` there says "
                    "so): fewer ranks on that node, or a smaller batch",
    signal.SIGSEGV: "a native library crashed (the rank log's last lines show what it was doing)",
    signal.SIGBUS: "a native library read memory that is not there: often shared memory too small for the "
                   "ranks of a node (a container's /dev/shm) or a file truncated under it",
    signal.SIGILL: "a library was built for a CPU with instructions this node's lacks (a wheel for another "
                   "ARM or x86-64 level): install one built for this CPU",
    signal.SIGABRT: "a native library gave up (its message is in the rank log's last lines)",
    signal.SIGFPE: "a native library divided by zero or overflowed (the rank log's last lines show where)",
}


def keep(run_dir: Path, rank: int, log: Path) -> int:
    """Fork the rank off this process. In the child (the rank) this returns its keeper's pid; in
    the keeper it never returns: the keeper ends with its rank's status, or by its signal."""
    keeper = os.getpid()
    # Blocked across the fork, so that the keeper meets none before it is ready to take note.
    signal.pthread_sigmask(signal.SIG_BLOCK, ENDING)
    child = os.fork()
    if child == 0:
        lifetime.end_with_parent(signal.SIGKILL)
        if os.getppid() != keeper:  # the keeper was ended before the line above took
            os._exit(128 + signal.SIGKILL)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, ENDING)
        return keeper
    seen = _take_note()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, ENDING)
    _, status = os.waitpid(child, 0)
    if os.WIFSIGNALED(status):
        sig = signal.Signals(os.WTERMSIG(status))
        if sig not in seen:
            _record(run_dir, rank, log, sig)
        _end_by(sig)
    os._exit(os.waitstatus_to_exitcode(status))


def _take_note() -> set[signal.Signals]:
    """The ENDING signals this process receives from now on, noted instead of acted on."""
    seen: set[signal.Signals] = set()
    for sig in ENDING:
        signal.signal(sig, lambda signum, _frame: seen.add(signal.Signals(signum)))
    return seen


def failure(sig: signal.Signals) -> tuple[str, str | None]:
    """(error, fix) of a rank that ``sig`` ended."""
    return f"killed by {sig.name} (signal {sig.value})", LIKELY_CAUSE.get(sig)


def _record(run_dir: Path, rank: int, log: Path, sig: signal.Signals) -> None:
    """The rank's failure record, and its line at the end of the rank's log."""
    try:
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(fd, 1)
        os.close(fd)
        sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    except OSError:
        pass  # the line goes to Hydra's output instead; the record is what counts
    error, fix = failure(sig)
    failures.write(run_dir, rank, socket.gethostname(), error, None, fix=fix, kind=failures.Kind.SIGNAL)


def _end_by(sig: signal.Signals) -> None:
    """End this process by ``sig``, as its rank ended, so Hydra and mpirun report what they would
    have without a keeper; without a core file of its own (the rank's is the one to look at)."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if sig is not signal.SIGKILL:  # which cannot be handled, so is never anything else
        signal.signal(sig, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
    os.kill(os.getpid(), sig)
    os._exit(128 + sig.value)
