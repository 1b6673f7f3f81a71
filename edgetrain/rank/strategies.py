"""How a run's ranks talk, as each rank's worker sees it: one object per strategy (the launcher's
half is edgetrain.controller.strategies, the names and peers records edgetrain.shared.strategies).

A strategy sets a rank up before the program runs - its environment, from what the launcher told
every rank of its peers - and says what the rank does then (its ``Role``: run the program, or
serve the rank that runs it); after a program that ended with status 0 it says what the rank may
still have got wrong, and what the rank does before it ends; and for a rank's error, whether the
script is written for another strategy. The worker never compares strategy names.
"""

from __future__ import annotations

import glob
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from edgetrain.rank import rendezvous, tf_ps, torch_rank
from edgetrain.shared import failures
from edgetrain.shared.failures import Kind
from edgetrain.shared.strategies import MultiWorkerPeers, Name, ParameterServerPeers, TorchPeers


@dataclass(frozen=True)
class Role:
    """What a set-up rank does: run the program with ``args``, or - where ``serve`` is given - serve
    the others with it in the program's place, until the run no longer needs this rank."""

    args: tuple[str, ...] = ()
    serve: Callable[[], None] | None = None


@dataclass(frozen=True)
class Unmet:
    """Why a rank whose program ended with status 0 has failed all the same."""

    error: str
    fix: str
    kind: Kind


def horovod_module():
    """Horovod's TensorFlow module if the program initialized it, else None."""
    hvd = sys.modules.get("horovod.tensorflow")
    try:
        return hvd if hvd is not None and hvd.is_initialized() else None
    except Exception:  # noqa: BLE001 - an unusable Horovod counts as not initialized
        return None


class Strategy:
    name: ClassVar[Name]
    # What the program made outlives it, to the rank's os._exit, instead of being destroyed as it returns.
    keeps_program: ClassVar[bool] = False

    def set_up(self, rank: int, peers: str, args: list[str]) -> Role:
        """The rank's environment before the program runs (``peers``: what the launcher told every
        rank, --peers), and what the rank does then."""
        return Role(tuple(args))

    def unmet(self, size: int) -> Unmet | None:
        """Checked after the program ended with status 0."""
        return None

    def ended(self) -> None:
        """The program ended with status 0 and nothing was unmet: what the rank does before it ends
        (after it marked its end, so a rank that waits here is known to have ended)."""

    def advice(self, error: str) -> str | None:
        """A fix for a rank's error that says the script is written for another strategy."""
        if "MASTER_ADDR" in error or "torch.distributed" in error:
            return f"the script starts torch.distributed from the environment torchrun sets: pass --strategy {Name.TORCH}"
        return None


class Horovod(Strategy):
    name = Name.HOROVOD

    def set_up(self, rank: int, peers: str, args: list[str]) -> Role:
        rendezvous.set_up()  # rank 0's server answers from a thread of its own
        return Role(tuple(args))

    def unmet(self, size: int) -> Unmet | None:
        if size > 1 and horovod_module() is None:
            if "torch.distributed" in sys.modules:
                return Unmet("the script ended without calling hvd.init(): it uses torch.distributed, so every rank "
                             "trained alone", f"pass --strategy {Name.TORCH}", Kind.NO_INIT)
            return Unmet("the script ended without calling hvd.init(), so every rank trained alone",
                         "call hvd.init() and wrap the optimizer in hvd.DistributedOptimizer (see examples/), "
                         f"or pass --strategy {Name.TF_MULTIWORKER}", Kind.NO_INIT)
        return None


class TfMultiWorker(Strategy):
    name = Name.TF_MULTIWORKER

    def set_up(self, rank: int, peers: str, args: list[str]) -> Role:
        os.environ["TF_CONFIG"] = MultiWorkerPeers.parse(peers).tf_config(rank)
        # One GPU per worker, as Horovod ranks get with pin_gpu: the node's n-th worker the n-th GPU.
        if "CUDA_VISIBLE_DEVICES" not in os.environ and glob.glob("/dev/nvidia[0-9]*"):
            os.environ["CUDA_VISIBLE_DEVICES"] = os.environ.get("MPI_LOCALRANKID", "0")
        return Role(tuple(args))


class TfParameterServer(Strategy):
    """Rank 0, the chief, runs the script; every other rank serves as a parameter server or a
    worker until the chief ends (edgetrain.rank.tf_ps)."""

    name = Name.TF_PS

    def set_up(self, rank: int, peers: str, args: list[str]) -> Role:
        layout = ParameterServerPeers.parse(peers)
        os.environ["TF_CONFIG"] = layout.tf_config(rank)
        if rank == 0:
            tf_ps.become_chief(layout)
            return Role(tuple(args))
        return Role(serve=lambda: tf_ps.serve(layout, rank))

    def unmet(self, size: int) -> Unmet | None:
        if tf_ps.role() == "chief" and not tf_ps.strategy_built():
            return Unmet("the script ended without building a tf.distribute.ParameterServerStrategy, so the "
                         "parameter servers and workers were never used",
                         "build one from tf.distribute.cluster_resolver.TFConfigClusterResolver() (examples/parameter_server), "
                         "or pass the strategy the script is written for", Kind.NO_INIT)
        return None


class Torch(Strategy):
    name = Name.TORCH
    # torch 1.13 deadlocks destroying a DistributedDataParallel model as the script returns: its reducer
    # destroys the Gloo process group, which joins a worker thread while holding the GIL that thread
    # waits for to free a tensor (2 of 7 runs of a two-rank script hung so here, after its last line).
    # The script's globals outlive it; the groups themselves do too (torch_rank), for a model that
    # goes with main()'s locals. Kept while an image carries 1.13 (the CUDA image's 1.13.1).
    keeps_program = True

    def set_up(self, rank: int, peers: str, args: list[str]) -> Role:
        told = TorchPeers.parse(peers)
        place = torch_rank.Place.of(told)
        os.environ.update(place.environment(told.iface or None, os.cpu_count() or 1, os.environ))
        for name in torch_rank.NOT_FROM_TORCHRUN:
            os.environ.pop(name, None)
        torch_rank.watch_init()
        torch_rank.join(place)
        return Role(tuple(place.arguments(args)))

    def unmet(self, size: int) -> Unmet | None:
        if size > 1 and not torch_rank.called_init():
            return Unmet("the script ended without calling torch.distributed.init_process_group, so every rank trained alone",
                         "call dist.init_process_group(backend) and wrap the model in DistributedDataParallel "
                         "(examples/torch_ddp), or pass the strategy the script is written for", Kind.NO_INIT)
        return None

    def ended(self) -> None:
        torch_rank.leave()

    def advice(self, error: str) -> str | None:
        if "hvd.init" in error or "Horovod" in error:
            return f"the script is written for Horovod: pass --strategy {Name.HOROVOD}"
        if failures.NO_SUCH_GPU in error:
            import torch

            return (f"one GPU per local rank, and this host has {torch.cuda.device_count()} for "
                    f"{os.environ.get('LOCAL_WORLD_SIZE', '?')} local ranks")
        return None


STRATEGIES: dict[Name, Strategy] = {s.name: s for s in (Horovod(), TfMultiWorker(), TfParameterServer(), Torch())}
