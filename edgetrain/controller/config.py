"""A run's settings, resolved once from the flags into a frozen ``LaunchConfig``, apart from each
attempt's ``Attempt`` (what a restart changes: the ranks, the nodes left out, the resume point).

Every check that needs only the flags happens in ``resolve``; what needs the inventory or the
nodes waits for the launch (launch.prepare). `run` and `bench` build their configs here alike.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from types import MappingProxyType
from typing import Any

from edgetrain.controller.program import Program
from edgetrain.controller import strategies
from edgetrain.shared import runs, workdir
from edgetrain.controller.speeds import NodeSpeeds
from edgetrain.shared.sync import SyncMode
from edgetrain.shared.errors import UsageError
from edgetrain.controller.strategies import STRATEGIES, Strategy
from edgetrain.shared.strategies import DEFAULT

# The flags that pick a strategy's ports, by the strategy's port_option, with their defaults.
PORT_FLAGS = {s.port_option: s.default_port for s in STRATEGIES.values() if s.port_option}


@dataclass(frozen=True)
class RestartPolicy:
    """What follows a lost node (supervisor.restart_after)."""

    max_restarts: int = 0  # restarts on the nodes left after a node is lost
    min_nodes: int = 1  # never restart on fewer nodes than this
    rejoin: bool = False  # take a left-out node back at the first epoch after it answers again

    def check(self, program: Program) -> None:
        if self.max_restarts < 0:
            raise UsageError(f"--max-restarts {self.max_restarts} is not a number of restarts", "use 0 (the default: none) or more")
        if self.min_nodes < 1:
            raise UsageError(f"--min-nodes {self.min_nodes} is not a number of nodes", "use 1 or more")
        if self.rejoin and not self.max_restarts:
            raise UsageError("--rejoin takes back a node a restart left out, and no restart was asked for", "add --max-restarts K")
        if self.min_nodes > 1 and not self.max_restarts:
            raise UsageError(f"--min-nodes {self.min_nodes} limits restarts, and no restart was asked for",
                             "add --max-restarts K, or drop --min-nodes")
        if self.max_restarts and not program.keeps_checkpoints:
            raise UsageError(f"--max-restarts: {program.script} keeps no edgetrain checkpoints, so a restart could not resume it",
                             "use edgetrain.callbacks (Keras) or edgetrain.ddp (torch) in it, or drop --max-restarts")


@dataclass(frozen=True)
class LaunchConfig:
    """What the user asked for, resolved: the same for every attempt of a run."""

    program: Program
    np: int = 1
    strategy: Strategy = STRATEGIES[DEFAULT]
    port: int = 0  # the strategy's first port (its port_option's value; 0 where it takes none)
    ps: int | None = None  # tf-ps: parameter servers (None: the strategy's default)
    inventory: Path | None = None
    group: str | None = None
    per_node: int | None = None  # ranks per host at most (bench: one per node); None: the inventory's slots
    runtime: str | None = None  # None: the inventory's edgetrain_runtime
    runs_dir: Path = field(default_factory=runs.default_root)
    data_dir: Path | None = None
    resume: str | None = None
    run_id: str | None = None  # the new run's id, where `submit` chose it (None: made at the start)
    hang_timeout: float = 300.0
    max_workdir_bytes: int = workdir.DEFAULT_MAX_BYTES
    max_workdir_files: int = workdir.DEFAULT_MAX_FILES
    ship_secrets: bool = False  # ship what workdir.SECRETS would leave out
    restarts: RestartPolicy = RestartPolicy()
    speeds: NodeSpeeds | None = None  # --batch-by speed: what is known of the nodes' speeds; None: equal batches
    command: tuple[str, ...] = field(default_factory=lambda: ("edgetrain", *sys.argv[1:]))
    log: Callable[[str], None] = print

    def expendable(self, rank: int) -> bool:
        """Whether the run goes on without ``rank`` (its strategy's can_lose)."""
        return self.strategy.can_lose(rank, self.ps) is not None


def resolve(program: Program, *, strategy: str = DEFAULT, tf_port: int = PORT_FLAGS["tf_port"],
            master_port: int = PORT_FLAGS["master_port"], restarts: RestartPolicy = RestartPolicy(), **settings: Any) -> LaunchConfig:
    """The flags checked and resolved into a LaunchConfig; ``settings`` are its other fields."""
    chosen = strategies.named(strategy)
    ports = {"tf_port": tf_port, "master_port": master_port}
    for flag, port in ports.items():
        if not 1024 <= port <= 65000:
            raise UsageError(f"--{flag.replace('_', '-')} {port} must be between 1024 and 65000")
    config = LaunchConfig(program, strategy=chosen, port=ports[chosen.port_option] if chosen.port_option else 0,
                          restarts=restarts, **settings)
    if config.speeds is not None and config.speeds.chosen and (fixed := batches_fixed(chosen, program)):
        # auto promises the better of the two that can run, so a run that cannot split unevenly takes equal batches.
        config.log(f"--batch-by auto: equal after all, as {fixed[0]}")
        config = replace(config, speeds=None)
    check(config)
    return config


def check(config: LaunchConfig) -> None:
    """Every check of a config that needs nothing but the config."""
    if config.run_id is not None and not runs.RUN_ID.fullmatch(config.run_id):
        raise UsageError(f"{config.run_id!r} (from EDGETRAIN_RUN_ID) is not a run id", "unset EDGETRAIN_RUN_ID; submit sets it in its jobs")
    if not config.hang_timeout > 0 or config.hang_timeout == float("inf"):
        raise UsageError(f"--hang-timeout {config.hang_timeout} must be a positive number of seconds", "e.g. --hang-timeout 300")
    if not config.strategy.builtin_jobs and config.program.job is not None:
        raise UsageError(f"the built-in job {config.program.name} trains with {DEFAULT}", "drop --strategy, or run your own script")
    if config.program.is_script:
        config.strategy.check_args(config.program.args)
    config.strategy.check_tasks(config.np, config.ps)
    config.restarts.check(config.program)
    if config.speeds is not None and (fixed := batches_fixed(config.strategy, config.program)):
        raise UsageError(f"--batch-by speed sizes each rank's batch and weights its gradient, and {fixed[0]}", fixed[1])


def batches_fixed(strategy: Strategy, program: Program) -> tuple[str, str] | None:
    """Why this run's ranks cannot train batches of their own sizes, and what to do; None where they can."""
    if not strategy.uneven_batches:
        return f"--strategy {strategy.name} splits one global batch itself", "use --strategy horovod or torch, or drop --batch-by speed"
    if program.checkpoint_options.get("sync_mode") == SyncMode.WEIGHTS:
        return "--sync-mode weights averages models each rank trained at its own rate", "use --sync-mode grads, or drop --batch-by speed"
    return None


@dataclass(frozen=True)
class Attempt:
    """One attempt's plan: what a restart changes, apart from what the user asked."""

    np: int
    resume: str | None = None  # the run this attempt continues
    excluded: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))  # node -> why it is left out
    restarts_done: int = 0  # restarts this command made before this attempt

    @classmethod
    def first(cls, config: LaunchConfig, excluded: Mapping[str, str] | None = None) -> Attempt:
        return cls(config.np, config.resume, MappingProxyType(dict(excluded or {})))
