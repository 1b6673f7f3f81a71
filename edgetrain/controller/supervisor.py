"""The attempt loop of a run, for `edgetrain run` and `edgetrain bench` alike: launch, watch it
end, and under --max-restarts start the next attempt on the nodes left (or with a node back).

Each attempt is prepared from the same LaunchConfig and its own Attempt plan; what the caller
shows while an attempt trains (a progress bar, a bench's lines) is the caller's ``attempt``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from types import MappingProxyType

from edgetrain.controller import inventory
from edgetrain.controller.config import Attempt, LaunchConfig
from edgetrain.controller.launch import Launch, Outcome, prepare
from edgetrain.shared.runs import Status


@dataclass(frozen=True)
class Restart:
    """What follows a failed attempt under --max-restarts: the next attempt (None: no restart)
    and the line that says why."""

    attempt: Attempt | None
    said: str


def supervise(config: LaunchConfig, attempt: Callable[[Launch], Outcome], say: Callable[[str], None],
              first: Attempt | None = None) -> tuple[Launch, Outcome]:
    """Every attempt of a run until one ends with no restart to follow: the last launch and its outcome.
    ``attempt`` trains a prepared launch (launch.execute, with what the caller shows meanwhile)."""
    plan = first or Attempt.first(config)
    while True:
        started = prepare(config, plan)
        outcome = attempt(started)
        restart = restart_after(started, outcome)
        started.recorder.ended_by(ended_by(outcome))
        if restart is not None:
            say(restart.said)
        if restart is None or restart.attempt is None:
            return started, outcome
        plan = restart.attempt


def ended_by(outcome: Outcome) -> str:
    """What ended an attempt, in a phrase for its record (``runs show`` lists it)."""
    if outcome.state is Status.COMPLETED:
        return "completed"
    if outcome.back is not None:
        return f"ended to take back {outcome.back.name}, which answered again"
    if outcome.lost is not None and outcome.lost.host is not None:
        return f"{outcome.lost.host.name} lost ({outcome.lost.why})"
    return outcome.why


def _taken_back(launch: Launch, host: inventory.Host) -> Attempt:
    """The attempt that resumes the run with ``host`` back: the ranks it can take, up to the --np asked for."""
    now = launch.attempt
    excluded = MappingProxyType({k: v for k, v in now.excluded.items() if k != host.name})
    return replace(now, resume=launch.run.id, np=min(now.np + host.slots, launch.config.np), excluded=excluded)


def restart_after(launch: Launch, outcome: Outcome) -> Restart | None:
    """A lost node is left out and the run resumes on the nodes left, from its newest intact
    checkpoint, while restarts and nodes remain; a rank's own failure is never retried (it would
    fail the same way). None where no restart was asked for, or the run did not fail."""
    policy, now, plan = launch.config.restarts, launch.attempt, launch.placement
    if policy.max_restarts == 0 or outcome.state is not Status.FAILED:
        return None
    if outcome.back is not None:
        nxt = _taken_back(launch, outcome.back)
        return Restart(nxt, f"edgetrain: {outcome.back.name} answers again; restarting on {len(plan.hosts) + 1} nodes with "
                            f"{nxt.np} ranks from the newest intact checkpoint")
    if outcome.lost is None or outcome.lost.host is None:
        return Restart(None, "edgetrain: no restart: no node was lost (a rank's own failure would happen again)")
    host, how = outcome.lost.host, outcome.lost.why
    left = [h for h in plan.hosts if h.name != host.name]
    if host.name == plan.head.name:
        return Restart(None, f"edgetrain: no restart: {host.name} was lost, and it holds rank 0 and the run's checkpoints")
    if len(left) < policy.min_nodes:
        return Restart(None, f"edgetrain: no restart: {len(left)} node(s) left after {host.name}, fewer than --min-nodes {policy.min_nodes}")
    if now.restarts_done >= policy.max_restarts:
        return Restart(None, f"edgetrain: no restart: {host.name} lost, and the {policy.max_restarts} restart(s) of --max-restarts are used")
    nxt = replace(now, resume=launch.run.id, np=now.np - len(plan.ranks_on(host)), restarts_done=now.restarts_done + 1,
                  excluded=MappingProxyType({**now.excluded, host.name: how}))
    return Restart(nxt, f"edgetrain: {host.name} lost ({how}); restarting on {', '.join(h.name for h in left)} with {nxt.np} ranks "
                        f"from the newest intact checkpoint ({policy.max_restarts - nxt.restarts_done} restart(s) left)")
