"""How a run's ranks talk: one object per strategy, used by the launcher and by every rank's worker.

Everything else about a run (inventory, placement, preflight, shipping, containers, mpirun, logs,
failure records, cleanup, collect) is the same for all of them, so a strategy says only what
differs: which built-in jobs train with it, which ports must be free on each host before anything
starts, what each rank's worker is told, what a rank's environment holds before the program
runs, and what a rank that ended with status 0 may still have got wrong. The launcher and the
worker never compare strategy names.
"""

from __future__ import annotations

import glob
import json
import os
import sys
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

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

    # -- on the controller, before anything starts ----------------------------------------------
    def ports(self, plan: Placement, base_port: int) -> dict[str, list[int]]:
        """The ports each host (by name) must have free."""
        return {}

    def worker_args(self, plan: Placement, base_port: int) -> list[str]:
        """What every rank's worker is told, on its command line."""
        return []

    # -- in each rank -------------------------------------------------------------------------
    def set_up_rank(self, rank: int, peers: str) -> None:
        """The rank's environment before the program runs (``peers``: what worker_args said)."""

    def unmet(self, size: int) -> Unmet | None:
        """Checked after the program ended with status 0."""
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

    def set_up_rank(self, rank: int, peers: str) -> None:
        from edgetrain.rank import rendezvous

        rendezvous.set_up()  # rank 0's server answers from a thread of its own

    def unmet(self, size: int) -> Unmet | None:
        if size > 1 and horovod_module() is None:
            return Unmet("the script ended without calling hvd.init(), so every rank trained alone",
                         "call hvd.init() and wrap the optimizer in hvd.DistributedOptimizer (see examples/), "
                         "or pass --strategy tf-multiworker", Kind.NO_INIT)
        return None


class TfMultiWorker(Strategy):
    name = "tf-multiworker"
    help = "TensorFlow's MultiWorkerMirroredStrategy; TF_CONFIG written per worker"

    def ports(self, plan: Placement, base_port: int) -> dict[str, list[int]]:
        return {host.name: [base_port + i for i in range(n)] for host, n in plan.ranks}

    def worker_args(self, plan: Placement, base_port: int) -> list[str]:
        ports = self.ports(plan, base_port)
        workers = []
        for host, _ in plan.ranks:
            address = host.address if not host.is_local or len(plan.hosts) > 1 else "localhost"
            workers += [f"{address}:{p}" for p in ports[host.name]]
        return ["--peers", ",".join(workers)]

    def set_up_rank(self, rank: int, peers: str) -> None:
        os.environ["TF_CONFIG"] = tf_config(peers.split(","), rank)
        # One GPU per worker, as Horovod ranks get with pin_gpu: the node's n-th worker the n-th GPU.
        if "CUDA_VISIBLE_DEVICES" not in os.environ and glob.glob("/dev/nvidia[0-9]*"):
            os.environ["CUDA_VISIBLE_DEVICES"] = os.environ.get("MPI_LOCALRANKID", "0")


def tf_config(workers: list[str], index: int) -> str:
    return json.dumps({"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}})


STRATEGIES: dict[str, Strategy] = {s.name: s for s in (Horovod(), TfMultiWorker())}
DEFAULT = Horovod.name
