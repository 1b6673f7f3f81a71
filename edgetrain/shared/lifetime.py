"""A process that must not outlive its parent."""

from __future__ import annotations

import ctypes
import signal

PR_SET_PDEATHSIG = 1  # linux/prctl.h
# Loaded now: a child between fork and exec (preexec_fn) must not dlopen, another thread of its
# parent may have held the loader's lock at the fork.
_LIBC = ctypes.CDLL(None, use_errno=True)


def end_with_parent(sig: signal.Signals) -> None:
    """Have the kernel send ``sig`` to this process when its parent ends, however it ends (a
    SIGKILL included). The kernel forgets it when the process changes user: call it after that."""
    _LIBC.prctl(PR_SET_PDEATHSIG, sig)
