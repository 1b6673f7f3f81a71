"""Placement: which host runs how many ranks, and the Hydra machinefile that says so."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from edgetrain.shared import batches, mpi, strategies
from edgetrain.shared.errors import EdgetrainError, UsageError
from edgetrain.controller.inventory import DEVICE_GROUPS, Host, Inventory


# Horovod's cycle: how often its background thread turns to new requests, and negotiates with every
# other rank even when none are pending. With MPI that negotiation polls, so it stays rare; Gloo's waits
# sleep, so a short one costs little, while a gradient arriving just after a turn waits a whole cycle
# (docs/scaling-history.md: at 100 ms a 3-node LeNet's steps locked to 300 and 400 ms).
SLOW_CYCLE_TIME_MS = 100
GLOO_CYCLE_TIME_MS = 10
# How long a Gloo collective waits for a peer before failing the rank. Generous: a rank's own
# slow work (rank 0 saving a model to an SD card) must not fail the others; a dead node is
# noticed sooner by the launcher (its ssh keepalives) or by the peers' closed connections.
GLOO_TIMEOUT_S = 1800


@dataclass(frozen=True)
class Placement:
    np: int
    ranks: tuple[tuple[Host, int], ...]  # (host, ranks on it), rank 0's host first
    oversubscribed: bool = False
    speeds: tuple[float, ...] | None = None  # --batch-by speed: each rank's (edgetrain.controller.speeds); None: equal batches
    speeds_from: str | None = None  # where the nodes' speeds came from

    @property
    def hosts(self) -> tuple[Host, ...]:
        return tuple(h for h, _ in self.ranks)

    @property
    def rank_env(self) -> dict[str, str]:
        """What every rank's environment gets: edgetrain's defaults for this placement, then the
        inventory's ``edgetrain_mpi_env``, which wins."""
        env = {}
        if self.np == 1:
            # At size 1 Horovod skips the gradients' allreduce (its _allreduce_cond), so the cycle
            # only paces a handful of collectives a run; at its default 1 ms the idle thread still
            # woke a thousand times a second: 2% of a core here, 14% of an emulated Pi's quota.
            env["HOROVOD_CYCLE_TIME"] = str(SLOW_CYCLE_TIME_MS)
        if len(self.hosts) > 1 and all(h.device == "cpu" for h in self.hosts):
            mine = {strategies.HOROVOD_CONTROLLER, strategies.HOROVOD_OPERATIONS} & self.head.mpi_env.keys()
            if self.head.iface and not mine:
                # Gloo waits without polling (edgetrain.rank.rendezvous); it finds its peers on the
                # cluster interface, which like MPICH's -iface is the head's name for it. An
                # inventory that picks either half itself picks both (Horovod 0.28 crashes on an
                # MPI controller with Gloo collectives).
                env.update(strategies.gloo_env(self.head.iface, GLOO_TIMEOUT_S))
            gloo = self.head.mpi_env.get(strategies.HOROVOD_CONTROLLER, env.get(strategies.HOROVOD_CONTROLLER)) == "gloo"
            # MPI busy-waits in every negotiation, even with no tensor pending: at Horovod's default
            # 1 ms an idle 3-node job used all of an emulated Pi's CPU (docs/scaling-history.md).
            env["HOROVOD_CYCLE_TIME"] = str(GLOO_CYCLE_TIME_MS if gloo else SLOW_CYCLE_TIME_MS)
        if self.head.iface and self.head.mpi_env.get(strategies.HOROVOD_CONTROLLER, env.get(strategies.HOROVOD_CONTROLLER)) == "gloo":
            # Gloo and its rendezvous listen on this interface alone, whoever picked Gloo.
            env.setdefault(strategies.GLOO_IFACE, self.head.iface)
        if self.speeds is not None:
            env[batches.SPEEDS_ENV] = ",".join(f"{s:.6g}" for s in self.speeds)
        return {**env, **self.head.mpi_env}

    @property
    def head(self) -> Host:
        return self.ranks[0][0]

    def ranks_on(self, host: Host) -> list[int]:
        """The ranks a host runs: hosts are filled in order, rank 0 on the first."""
        first = 0
        for h, n in self.ranks:
            if h.name == host.name:
                return list(range(first, first + n))
            first += n
        return []

    def machinefile(self) -> str:
        """MPICH Hydra's ``host:count`` lines; with ``-n`` equal to their sum, ranks fill hosts in order."""
        return "".join(f"{h.address}:{n}\n" for h, n in self.ranks)

    def host_jobs(self, hydra: mpi.Hydra, command: list[str], expendable: Callable[[int], bool]) -> list[mpi.HostJob] | None:
        """One Hydra job per host, rank 0's first, where the ranks of some host other than rank 0's
        are all ``expendable`` (the run goes on without them); None where losing any host ends the
        run, which one job over the machinefile does."""
        losable = {h.name for h in self.losable_hosts(expendable)}
        if not losable:
            return None
        jobs = []
        for host, n in self.ranks:
            ranks = tuple(self.ranks_on(host))
            env = {mpi.RANK_BASE: str(ranks[0]), mpi.WORLD_SIZE: str(self.np)}
            jobs.append(mpi.HostJob(host.name, ranks, host.name in losable, (*hydra.argv(n, [f"{host.address}:{n}"], env), *command)))
        return jobs

    def losable_hosts(self, expendable: Callable[[int], bool]) -> list[Host]:
        """The hosts a run goes on without: every rank on them ``expendable``, rank 0's host never."""
        return [h for h in self.hosts[1:] if all(map(expendable, self.ranks_on(h)))]

    def describe(self) -> list[dict]:
        return [{"host": h.name, "address": h.address, "arch": h.arch, "slots": h.slots, "ranks": n} for h, n in self.ranks]


def select(inventory: Inventory, group: str | None = None) -> list[Host]:
    """The hosts a job may use: one device group only, because Horovod cannot mix CPU and GPU ranks."""
    if group is not None:
        if group not in DEVICE_GROUPS:
            raise UsageError(f"unknown --group {group!r}", f"use one of: {', '.join(DEVICE_GROUPS)}")
        hosts = [h for h in inventory.hosts if group in h.groups]
        if not hosts:
            raise EdgetrainError(f"no hosts in group {group!r} of {inventory.source}")
        return hosts
    devices = {h.device for h in inventory.hosts}
    if len(devices) > 1:
        raise UsageError(
            f"inventory {inventory.source} mixes CPU and GPU hosts, which one Horovod job cannot use together",
            "pick one with --group rpi or --group gpu",
        )
    return list(inventory.hosts)


def plan(inventory: Inventory, np: int, group: str | None = None, per_node: int | None = None) -> Placement:
    """Fill hosts in inventory order up to their slots (or ``per_node`` ranks each, when given).

    One host alone may be oversubscribed (the embedded default on a laptop: ranks then share
    cores, and each gets fewer TensorFlow threads). Across several hosts, asking for more ranks
    than slots is refused: it would silently pile ranks onto the first nodes.
    """
    if np < 1:
        raise UsageError(f"--np {np} is not a number of ranks", "use --np 1 or more")
    hosts = select(inventory, group)
    if per_node is not None:
        hosts = [replace(h, slots=min(h.slots, per_node)) for h in hosts]
    total = sum(h.slots for h in hosts)
    if np > total:
        if len(hosts) == 1:
            return Placement(np, ((hosts[0], np),), oversubscribed=True)
        raise EdgetrainError(
            f"--np {np} needs more ranks than the {total} slots of {len(hosts)} hosts",
            "lower --np or raise edgetrain_slots in the inventory",
        )
    ranks, left = [], np
    for h in hosts:
        if left == 0:
            break
        n = min(h.slots, left)
        ranks.append((h, n))
        left -= n
    arches: dict[str, list[str]] = {}
    for h, _ in ranks:
        arches.setdefault(h.arch, []).append(h.name)
    if len(arches) > 1:
        # MPICH cannot run one job over aarch64 and x86_64 ranks: it hangs in MPI_Init (pmodels/mpich#6008).
        found = "; ".join(f"{arch}: {', '.join(names)}" for arch, names in arches.items())
        raise UsageError(f"--np {np} would place ranks on aarch64 and x86_64 hosts ({found}), which one MPI job cannot span",
                         "pick hosts of one architecture with --group rpi or --group gpu, or lower --np")
    return Placement(np, tuple(ranks))
