"""How a run's ranks talk: one object per strategy, used by the launcher and by every rank's worker.

Everything else about a run (inventory, placement, preflight, shipping, containers, mpirun, logs,
failure records, cleanup, collect) is the same for all of them, so a strategy says only what
differs: which built-in jobs train with it, which module a rank needs, which ports must be free
on each host before anything starts (and the option that picks them), what the script's
arguments may hold, what each rank's worker is told, which ranks the run can lose and go on, what
a rank's environment holds before the program runs, and what a rank that ended with status 0 may
still have got wrong. The launcher and
the worker never compare strategy names.
"""

from __future__ import annotations

import glob
import json
import os
import re
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from edgetrain.shared.errors import UsageError
from edgetrain.shared import failures
from edgetrain.shared.failures import Kind

if TYPE_CHECKING:
    from edgetrain.controller.placement import Placement


# Horovod's Gloo, as the controller asks for it on a cluster of CPU nodes (controller.placement)
# and each rank sets up its rendezvous (rank.rendezvous).
HOROVOD_CONTROLLER = "HOROVOD_CONTROLLER"
HOROVOD_OPERATIONS = "HOROVOD_CPU_OPERATIONS"
GLOO_IFACE = "HOROVOD_GLOO_IFACE"
GLOO_ADDR = "HOROVOD_GLOO_RENDEZVOUS_ADDR"
GLOO_PORT = "HOROVOD_GLOO_RENDEZVOUS_PORT"


def gloo_env(iface: str, timeout_s: int) -> dict[str, str]:
    """What a launch's ranks get to use Gloo on the cluster interface ``iface``."""
    return {HOROVOD_CONTROLLER: "gloo", HOROVOD_OPERATIONS: "gloo", GLOO_IFACE: iface,
            "HOROVOD_GLOO_TIMEOUT_SECONDS": str(timeout_s)}


# Per-rank placeholders in a torch script's arguments (the seed's style: its rank and address as
# arguments), e.g. ``-- --dist-url {master_url} --dist-rank {rank} --world-size {world_size}``.
PLACEHOLDER = re.compile(r"\{([A-Za-z_]\w*)\}")
TORCH_PLACEHOLDERS = ("rank", "local_rank", "world_size", "master_addr", "master_port", "master_url")


def fill_placeholders(arg: str, values: dict[str, object]) -> str:
    return PLACEHOLDER.sub(lambda m: str(values[m.group(1)]) if m.group(1) in values else m.group(0), arg)


@dataclass(frozen=True)
class Unmet:
    """Why a rank whose program ended with status 0 has failed all the same."""

    error: str
    fix: str
    kind: Kind


class Strategy:
    name: ClassVar[str]
    help: ClassVar[str]
    builtin_jobs: ClassVar[bool] = False  # the built-in jobs train with this strategy
    needs: ClassVar[str] = "horovod"  # what every rank imports for it: a package, as the image probe names it
    port_option: ClassVar[str | None] = None  # the run option that picks its ports (RunRequest field)
    default_port: ClassVar[int] = 0  # that option's default
    probe: ClassVar[str | None] = None  # the module `edgetrain bench` times this strategy's allreduce with; None: bench cannot
    progress: ClassVar[str] = "edgetrain.callbacks.Progress in the script's callbacks"  # where bench reads a script's img/s
    # What the program made outlives it, to the rank's os._exit, instead of being destroyed as it returns.
    keeps_program: ClassVar[bool] = False

    # -- on the controller, before anything starts ----------------------------------------------
    def ports(self, plan: Placement, base_port: int) -> dict[str, list[int]]:
        """The ports each host (by name) must have free."""
        return {}

    def check_args(self, args: tuple[str, ...]) -> None:
        """Refuse script arguments this strategy cannot give the ranks (UsageError)."""

    def check_tasks(self, np: int, ps: int | None) -> None:
        """Refuse a split of the ranks into kinds of tasks (``--ps``) this strategy does not make."""
        if ps is not None:
            raise UsageError(f"--ps is for --strategy {TfParameterServer.name}", f"drop --ps, or pass --strategy {TfParameterServer.name}")

    def worker_args(self, plan: Placement, base_port: int, ps: int | None = None) -> list[str]:
        """What every rank's worker is told, on its command line (``ps``: --ps, for tf-ps)."""
        return []

    def can_lose(self, rank: int, ps: int | None = None) -> str | None:
        """What the run loses with ``rank`` (e.g. "worker 1") where it goes on without it; None where
        losing it ends the run. A host whose ranks can all be lost starts as a Hydra job of its
        own (edgetrain.rank.hostjobs), so that losing it ends nothing else."""
        return None

    # -- in each rank -------------------------------------------------------------------------
    def set_up_rank(self, rank: int, peers: str, args: list[str]) -> list[str]:
        """The rank's environment before the program runs (``peers``: what worker_args said);
        returns the program's arguments as this rank gets them."""
        return args

    def unmet(self, size: int) -> Unmet | None:
        """Checked after the program ended with status 0."""
        return None

    def ended(self) -> None:
        """The program ended with status 0 and nothing was unmet: what the rank does before it ends
        (after it marked its end, so a rank that waits here is known to have ended)."""

    def advice(self, error: str) -> str | None:
        """A fix for a rank's error that says the script is written for another strategy."""
        if "MASTER_ADDR" in error or "torch.distributed" in error:
            return "the script starts torch.distributed from the environment torchrun sets: pass --strategy torch"
        return None


def horovod_module():
    """Horovod's TensorFlow module if the program initialized it, else None."""
    hvd = sys.modules.get("horovod.tensorflow")
    try:
        return hvd if hvd is not None and hvd.is_initialized() else None
    except Exception:  # noqa: BLE001 - an unusable Horovod counts as not initialized
        return None


class Horovod(Strategy):
    name = "horovod"
    help = "mpirun + Horovod"
    builtin_jobs = True
    probe = "edgetrain.rank.allreduce"

    def set_up_rank(self, rank: int, peers: str, args: list[str]) -> list[str]:
        from edgetrain.rank import rendezvous

        rendezvous.set_up()  # rank 0's server answers from a thread of its own
        return args

    def unmet(self, size: int) -> Unmet | None:
        if size > 1 and horovod_module() is None:
            if "torch.distributed" in sys.modules:
                return Unmet("the script ended without calling hvd.init(): it uses torch.distributed, so every rank "
                             "trained alone", "pass --strategy torch", Kind.NO_INIT)
            return Unmet("the script ended without calling hvd.init(), so every rank trained alone",
                         "call hvd.init() and wrap the optimizer in hvd.DistributedOptimizer (see examples/), "
                         "or pass --strategy tf-multiworker", Kind.NO_INIT)
        return None


class TfMultiWorker(Strategy):
    name = "tf-multiworker"
    help = "TensorFlow's MultiWorkerMirroredStrategy; TF_CONFIG written per worker"
    needs = "tensorflow"
    port_option = "tf_port"
    default_port = 23456

    def ports(self, plan: Placement, base_port: int) -> dict[str, list[int]]:
        return {host.name: [base_port + i for i in range(n)] for host, n in plan.ranks}

    def worker_args(self, plan: Placement, base_port: int, ps: int | None = None) -> list[str]:
        return ["--peers", ",".join(task_addresses(plan, self.ports(plan, base_port)))]

    def set_up_rank(self, rank: int, peers: str, args: list[str]) -> list[str]:
        os.environ["TF_CONFIG"] = tf_config(peers.split(","), rank)
        # One GPU per worker, as Horovod ranks get with pin_gpu: the node's n-th worker the n-th GPU.
        if "CUDA_VISIBLE_DEVICES" not in os.environ and glob.glob("/dev/nvidia[0-9]*"):
            os.environ["CUDA_VISIBLE_DEVICES"] = os.environ.get("MPI_LOCALRANKID", "0")
        return args


def tf_config(workers: list[str], index: int) -> str:
    return json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})


def task_addresses(plan: Placement, ports: dict[str, list[int]]) -> list[str]:
    """host:port of every rank's TensorFlow task, in rank order (localhost on a lone local host)."""
    found = []
    for host, n in plan.ranks:
        address = host.address if not host.is_local or len(plan.hosts) > 1 else "localhost"
        found += [f"{address}:{p}" for p in ports[host.name][:n]]
    return found


def tf_ps_role(rank: int, ps: int) -> tuple[str, int]:
    """(task type, index) of a tf-ps rank: 0 the chief, 1..ps the parameter servers, then workers."""
    if rank == 0:
        return "chief", 0
    if rank <= ps:
        return "ps", rank - 1
    return "worker", rank - 1 - ps


class TfParameterServer(Strategy):
    """Rank 0 is the chief and runs the script (ParameterServerStrategy, ClusterCoordinator, as
    TensorFlow's guide writes it); ranks 1..P are parameter servers and the rest workers, each an
    in-process TensorFlow server of edgetrain's own. The servers end when the chief ends: each
    holds a connection to the chief's lifeline port, which closes with the chief's process."""

    name = "tf-ps"
    help = "TensorFlow's ParameterServerStrategy: the script on the chief (rank 0), --ps parameter servers, workers on the rest"
    needs = "tensorflow"
    port_option = "tf_port"
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

    def worker_args(self, plan: Placement, base_port: int, ps: int | None = None) -> list[str]:
        ports = self.ports(plan, base_port)
        tasks = task_addresses(plan, ports)
        lifeline = f"{tasks[0].rsplit(':', 1)[0]}:{ports[plan.head.name][-1]}"
        layout = {"tasks": tasks, "ps": self.default_ps if ps is None else ps, "lifeline": lifeline}
        return ["--peers", json.dumps(layout, separators=(",", ":"))]

    def can_lose(self, rank: int, ps: int | None = None) -> str | None:
        # The coordinator goes on with the workers left (TensorFlow's worker fault tolerance);
        # without a parameter server or the chief there is nothing to go on with.
        kind, index = tf_ps_role(rank, self.default_ps if ps is None else ps)
        return f"worker {index}" if kind == "worker" else None

    def set_up_rank(self, rank: int, peers: str, args: list[str]) -> list[str]:
        from edgetrain.rank import tf_ps

        layout = tf_ps.Layout.parse(peers)
        os.environ["TF_CONFIG"] = layout.tf_config(rank)
        if rank == 0:
            tf_ps.become_chief(layout)
            return args
        tf_ps.serve(layout, rank)  # until the chief ends; the program does not run here
        raise SystemExit(0)

    def unmet(self, size: int) -> Unmet | None:
        from edgetrain.rank import tf_ps

        if tf_ps.role() == "chief" and not tf_ps.strategy_built():
            return Unmet("the script ended without building a tf.distribute.ParameterServerStrategy, so the "
                         "parameter servers and workers were never used",
                         "build one from tf.distribute.cluster_resolver.TFConfigClusterResolver() (examples/parameter_server), "
                         "or pass the strategy the script is written for", Kind.NO_INIT)
        return None


class Torch(Strategy):
    name = "torch"
    help = ("torch.distributed (DDP): every process gets what torchrun gives its workers (MASTER_ADDR, RANK, WORLD_SIZE, "
            "LOCAL_RANK, ...) and {rank}, {world_size}, {master_url}, ... in the script's arguments")
    needs = "torch"
    port_option = "master_port"
    default_port = 29500  # torchrun's
    probe = "edgetrain.rank.torch_allreduce"
    progress = "edgetrain.ddp.Progress (step() after each step, epoch() after each epoch)"
    # torch 1.13 deadlocks destroying a DistributedDataParallel model as the script returns: its reducer
    # destroys the Gloo process group, which joins a worker thread while holding the GIL that thread
    # waits for to free a tensor (2 of 7 runs of a two-rank script hung so here, after its last line).
    # The script's globals outlive it; the groups themselves do too (torch_rank), for a model that
    # goes with main()'s locals. Kept while an image carries 1.13 (the CUDA image's 1.13.1).
    keeps_program = True

    def ports(self, plan: Placement, base_port: int) -> dict[str, list[int]]:
        # MASTER_PORT for the script's rendezvous, the next one for edgetrain's join check before it.
        return {plan.head.name: [base_port, base_port + 1]}

    def check_args(self, args: tuple[str, ...]) -> None:
        for arg in args:
            for name in PLACEHOLDER.findall(arg):
                if name not in TORCH_PLACEHOLDERS:
                    raise UsageError(f"unknown placeholder {{{name}}} in the script's arguments ({arg!r})",
                                     "use " + ", ".join(f"{{{p}}}" for p in TORCH_PLACEHOLDERS))

    def worker_args(self, plan: Placement, base_port: int, ps: int | None = None) -> list[str]:
        several = len(plan.hosts) > 1
        address = plan.head.address if several or not plan.head.is_local else "127.0.0.1"
        iface = plan.head.iface if several else ""
        layout = ",".join(f"{host.name}={n}" for host, n in plan.ranks)
        return ["--peers", f"{address}:{base_port}:{iface or ''}:{layout}"]

    def set_up_rank(self, rank: int, peers: str, args: list[str]) -> list[str]:
        from edgetrain.rank import torch_rank

        place, iface = torch_rank.Place.parse(peers)
        os.environ.update(place.environment(iface, os.cpu_count() or 1, os.environ))
        for name in torch_rank.NOT_FROM_TORCHRUN:
            os.environ.pop(name, None)
        torch_rank.watch_init()
        torch_rank.join(place)
        return place.arguments(args)

    def unmet(self, size: int) -> Unmet | None:
        from edgetrain.rank import torch_rank

        if size > 1 and not torch_rank.called_init():
            return Unmet("the script ended without calling torch.distributed.init_process_group, so every rank trained alone",
                         "call dist.init_process_group(backend) and wrap the model in DistributedDataParallel "
                         "(examples/torch_ddp), or pass the strategy the script is written for", Kind.NO_INIT)
        return None

    def ended(self) -> None:
        from edgetrain.rank import torch_rank

        torch_rank.leave()

    def advice(self, error: str) -> str | None:
        if "hvd.init" in error or "Horovod" in error:
            return "the script is written for Horovod: pass --strategy horovod"
        if failures.NO_SUCH_GPU in error:
            import torch

            return (f"one GPU per local rank, and this host has {torch.cuda.device_count()} for "
                    f"{os.environ.get('LOCAL_WORLD_SIZE', '?')} local ranks")
        return None


STRATEGIES: dict[str, Strategy] = {s.name: s for s in (Horovod(), TfMultiWorker(), TfParameterServer(), Torch())}
DEFAULT = Horovod.name


def named(name: str) -> Strategy:
    """The strategy a ``--strategy`` names, or the one-line refusal of a name none has."""
    if name not in STRATEGIES:
        raise UsageError(f"unknown --strategy {name!r}", f"use one of: {', '.join(STRATEGIES)}")
    return STRATEGIES[name]
