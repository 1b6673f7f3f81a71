"""Horovod's Gloo controller and collectives for ranks that mpirun started.

``horovodrun --gloo`` runs an HTTP rendezvous server and hands every process its rank, local and
cross rank in the environment. edgetrain launches with mpirun, so its ranks do that themselves
before the program runs: they exchange their cluster addresses over MPI (mpi4py), rank 0 starts
Horovod's own ``RendezvousServer`` with Horovod's host assignment, and every rank gets the
variables horovodrun would have given it. (Horovod 0.28 can also build a Gloo context from MPI,
but only with the MPI controller, and then its Gloo collectives crash on a null context.)

Why Gloo on CPU nodes at all: its TCP transport sleeps while it waits for a peer, MPICH's ch4:ucx
polls. On an emulated Pi 4 the polling took the CPU the training needed (docs/scaling-history.md).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import MutableMapping

from edgetrain.shared import mpi
from edgetrain.shared.strategies import GLOO_ADDR as ADDR
from edgetrain.shared.strategies import GLOO_IFACE as IFACE
from edgetrain.shared.strategies import GLOO_PORT as PORT
from edgetrain.shared.strategies import HOROVOD_CONTROLLER as CONTROLLER
from edgetrain.shared.strategies import HOROVOD_OPERATIONS as OPERATIONS


def wanted(env: MutableMapping[str, str]) -> bool:
    """Gloo asked for, several ranks, and no rendezvous given (horovodrun's own ranks have one)."""
    return env.get(CONTROLLER) == "gloo" and ADDR not in env and mpi.rank_and_size(env)[1] > 1


def serve(address: str, plan: list):
    """Horovod's rendezvous (its HTTP key-value store) for ``plan``, on ``address`` alone and a port
    the kernel picks; it answers from a daemon thread. Horovod's own RendezvousServer listens on
    every address of the node, reachable from any network the node is on."""
    from horovod.runner.http.http_server import RendezvousHandler, RendezvousHTTPServer

    server = RendezvousHTTPServer((address, 0), RendezvousHandler, 0)
    server.init(plan)
    threading.Thread(target=server.serve_forever, daemon=True, name="rendezvous").start()
    return server


def _gloo_built() -> bool:
    import horovod.tensorflow as hvd

    return bool(hvd.gloo_built())


def set_up(env: MutableMapping[str, str] = os.environ):
    """Give this rank Horovod's Gloo variables; collective: every rank of the launch calls it.

    Returns rank 0's rendezvous server (it serves from a daemon thread), else None. A Horovod
    built without Gloo keeps MPI, with one line on rank 0's stderr. Gloo and the rendezvous listen
    on the cluster interface (HOROVOD_GLOO_IFACE) only; without one named, nothing starts."""
    if not wanted(env):
        return None
    if not env.get(IFACE):
        raise RuntimeError(f"Gloo asked for without {IFACE}: it would listen on every address of the node "
                           "(set edgetrain_iface in the inventory)")
    if not _gloo_built():
        for name in (CONTROLLER, OPERATIONS):
            env.pop(name, None)
        if mpi.rank_and_size(env)[0] == 0:
            print("edgetrain: this Horovod was built without Gloo: its collectives use MPI, which polls "
                  "while it waits (rebuild Horovod without HOROVOD_WITHOUT_GLOO)", file=sys.stderr)
        return None
    from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts
    from horovod.runner.gloo_run import create_slot_env_vars
    from horovod.runner.util.network import get_driver_ip
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    addresses = comm.allgather(get_driver_ip([env[IFACE]]))
    # mpirun fills hosts in machinefile order, a host's ranks together: Horovod's assignment of
    # the same host:count list numbers them the same way (checked below, not assumed).
    counts: dict[str, int] = {}
    for address in addresses:
        counts[address] = counts.get(address, 0) + 1
    plan = get_host_assignments(parse_hosts(",".join(f"{a}:{n}" for a, n in counts.items())), comm.size)
    if [(s.rank, s.hostname) for s in plan] != list(enumerate(addresses)):
        raise RuntimeError(f"ranks are not grouped by host in rank order ({addresses}): Gloo's rendezvous cannot number them")
    server = serve(addresses[0], plan) if comm.rank == 0 else None
    port = comm.bcast(server.server_address[1] if server else None, root=0)
    env.update(create_slot_env_vars(plan[comm.rank]))
    env.update({ADDR: addresses[0], PORT: str(port)})
    return server
