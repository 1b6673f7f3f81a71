"""An mpi4py probe of the ranks a run would use: ``mpirun -n N python -m edgetrain.rank.probe``.

Each rank reports where it runs and what it runs with; one allreduce proves the ranks can talk.
Rank 0 prints the whole picture as one JSON line. Versions come from package metadata, so the
probe starts in a second instead of importing TensorFlow.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import sys
from importlib import metadata

from mpi4py import MPI

from edgetrain.rank import pmi

TF_DISTRIBUTIONS = ("tensorflow-cpu", "tensorflow", "tensorflow-cpu-aws")


def _version(*names: str) -> str | None:
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return None


def main() -> None:
    comm = MPI.COMM_WORLD
    me = {
        "rank": comm.rank,
        "host": socket.gethostname(),
        "arch": platform.machine(),
        "mpi": " ".join(MPI.Get_library_version().split("\n")[0].split()),
        "tensorflow": _version(*TF_DISTRIBUTIONS),
        "horovod": _version("horovod"),
        "mpi4py": _version("mpi4py"),
        "torch": _version("torch"),
    }
    total = comm.allreduce(comm.rank + 1, op=MPI.SUM)
    everyone = comm.gather(me, root=0)
    if comm.rank == 0:
        n = comm.size
        print(json.dumps({"size": n, "allreduce_ok": total == n * (n + 1) // 2, "ranks": everyone}), flush=True)
    # Ended like the training ranks, after a barrier and without MPI_Finalize, which can hang
    # with MPICH 4.0.2's ch4:ucx over TCP (see edgetrain.rank.worker), but with Hydra told (edgetrain.rank.pmi).
    comm.Barrier()
    sys.stdout.flush()
    pmi.finalize()
    os._exit(0)


if __name__ == "__main__":
    main()
