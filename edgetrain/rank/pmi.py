"""Tell Hydra that a rank ends on purpose, without MPI_Finalize.

Ranks end with ``os._exit`` after a final collective, because MPI_Finalize can hang for good with
MPICH 4.0.2's ch4:ucx over TCP (edgetrain.rank.worker). That skips PMI's own finalize, and Hydra's proxy
takes a PMI connection that closes without it for a rank that died: it records exit status 1 for
the rank "in case the application does not return a non-zero exit status" and kills the node's other
processes (MPICH's ``pmip_cb.c``). Whether mpirun then called a finished run clean depended on which
the proxy noticed first, the exit or the closed socket: 16 of 26 multi-node runs on the testbed ended
with mpirun exiting 1 or 255 after every rank had finished, and the preflight probe failed twice in a
row once. So a rank sends what MPI_Finalize would have sent Hydra last - PMI-1's ``cmd=finalize``,
answered with ``cmd=finalize_ack`` - and nothing else of it.
"""

from __future__ import annotations

import os
import select
import time

FINALIZE = b"cmd=finalize\n"
ACK = b"cmd=finalize_ack"


def finalize(timeout: float = 5.0) -> bool:
    """Finalize this process's PMI connection (``PMI_FD``, as Hydra hands it over); True once Hydra
    acknowledged. Without Hydra, or when it does not answer in time, nothing else happens."""
    raw = os.environ.get("PMI_FD")
    if raw is None or not raw.isdigit():
        return False
    fd = int(raw)
    deadline = time.monotonic() + timeout
    try:
        os.write(fd, FINALIZE)
        got = b""
        while ACK not in got:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return False
            block = os.read(fd, 1024)
            if not block:
                return False
            got += block
    except OSError:
        return False
    return True


def abort(code: int) -> bool:
    """End the whole job through Hydra (PMI-1's ``cmd=abort``), for a failed rank of a strategy
    that never initialized MPI (torch, tf-multiworker): its plain exit does not end the others,
    which would wait in their rendezvous or collective for as long as their framework allows.
    True once sent; without Hydra, nothing happens."""
    raw = os.environ.get("PMI_FD")
    if raw is None or not raw.isdigit():
        return False
    try:
        os.write(int(raw), f"cmd=abort exitcode={code}\n".encode())
    except OSError:
        return False
    return True
