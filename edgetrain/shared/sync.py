"""How often the ranks of a data-parallel run talk, and what they exchange: ``--sync-every K`` in
one of two modes. The built-in jobs, ``edgetrain.callbacks`` (Horovod) and ``edgetrain.ddp``
(torch DDP) each map it onto their framework; this module is what they agree on.

- ``grads``: gradient accumulation. Each rank adds up K batches' gradients, then one allreduce
  averages them and one update applies them (Horovod's ``backward_passes_per_step``, DDP's
  ``no_sync``). Between updates the ranks hold the same model, as with K = 1.
- ``weights``: local SGD. Each rank takes K updates of its own, then one allreduce averages the
  models (every epoch's end and every evaluation is also a sync point, so checkpoints and scores
  are of one model). With ``outer_momentum`` > 0 the average is not taken as is: the change since
  the last sync is an outer gradient for an outer SGD step with Nesterov momentum (DiLoCo).

Both send one model-sized allreduce per K batches instead of one per batch. Parameter servers and
MultiWorkerMirroredStrategy exchange every step inside TensorFlow, where no such setting exists.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from edgetrain.shared.errors import UsageError


def _every(v: int) -> tuple[str, str] | None:
    return None if v >= 1 else ("must be at least 1", "1 talks after every batch, as without it")


def _outer_lr(v: float) -> tuple[str, str] | None:
    return None if 0 < v <= 2 else ("must be in (0, 2]", "1 takes the ranks' average as it is")


def _outer_momentum(v: float) -> tuple[str, str] | None:
    return None if 0 <= v < 1 else ("must be in [0, 1)", "0 for the plain average; DiLoCo used 0.9 with --outer-lr 0.7")


AUTO = "auto"


def parse_every(text: str) -> int | None:
    """``--sync-every``'s value: a number of batches, or ``auto`` (None: the newest bench's choice, for `run` to look up)."""
    if str(text).strip().lower() == AUTO:
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number of batches or {AUTO}") from None


# Each setting's check, by its name: the problem with a value and its fix, or None. The job options
# (edgetrain.shared.job_options) check the flags with these, and Sync its own fields.
CHECKS = {"sync_every": _every, "outer_lr": _outer_lr, "outer_momentum": _outer_momentum}


class SyncMode(str, enum.Enum):
    GRADS = "grads"
    WEIGHTS = "weights"


@dataclass(frozen=True)
class Sync:
    sync_every: int = 1
    sync_mode: SyncMode = SyncMode.GRADS
    outer_lr: float = 1.0  # weights: the outer step's rate (1 with no momentum: the plain average)
    outer_momentum: float = 0.0  # weights: Nesterov momentum of the outer step; 0: none

    def __post_init__(self) -> None:
        object.__setattr__(self, "sync_mode", SyncMode(self.sync_mode))
        for name, check in CHECKS.items():
            problem = check(getattr(self, name))
            if problem is not None:
                raise UsageError(f"--{name.replace('_', '-')} {getattr(self, name)} {problem[0]}", problem[1])
        if self.sync_mode is SyncMode.GRADS and not self.plain_average:
            raise UsageError("--outer-lr and --outer-momentum are for --sync-mode weights", "add --sync-mode weights, or drop them")

    @property
    def accumulated(self) -> int:
        """Batches each rank adds to one update: K accumulating gradients, 1 training locally."""
        return self.sync_every if self.sync_mode is SyncMode.GRADS else 1

    @property
    def averages_ranks(self) -> bool:
        """Whether an update averages every rank's gradients (grads), or only the rank's own (weights)."""
        return self.sync_mode is SyncMode.GRADS

    @property
    def plain_average(self) -> bool:
        """A weights sync that takes the ranks' average as it is, with no outer step."""
        return self.outer_lr == 1 and not self.outer_momentum


EVERY_STEP = Sync()
