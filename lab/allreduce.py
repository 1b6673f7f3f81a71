"""MPI_Allreduce timing between the ranks of one mpirun; rank 0 prints one JSON line per size.

Run from inside a node (Hydra's proxies must be able to call mpirun back), e.g.
    mpirun -hosts node1,node2 -n 2 -genv UCX_TLS tcp,self python allreduce.py 1048576 16777216
"""

import json
import sys
import time

import numpy as np
from mpi4py import MPI


def main() -> None:
    comm = MPI.COMM_WORLD
    iters = 5
    for size in map(int, sys.argv[1:]):
        send = np.full(size // 4, comm.rank + 1, dtype=np.float32)
        recv = np.empty_like(send)
        comm.Allreduce(send, recv, op=MPI.SUM)  # warm-up: connection setup and buffer registration
        expected = comm.size * (comm.size + 1) / 2
        if not np.all(recv == expected):
            raise SystemExit(f"allreduce returned {recv[:4]}, expected {expected}")
        comm.Barrier()
        start = time.perf_counter()
        for _ in range(iters):
            comm.Allreduce(send, recv, op=MPI.SUM)
        elapsed = comm.allreduce(time.perf_counter() - start, op=MPI.MAX) / iters
        if comm.rank == 0:
            hosts = sorted(set(comm.gather(MPI.Get_processor_name()) or ()))  # None on the other ranks
            # With 2 ranks every algorithm moves the whole buffer across the link once each way.
            print(json.dumps({"bytes": size, "seconds": elapsed, "mb_per_s": size / elapsed / 1e6,
                              "iters": iters, "ranks": comm.size, "hosts": hosts}), flush=True)
        else:
            comm.gather(MPI.Get_processor_name())


if __name__ == "__main__":
    main()
