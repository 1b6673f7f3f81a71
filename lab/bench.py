"""Allreduce bandwidth between two provisioned testbed nodes, over their (shaped) links."""

from __future__ import annotations

import json
from pathlib import Path

from .testbed import Testbed

SCRIPT = Path(__file__).with_name("allreduce.py")
DEFAULT_SIZES = (1 << 20, 4 << 20, 16 << 20, 64 << 20)


def line_rate_mb_s(bed: Testbed) -> float:
    """What a node's shaped link carries, in MB/s."""
    assert bed.state.link_mbit, "the testbed's links are not shaped"
    return bed.state.link_mbit / 8


def allreduce_bandwidth(bed: Testbed, python: str, sizes=DEFAULT_SIZES, nodes: int = 2) -> list[dict]:
    """Run allreduce.py on the first ``nodes`` nodes, started as the MPI user on head.

    UCX_TLS=tcp,self keeps UCX off shared memory (all nodes share one kernel): every byte between
    ranks crosses the veth links.
    """
    hosts = ",".join(n.name for n in bed.state.nodes[:nodes])
    cmd = (f"mpirun -hosts {hosts} -n {nodes} -iface eth0 -genv UCX_TLS tcp,self "
           f"{python} {SCRIPT} {' '.join(map(str, sizes))}")
    out = bed.as_mpi_user(bed.state.head, cmd, timeout=300)
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
