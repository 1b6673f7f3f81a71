"""A rank of the torch strategy: what torchrun gives its workers, a join check, and what the
script did with ``torch.distributed``.

Hydra starts one process per slot; each becomes what a torchrun worker is: ``MASTER_ADDR`` and
``MASTER_PORT`` (rank 0's host on the cluster interface, a port checked free before anything
started), ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``GROUP_RANK`` (the
node), ``GROUP_WORLD_SIZE``, ``ROLE_*`` and ``TORCHELASTIC_*`` as torchrun sets them, Gloo and
NCCL bound to the cluster interface, and torch's intra-op threads set to the node's cores per
local rank where a node has several - so ``init_process_group(backend)`` with ``env://`` (or
``tcp://{master_url}``) finds its peers unchanged.

Before the script runs, every rank checks in with rank 0 at MASTER_ADDR within ``JOIN_TIMEOUT_S``:
torch's own rendezvous waits 30 minutes for a peer that cannot reach rank 0 (a wrong interface, a
firewall); this names the node within a minute. The check uses the port after MASTER_PORT (both
checked free before anything started), so the script's own rank 0 binds MASTER_PORT as it would
under torchrun, whenever a rank gets there.
"""

from __future__ import annotations

import datetime
import functools
import os
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from edgetrain.shared import mpi
from edgetrain.shared.errors import EdgetrainError
from edgetrain.shared.strategies import TorchPeers, fill_placeholders

if TYPE_CHECKING:  # torch is imported where a rank joins, not by every reader of this module
    import torch.distributed

JOIN_TIMEOUT_S = 60.0
LEAVE_TIMEOUT_S = 10.0  # how long rank 0 waits at its end for the others' scripts to end
# What Hydra gives a rank and torchrun no worker: the node's ranks, which MKL (x86_64's torch) reads
# as an MPI job's and so trains a node's one rank on one thread, where torchrun's gets every core.
NOT_FROM_TORCHRUN = ("MPI_LOCALNRANKS", "MPI_LOCALRANKID")


@dataclass(frozen=True)
class Place:
    """Where this process is in the run: from Hydra's environment and the launcher's ``--peers``."""

    rank: int
    size: int
    master_addr: str
    master_port: int
    layout: tuple[tuple[str, int], ...]  # (host, its ranks) in placement order, rank 0's first

    @classmethod
    def of(cls, peers: TorchPeers, env=os.environ) -> Place:
        """This rank's place (its rank from Hydra's ``env``) in the run the launcher told of."""
        return cls(*mpi.rank_and_size(env), peers.master_addr, peers.master_port, peers.hosts)

    def _node_of(self, rank: int) -> tuple[int, int]:
        """(node index, the node's first rank)."""
        first = 0
        for node, (_, n) in enumerate(self.layout):
            if rank < first + n:
                return node, first
            first += n
        raise ValueError(f"rank {rank} is outside the placement {self.layout}")

    @property
    def node(self) -> int:
        return self._node_of(self.rank)[0]

    @property
    def local_rank(self) -> int:
        return self.rank - self._node_of(self.rank)[1]

    @property
    def local_size(self) -> int:
        return self.layout[self.node][1]

    def host_of(self, rank: int) -> str:
        return self.layout[self._node_of(rank)[0]][0]

    @property
    def join_port(self) -> int:
        return self.master_port + 1

    @property
    def master_url(self) -> str:
        return f"tcp://{self.master_addr}:{self.master_port}"

    def environment(self, iface: str | None, cores: int, given: Mapping[str, str]) -> dict[str, str]:
        """What torchrun (torch.distributed.run) gives each worker, for this place, beside what the
        rank's environment already holds (``given``)."""
        env = {
            "MASTER_ADDR": self.master_addr, "MASTER_PORT": str(self.master_port),
            "RANK": str(self.rank), "WORLD_SIZE": str(self.size),
            "LOCAL_RANK": str(self.local_rank), "LOCAL_WORLD_SIZE": str(self.local_size),
            "GROUP_RANK": str(self.node), "GROUP_WORLD_SIZE": str(len(self.layout)),
            "ROLE_NAME": "default", "ROLE_RANK": str(self.rank), "ROLE_WORLD_SIZE": str(self.size),
            "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_RUN_ID": "none",
            "TORCHELASTIC_USE_AGENT_STORE": "False", "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        }
        # torchrun sets OMP_NUM_THREADS to 1 for several workers a node, where a Pi's four cores
        # would then train one thread wide: each local rank gets its share of the cores instead.
        # With one worker a node torch picks its own default, as under torchrun: where that is
        # fewer than the node's cores (1 of 2 on the testbed's machine) the node's cores ran an
        # emulated Pi 0.70x as fast as torchrun did (docs/scaling-history.md).
        # As under torchrun, a value the user gave is kept.
        if "OMP_NUM_THREADS" not in given and self.local_size > 1:
            env["OMP_NUM_THREADS"] = str(max(1, cores // self.local_size))
        if iface:
            env["GLOO_SOCKET_IFNAME"] = env["NCCL_SOCKET_IFNAME"] = iface
        return env

    def values(self) -> dict[str, object]:
        """What the placeholders in the script's arguments stand for, on this rank."""
        return {"rank": self.rank, "local_rank": self.local_rank, "world_size": self.size,
                "master_addr": self.master_addr, "master_port": self.master_port, "master_url": self.master_url}

    def arguments(self, args: list[str]) -> list[str]:
        return [fill_placeholders(a, self.values()) for a in args]


def join(place: Place, timeout: float = JOIN_TIMEOUT_S) -> None:
    """Every rank checks in with rank 0's store at MASTER_ADDR, the port after MASTER_PORT, and
    waits for all; on a timeout the error names the ranks (and their nodes) that did not join, or -
    on a rank that could not reach rank 0 - the address it could not reach."""
    import torch.distributed as dist

    if place.size == 1:
        return
    started = time.monotonic()
    deadline = datetime.timedelta(seconds=timeout)
    try:
        store = dist.TCPStore(place.master_addr, place.join_port, place.size, place.rank == 0,
                              timeout=deadline, wait_for_workers=False)
    except (RuntimeError, OSError) as exc:
        raise EdgetrainError(f"rank {place.rank} could not reach rank 0 at {place.master_addr}:{place.join_port} "
                             f"within {timeout:.0f} s ({str(exc).splitlines()[0]})",
                             "check that every node reaches the head on the cluster interface (edgetrain_iface) "
                             "and that nothing filters the port (--master-port)") from None
    store.set(f"edgetrain/joined/{place.rank}", "1")
    store.add("edgetrain/joined", 1)
    _JOINED.append((store, place))
    if place.rank == 0:
        _await_all(store, place, timeout)
        store.set("edgetrain/go", "1")
        # The store is a server in this process: the others read 'go' before it goes away.
        until = time.monotonic() + 10
        while store.add("edgetrain/left", 0) < place.size - 1 and time.monotonic() < until:
            time.sleep(0.05)
        # Where a slow start went: before this line each node's start and edgetrain's join, after it the script's.
        print(f"edgetrain: {place.size} ranks joined rank 0 in {time.monotonic() - started:.1f} s", flush=True)
        return
    try:
        store.wait(["edgetrain/go"], deadline)
    except RuntimeError as exc:
        raise EdgetrainError(f"rank {place.rank} joined rank 0 at {place.master_addr}:{place.join_port}, but not every "
                             f"rank did within {timeout:.0f} s ({str(exc).splitlines()[0]})",
                             "see the ranks rank 0 names as missing") from None
    store.add("edgetrain/left", 1)


# The join's store and this rank's place, kept to the rank's end (leave).
_JOINED: list[tuple[torch.distributed.Store, Place]] = []


def leave(timeout: float = LEAVE_TIMEOUT_S) -> None:
    """Rank 0 stays until every other rank's script has ended, for at most ``timeout``: it holds
    torch's store, and a rank still in ``init_process_group`` when it goes fails there (torch 1.13
    sets a group's sequence number through the store after its barrier: a script that only
    initializes failed so on rank 1 in 2 runs of 10). Under torchrun the store lives in the agent,
    which outlives its workers. A rank 0 whose script ended early still goes once the time is up."""
    if not _JOINED:
        return
    store, place = _JOINED[0]
    try:
        if place.rank != 0:
            store.add("edgetrain/ended", 1)
            return
        until = time.monotonic() + timeout
        while store.add("edgetrain/ended", 0) < place.size - 1 and time.monotonic() < until:
            time.sleep(0.05)
    except RuntimeError:
        pass  # rank 0 is gone: nothing here is left to wait for


def _await_all(store, place: Place, timeout: float) -> None:
    until = time.monotonic() + timeout
    while store.add("edgetrain/joined", 0) < place.size:
        if time.monotonic() > until:
            missing = [r for r in range(place.size) if not _holds(store, f"edgetrain/joined/{r}")]
            nodes = sorted({place.host_of(r) for r in missing})
            who = f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} on {', '.join(nodes)}"
            raise EdgetrainError(f"{who} did not join rank 0 at "
                                 f"{place.master_addr}:{place.join_port} within {timeout:.0f} s",
                                 f"check that {', '.join(nodes)} reach{'es' if len(nodes) == 1 else ''} the head on "
                                 "the cluster interface (edgetrain_iface) and that nothing filters the port")
        time.sleep(0.2)


def _holds(store, key: str) -> bool:
    """Whether the store has ``key`` (torch 1.13's store has no ``check``: a wait that ends at once)."""
    try:
        store.wait([key], datetime.timedelta(milliseconds=50))
        return True
    except RuntimeError:
        return False


# --- what the script does with torch.distributed ----------------------------------------------

_CALLED: list[str] = []  # the backends init_process_group was called with, in this process
# Every process group the script made, alive to the rank's os._exit. torch 1.13 deadlocks where a
# DistributedDataParallel model holds a Gloo group's last reference - after the tutorial's
# destroy_process_group(), as the model goes with main()'s locals: its reducer destroys the group
# with the GIL held, joining a Gloo thread that waits for the GIL to free a tensor Python has let
# go (tests/scripts/torch/ddp_freed_in_main.py hangs so every time; the DDP example 1 run in 4).
# torch 2.13 ended that script under torchrun in 3 runs of 3; the CUDA image still runs 1.13.1.
_GROUPS: list[object] = []


def watch_init() -> None:
    """Note every ``init_process_group`` call the script makes (it may destroy its group before it
    ends) and keep every group it makes, and refuse NCCL on a host without a GPU in one line rather
    than torch's traceback."""
    import torch
    import torch.distributed as dist

    init, new_group = dist.init_process_group, dist.new_group

    @functools.wraps(init)
    def init_process_group(*args, **kwargs):
        backend = str(kwargs.get("backend", args[0] if args else "") or "")
        if "nccl" in backend.lower() and not torch.cuda.is_available():
            raise EdgetrainError(f"init_process_group({backend!r}) on {os.uname().nodename}, which has no GPU",
                                 "use backend 'gloo' on CPU nodes (NCCL needs a GPU per rank)")
        _CALLED.append(backend)
        made = init(*args, **kwargs)
        _GROUPS.append(dist.distributed_c10d._get_default_group())
        return made

    @functools.wraps(new_group)
    def kept_new_group(*args, **kwargs):
        group = new_group(*args, **kwargs)
        _GROUPS.append(group)
        return group

    dist.init_process_group, dist.new_group = init_process_group, kept_new_group


def called_init() -> bool:
    return bool(_CALLED)
