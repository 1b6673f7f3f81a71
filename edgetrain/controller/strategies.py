"""How a run's ranks talk, as the launcher sees it: one object per strategy (their ranks' half is
edgetrain.rank.strategies, the names and the peers records both use edgetrain.shared.strategies).

Everything else about a run (inventory, placement, preflight, shipping, containers, mpirun, logs,
failure records, cleanup, collect) is the same for all of them, so a strategy says only what
differs: which built-in jobs train with it, what every rank imports for it and how to install it,
which ports must be free on each host before anything starts (and the option that picks them),
what the script's arguments may hold, what every rank is told of its peers, and which ranks the
run can lose and go on. The launcher and the runtimes never compare strategy names.
"""

from __future__ import annotations

from typing import ClassVar

from edgetrain.controller.placement import Placement
from edgetrain.shared.errors import UsageError
from edgetrain.shared.strategies import (PLACEHOLDER, TORCH_PLACEHOLDERS, MultiWorkerPeers, Name, ParameterServerPeers,
                                         Peers, TorchPeers, tf_ps_role)

HOROVOD_FIX = "run scripts/setup (it compiles Horovod against this machine's MPICH)"


class Strategy:
    name: ClassVar[Name]
    help: ClassVar[str]
    builtin_jobs: ClassVar[bool] = False  # the built-in jobs train with this strategy
    needs: ClassVar[str] = "horovod"  # what every rank imports for it: a package, as the image probe names it
    install_fix: ClassVar[str] = HOROVOD_FIX  # how to get ``needs`` where this machine's Python lacks it (an image lacking it is rebuilt)
    # The labelled packages every rank loads (images.LABELLED_PACKAGES): one version of each on every
    # node. The others may differ (torch is pinned per architecture, and a Horovod run loads none).
    loads: ClassVar[tuple[str, ...]] = ("mpich", "tensorflow", "horovod")
    port_option: ClassVar[str | None] = None  # the run flag that picks its ports (config.PORT_FLAGS)
    default_port: ClassVar[int] = 0  # that option's default
    probe: ClassVar[str | None] = None  # the module `edgetrain bench` times this strategy's allreduce with; None: bench cannot
    progress: ClassVar[str] = "edgetrain.callbacks.Progress in the script's callbacks"  # where bench reads a script's img/s
    # Each rank's batch may differ (--batch-by speed): the program sizes its own batches and shards
    # (edgetrain.shared.batches); TensorFlow's own strategies split one global batch themselves.
    uneven_batches: ClassVar[bool] = False

    def ports(self, plan: Placement, base_port: int) -> dict[str, list[int]]:
        """The ports each host (by name) must have free."""
        return {}

    def check_args(self, args: tuple[str, ...]) -> None:
        """Refuse script arguments this strategy cannot give the ranks (UsageError)."""

    def check_tasks(self, np: int, ps: int | None) -> None:
        """Refuse a split of the ranks into kinds of tasks (``--ps``) this strategy does not make."""
        if ps is not None:
            raise UsageError(f"--ps is for --strategy {Name.TF_PS}", f"drop --ps, or pass --strategy {Name.TF_PS}")

    def peers(self, plan: Placement, base_port: int, ps: int | None = None) -> Peers | None:
        """What every rank is told of the run's tasks (``ps``: --ps, for tf-ps); None: nothing."""
        return None

    def worker_args(self, plan: Placement, base_port: int, ps: int | None = None) -> list[str]:
        """What every rank's worker is told, on its command line: its peers, where there are any."""
        peers = self.peers(plan, base_port, ps)
        return [] if peers is None else ["--peers", peers.to_json()]

    def can_lose(self, rank: int, ps: int | None = None) -> str | None:
        """What the run loses with ``rank`` (e.g. "worker 1") where it goes on without it; None where
        losing it ends the run. A host whose ranks can all be lost starts as a Hydra job of its
        own (edgetrain.rank.hostjobs), so that losing it ends nothing else."""
        return None


class Horovod(Strategy):
    name = Name.HOROVOD
    uneven_batches = True
    help = "mpirun + Horovod"
    builtin_jobs = True
    probe = "edgetrain.rank.allreduce"


def task_addresses(plan: Placement, ports: dict[str, list[int]]) -> tuple[str, ...]:
    """host:port of every rank's TensorFlow task, in rank order (localhost on a lone local host)."""
    found: list[str] = []
    for host, n in plan.ranks:
        address = host.address if not host.is_local or len(plan.hosts) > 1 else "localhost"
        found += [f"{address}:{p}" for p in ports[host.name][:n]]
    return tuple(found)


class TfMultiWorker(Strategy):
    name = Name.TF_MULTIWORKER
    help = "TensorFlow's MultiWorkerMirroredStrategy; TF_CONFIG written per worker"
    needs = "tensorflow"
    install_fix = "install tensorflow there"
    loads = ("mpich", "tensorflow")
    port_option = "tf_port"
    default_port = 23456

    def ports(self, plan: Placement, base_port: int) -> dict[str, list[int]]:
        return {host.name: [base_port + i for i in range(n)] for host, n in plan.ranks}

    def peers(self, plan: Placement, base_port: int, ps: int | None = None) -> MultiWorkerPeers:
        return MultiWorkerPeers(task_addresses(plan, self.ports(plan, base_port)))


class TfParameterServer(Strategy):
    """Rank 0 is the chief and runs the script (ParameterServerStrategy, ClusterCoordinator, as
    TensorFlow's guide writes it); ranks 1..P are parameter servers and the rest workers, each an
    in-process TensorFlow server of edgetrain's own (edgetrain.rank.tf_ps)."""

    name = Name.TF_PS
    help = "TensorFlow's ParameterServerStrategy: the script on the chief (rank 0), --ps parameter servers, workers on the rest"
    needs = TfMultiWorker.needs
    install_fix = TfMultiWorker.install_fix
    loads = TfMultiWorker.loads
    port_option = TfMultiWorker.port_option
    default_port = TfMultiWorker.default_port
    default_ps = 1  # --ps

    def ports(self, plan: Placement, base_port: int) -> dict[str, list[int]]:
        # A task's port each, and on the head one more: the chief's lifeline.
        return {host.name: [base_port + i for i in range(n + (host.name == plan.head.name))] for host, n in plan.ranks}

    def check_tasks(self, np: int, ps: int | None) -> None:
        ps = self.default_ps if ps is None else ps
        if not 1 <= ps <= np - 2:
            raise UsageError(f"--ps {ps} with --np {np} leaves no worker: --np counts the chief, the parameter servers and "
                             "the workers", "e.g. --np 4 --ps 1: a chief, one parameter server, two workers")

    def peers(self, plan: Placement, base_port: int, ps: int | None = None) -> ParameterServerPeers:
        ports = self.ports(plan, base_port)
        tasks = task_addresses(plan, ports)
        lifeline = f"{tasks[0].rsplit(':', 1)[0]}:{ports[plan.head.name][-1]}"
        return ParameterServerPeers(tasks, self.default_ps if ps is None else ps, lifeline)

    def can_lose(self, rank: int, ps: int | None = None) -> str | None:
        # The coordinator goes on with the workers left (TensorFlow's worker fault tolerance);
        # without a parameter server or the chief there is nothing to go on with.
        kind, index = tf_ps_role(rank, self.default_ps if ps is None else ps)
        return f"worker {index}" if kind == "worker" else None


class Torch(Strategy):
    name = Name.TORCH
    uneven_batches = True
    help = ("torch.distributed (DDP): every process gets what torchrun gives its workers (MASTER_ADDR, RANK, WORLD_SIZE, "
            "LOCAL_RANK, ...) and {rank}, {world_size}, {master_url}, ... in the script's arguments")
    needs = "torch"
    loads = ("mpich", "torch")
    install_fix = "run scripts/setup with EDGETRAIN_TORCH=1 (it installs torch for the host runtime)"
    port_option = "master_port"
    default_port = 29500  # torchrun's
    probe = "edgetrain.rank.torch_allreduce"
    progress = "edgetrain.ddp.Progress (step() after each step, epoch() after each epoch)"

    def ports(self, plan: Placement, base_port: int) -> dict[str, list[int]]:
        # MASTER_PORT for the script's rendezvous, the next one for edgetrain's join check before it.
        return {plan.head.name: [base_port, base_port + 1]}

    def check_args(self, args: tuple[str, ...]) -> None:
        for arg in args:
            for name in PLACEHOLDER.findall(arg):
                if name not in TORCH_PLACEHOLDERS:
                    raise UsageError(f"unknown placeholder {{{name}}} in the script's arguments ({arg!r})",
                                     "use " + ", ".join(f"{{{p}}}" for p in TORCH_PLACEHOLDERS))

    def peers(self, plan: Placement, base_port: int, ps: int | None = None) -> TorchPeers:
        several = len(plan.hosts) > 1
        address = plan.head.address if several or not plan.head.is_local else "127.0.0.1"
        iface = plan.head.iface if several and plan.head.iface else ""
        return TorchPeers(address, base_port, iface, tuple((host.name, n) for host, n in plan.ranks))


STRATEGIES: dict[Name, Strategy] = {s.name: s for s in (Horovod(), TfMultiWorker(), TfParameterServer(), Torch())}


def named(name: str) -> Strategy:
    """The strategy a ``--strategy`` names, or the one-line refusal of a name none has."""
    if name not in STRATEGIES:
        raise UsageError(f"unknown --strategy {name!r}", f"use one of: {', '.join(STRATEGIES)}")
    return STRATEGIES[Name(name)]

