"""Each rank's batch: equal (the default), or by speed - in proportion to its node's training rate,
so that a fast node beside slow ones does not wait for them at every step (``--batch-by speed``).

The controller plans the speeds (edgetrain.controller.speeds) and hands every rank the same list,
one speed per rank in rank order, in ``EDGETRAIN_RANK_SPEEDS``; each rank turns it into batches
here, from the program's own per-rank batch. What stays as with equal batches:

- the global batch (ranks x the per-rank batch), so the learning-rate rule stands;
- the steps per epoch, the same on every rank (the global batch's count in the data);
- an epoch covers the data once: the shards partition it, each rank's in proportion to its batch;
- each update is the mean gradient over the global batch: Horovod and DDP average the ranks'
  gradients equally, so rank r's loss is weighted by ranks x b_r / B (``Batches.weight``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

SPEEDS_ENV = "EDGETRAIN_RANK_SPEEDS"


class BatchBy(str, Enum):
    EQUAL = "equal"
    SPEED = "speed"
    AUTO = "auto"  # the controller's: the newest bench's choice of the two (edgetrain.controller.speeds)


def split(total: int, speeds: Sequence[float]) -> tuple[int, ...]:
    """``total`` examples as one integer batch per rank in proportion to ``speeds``, summing to
    ``total`` exactly, each at least 1: every rank keeps one example, the rest go by largest remainder
    (ties to the lower rank, so every rank computes the same split)."""
    if total < len(speeds):
        raise ValueError(f"a global batch of {total} cannot give each of {len(speeds)} ranks an example")
    if not speeds or any(not (s > 0 and math.isfinite(s)) for s in speeds):
        raise ValueError(f"speeds must be positive numbers, not {list(speeds)}")
    spare, weight = total - len(speeds), sum(speeds)
    exact = [spare * s / weight for s in speeds]
    batches = [1 + math.floor(e) for e in exact]
    by_remainder = sorted(range(len(speeds)), key=lambda r: (-(exact[r] - math.floor(exact[r])), r))
    for r in by_remainder[:total - sum(batches)]:
        batches[r] += 1
    return tuple(batches)


def owners(batches: Sequence[int]) -> list[int]:
    """The rank owning each position of a block of ``sum(batches)`` consecutive examples, rank r
    owning ``batches[r]`` of them, spread evenly (smooth weighted round robin). Equal batches give
    0, 1, .., size-1 over and over: the shards ``x[rank::size]`` that equal batches always had."""
    total, credit, found = sum(batches), [0] * len(batches), []
    for _ in range(total):
        credit = [c + b for c, b in zip(credit, batches, strict=True)]
        best = max(range(len(batches)), key=lambda r: (credit[r], -r))
        credit[best] -= total
        found.append(best)
    return found


@dataclass(frozen=True)
class Batches:
    """Every rank's batch (``sizes``, in rank order) and this rank's place among them."""

    sizes: tuple[int, ...]
    rank: int = 0

    @classmethod
    def planned(cls, batch_size: int, rank: int, size: int, env: Mapping[str, str] = os.environ) -> Batches:
        """The batches for a program whose per-rank batch is ``batch_size``: equal, or split by the
        speeds the controller planned (``SPEEDS_ENV``) with the global batch unchanged."""
        given = env.get(SPEEDS_ENV)
        if not given:
            return cls((batch_size,) * size, rank)
        speeds = [float(s) for s in given.split(",")]
        if len(speeds) != size:
            raise ValueError(f"{SPEEDS_ENV} has {len(speeds)} speeds for {size} ranks")
        return cls(split(batch_size * size, speeds), rank)

    @property
    def mine(self) -> int:
        return self.sizes[self.rank]

    @property
    def total(self) -> int:
        """The global batch: the examples one update averages."""
        return sum(self.sizes)

    @property
    def even(self) -> bool:
        return len(set(self.sizes)) == 1

    @property
    def weight(self) -> float:
        """What this rank's mean loss is multiplied by so that the ranks' equally averaged gradients
        are the mean over the global batch: ranks x b_r / B (1 with equal batches)."""
        return len(self.sizes) * self.mine / self.total

    def steps(self, examples: int) -> int:
        """Steps per epoch on every rank: the global batches in ``examples``."""
        return examples // self.total

    def indices(self, examples: int, rank: int | None = None) -> list[int]:
        """The positions of ``rank``'s shard (default this rank's) among ``examples`` examples: the
        shards partition them, rank r's about ``examples x b_r / B`` long, and each holds its
        ``steps(examples) x b_r`` examples at least."""
        mine = self.rank if rank is None else rank
        block = owners(self.sizes)
        return [i for i in range(examples) if block[i % len(block)] == mine]

    def shard(self, *arrays: Any) -> Any:
        """This rank's shard of each array (numpy-indexable, first axis the examples): with equal
        batches a strided view (``indices``' own, with no copy of the data), else a copy."""
        picked = slice(self.rank, None, len(self.sizes)) if self.even else self.indices(len(arrays[0]))
        found = tuple(a[picked] for a in arrays)
        return found if len(found) > 1 else found[0]

    def describe(self) -> str:
        return "/".join(map(str, self.sizes))
