"""``--batch-by speed``: each rank's speed, from which every rank takes its batch (edgetrain.shared.batches);
``--batch-by auto``: the newest bench's choice between speed and equal batches.

A node's speed comes from, first, the newest bench of this program on this inventory, where it timed
every placed node training alone (its one-node runs: measured for this job, on these very nodes, so
it wins); else each placed host's ``edgetrain_speed`` in the inventory (declared: any unit, the same
on every host, e.g. a Pi 4's LeNet img/s); else the run is refused, saying how to get either. The two
are never mixed in one plan: their units differ. Ranks sharing a node share its speed equally.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType

from edgetrain.controller import inventory
from edgetrain.controller.bench import record
from edgetrain.controller.bench.record import BenchRecord
from edgetrain.controller.placement import Placement
from edgetrain.shared import runs
from edgetrain.shared.batches import BatchBy
from edgetrain.shared.errors import EdgetrainError, UsageError

INVENTORY_VAR = "edgetrain_speed"


@dataclass(frozen=True)
class NodeSpeeds:
    """What a run by speed knows of its nodes before it is placed: a bench's one-node img/s by host."""

    measured: Mapping[str, float] = field(default_factory=lambda: MappingProxyType({}))
    bench: str | None = None  # the bench they came from
    chosen: bool = False  # --batch-by auto: the bench's choice, which speaks only of the nodes it timed

    def placed(self, placement: Placement, program: str, log: Callable[[str], None]) -> Placement:
        """``placement`` with each rank's speed, which every rank's environment then carries; said in a line."""
        hosts = [h.name for h in placement.hosts]
        declared = {h.name: h.vars.get(INVENTORY_VAR) for h in placement.hosts}
        unmeasured = ", ".join(h for h in hosts if h not in self.measured)
        if not unmeasured:
            rates, source = dict(self.measured), f"bench {self.bench}"
        elif self.chosen:
            log(f"--batch-by auto: equal after all, as bench {self.bench} did not time {unmeasured} alone")
            return placement
        elif all(v not in (None, "") for v in declared.values()):
            try:
                rates = {h: float(inventory.conform(INVENTORY_VAR, v)) for h, v in declared.items()}
            except inventory.Invalid as exc:
                raise EdgetrainError(f"--batch-by speed: {exc}") from None
            source = f"the inventory's {INVENTORY_VAR}"
        else:
            undeclared = ", ".join(h for h, v in declared.items() if v in (None, ""))
            raise UsageError(f"--batch-by speed needs each node's speed: no bench of {program} on this inventory timed {unmeasured} "
                             f"alone, and {undeclared} set no {INVENTORY_VAR}",
                             f"run edgetrain bench {program} (with the same -i: it times each node alone), "
                             f"or set {INVENTORY_VAR} on every host (e.g. its img/s), or drop --batch-by speed")
        log(f"--batch-by speed: from {source}: " + ", ".join(f"{h} {rates[h]:,.4g}" for h in hosts))
        ranks = tuple(rates[h.name] / n for h, n in placement.ranks for _ in range(n))
        return replace(placement, speeds=ranks, speeds_from=source)


def from_bench(bench: BenchRecord | None, root: Path) -> NodeSpeeds:
    """Each node's one-node img/s in a bench (None: no bench): the median of its one-node runs
    beside the most others (the lab's concurrent references at its largest N, which time each of
    those nodes under the same neighbours); with none beside others, of its (t) run that timed each
    node alone, else of the N-loop's one-node runs. A run's node is the trial's own ``host`` where
    recorded, else its run record's; a run that cannot be read is passed over."""
    if bench is None:
        return NodeSpeeds()
    ones = [t for t in bench.trials if t.nodes == 1 and t.images_per_sec]
    most = max((t.beside for t in ones), default=0)
    timed = [t for t in ones if t.beside == most] if most or bench.each_node is None else bench.each_node
    found: dict[str, list[float]] = {}
    for t in timed:
        host = t.host
        if host is None:
            try:
                where = runs.find(root, t.run).record().placement
            except (EdgetrainError, OSError):
                continue
            host = where.hosts[0]["host"] if where is not None and where.hosts else None
        if host is not None and t.images_per_sec:
            found.setdefault(host, []).append(t.images_per_sec)
    rates = {host: statistics.median(values) for host, values in found.items()}
    return NodeSpeeds(MappingProxyType(rates), bench.name)


def planned(batch_by: BatchBy, root: Path, program: str, inventory: Path | None, log: Callable[[str], None]) -> NodeSpeeds | None:
    """What a run with ``--batch-by batch_by`` knows of its nodes' speeds (None: equal batches).
    ``auto`` takes the choice of the newest bench of this program on this inventory that made one
    (after timing every node alone), with the rates it chose from; with none, or where the run is
    placed on a node that bench did not time, equal batches. Each said in a line."""
    if batch_by is BatchBy.EQUAL:
        return None
    if batch_by is BatchBy.SPEED:
        return from_bench(record.latest(root, program, inventory), root)
    bench = record.latest(root, program, inventory, lambda b: b.batch_choice)
    if bench is None or bench.batch_choice is None:
        log(f"--batch-by auto: equal, as no bench of {program} on {record.described(inventory)} in {root} timed every node alone "
            f"(edgetrain bench {program} does)")
        return None
    c = bench.batch_choice
    log(f"--batch-by auto: {c.batch_by.value}, chosen by bench {bench.name} on {c.nodes} nodes: {c.said()}")
    return replace(from_bench(bench, root), chosen=True) if c.batch_by is BatchBy.SPEED else None
