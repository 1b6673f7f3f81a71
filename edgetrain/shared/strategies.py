"""What both sides of a run know of its strategy: the names ``--strategy`` takes, and what the
launcher tells every rank of its peers (``--peers``), one typed record per strategy with JSON on
the wire. The controller's half of each strategy is edgetrain.controller.strategies, the ranks'
edgetrain.rank.strategies.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from enum import Enum
from typing import Any, TypeVar

from edgetrain.shared.errors import EdgetrainError


class Name(str, Enum):
    """How a run's ranks talk, as ``--strategy`` names it."""

    HOROVOD = "horovod"
    TF_MULTIWORKER = "tf-multiworker"
    TF_PS = "tf-ps"
    TORCH = "torch"

    def __str__(self) -> str:
        return self.value


DEFAULT = Name.HOROVOD

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
# arguments), e.g. ``-- --dist-url {master_url} --dist-rank {rank} --world-size {world_size}``:
# the controller refuses unknown ones, each rank fills them in.
PLACEHOLDER = re.compile(r"\{([A-Za-z_]\w*)\}")
TORCH_PLACEHOLDERS = ("rank", "local_rank", "world_size", "master_addr", "master_port", "master_url")


def fill_placeholders(arg: str, values: dict[str, object]) -> str:
    return PLACEHOLDER.sub(lambda m: str(values[m.group(1)]) if m.group(1) in values else m.group(0), arg)


P = TypeVar("P", bound="Peers")


@dataclass(frozen=True)
class Peers:
    """What the launcher tells every rank of the run's tasks (``--peers``): a JSON object of the
    record's fields, lists for its tuples."""

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), separators=(",", ":"))

    @classmethod
    def parse(cls: type[P], text: str) -> P:
        try:
            found = json.loads(text)
            return cls(**{f.name: _tuples(found[f.name]) for f in dataclasses.fields(cls)})
        except (ValueError, TypeError, KeyError) as exc:
            raise EdgetrainError(f"--peers {text!r} is not a {cls.__name__} record ({type(exc).__name__}: {exc})",
                                 f"give the JSON object {cls.__name__}.to_json() writes") from None


def _tuples(value: Any) -> Any:
    return tuple(_tuples(v) for v in value) if isinstance(value, list) else value


def _tf_config(cluster: dict[str, list[str]], kind: str, index: int) -> str:
    return json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}})


@dataclass(frozen=True)
class MultiWorkerPeers(Peers):
    """tf-multiworker: every rank's TensorFlow task (host:port), in rank order."""

    tasks: tuple[str, ...]

    def tf_config(self, rank: int) -> str:
        return _tf_config({"worker": list(self.tasks)}, "worker", rank)


def tf_ps_role(rank: int, ps: int) -> tuple[str, int]:
    """(task type, index) of a tf-ps rank: 0 the chief, 1..ps the parameter servers, then workers."""
    if rank == 0:
        return "chief", 0
    if rank <= ps:
        return "ps", rank - 1
    return "worker", rank - 1 - ps


@dataclass(frozen=True)
class ParameterServerPeers(Peers):
    """tf-ps: each task's host:port in rank order, how many are parameter servers, and the
    chief's lifeline (host:port)."""

    tasks: tuple[str, ...]
    ps: int
    lifeline: str

    def role(self, rank: int) -> tuple[str, int]:
        return tf_ps_role(rank, self.ps)

    def tf_config(self, rank: int) -> str:
        cluster = {"chief": list(self.tasks[:1]), "ps": list(self.tasks[1:1 + self.ps]), "worker": list(self.tasks[1 + self.ps:])}
        return _tf_config(cluster, *self.role(rank))


@dataclass(frozen=True)
class TorchPeers(Peers):
    """torch: rank 0's address and MASTER_PORT, the cluster interface ("" on one host), and each
    host's name with its number of ranks, in placement order (rank 0's first)."""

    master_addr: str
    master_port: int
    iface: str
    hosts: tuple[tuple[str, int], ...]
