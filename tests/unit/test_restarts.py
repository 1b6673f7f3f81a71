"""What follows a failed attempt under --max-restarts, decided from what the attempt saw: the
next attempt (whose checks pass as the user's did), or the line that says why not."""

from __future__ import annotations

import queue
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

from edgetrain.controller import config as configs
from edgetrain.controller import launch, monitor, observers, placement, supervisor
from edgetrain.controller import program as programs
from edgetrain.controller.containers import NodeState
from edgetrain.controller.inventory import Inventory
from edgetrain.shared.job_options import JobOptions
from edgetrain.shared.runs import Status

from .test_containers_unit import host
from .test_monitor_reducer import DARK, facts, fed

HOSTS = (host("node1", groups=("head", "rpi")), host("node2"), host("node3"))


def attempt(config: configs.LaunchConfig, plan: configs.Attempt, lost: str | None = None, back: str | None = None):
    hosts = placement.plan(Inventory(Path("inv"), tuple(h for h in HOSTS if h.name not in plan.excluded)), plan.np)
    by_name = {h.name: h for h in HOSTS}
    outcome = launch.Outcome(SimpleNamespace(id="r1"), 1, Status.FAILED,
                             lost=monitor.Verdict(by_name[lost], "unreachable: Connection timed out") if lost else None,
                             back=by_name[back] if back else None)
    return SimpleNamespace(config=config, attempt=plan, placement=hosts, run=SimpleNamespace(id="r1")), outcome


def config(**kw) -> configs.LaunchConfig:
    return configs.resolve(programs.resolve("lenet", [], JobOptions()), np=3, inventory=Path("inv"),
                           restarts=configs.RestartPolicy(**kw))


def test_a_lost_node_is_left_out_until_the_restarts_asked_for_are_used():
    first = config(max_restarts=1, rejoin=True)
    nxt = supervisor.restart_after(*attempt(first, configs.Attempt.first(first), lost="node3"))
    assert nxt.attempt.np == 2 and dict(nxt.attempt.excluded) == {"node3": "unreachable: Connection timed out"}
    assert nxt.attempt.resume == "r1" and "restarting on node1, node2 with 2 ranks" in nxt.said and "(0 restart(s) left)" in nxt.said
    assert first.np == 3  # what the user asked stays as asked
    last = supervisor.restart_after(*attempt(first, nxt.attempt, lost="node2"))
    assert last.attempt is None and "the 1 restart(s) of --max-restarts are used" in last.said


def test_a_node_back_is_taken_back_with_its_ranks():
    first = config(max_restarts=1, rejoin=True)
    shrunk = supervisor.restart_after(*attempt(first, configs.Attempt.first(first), lost="node3")).attempt
    back = supervisor.restart_after(*attempt(first, shrunk, back="node3"))
    assert back.attempt.np == 3 and dict(back.attempt.excluded) == {} and "node3 answers again; restarting on 3 nodes" in back.said


def test_what_is_never_restarted():
    cfg = config(max_restarts=2)
    first = configs.Attempt.first(cfg)
    assert supervisor.restart_after(*attempt(config(), first, lost="node3")) is None  # no restart asked for
    assert "no node was lost" in supervisor.restart_after(*attempt(cfg, first)).said
    assert "node1 was lost, and it holds rank 0" in supervisor.restart_after(*attempt(cfg, first, lost="node1")).said
    assert "fewer than --min-nodes 3" in supervisor.restart_after(*attempt(config(max_restarts=2, min_nodes=3), first, lost="node2")).said


def _driven(hang_timeout: float = 300.0, runtime=None):
    """The monitor of a horovod run on HOSTS as launch drives it, with an empty queue, and its runtime's stops."""
    stopped: list[float] = []
    plan = placement.plan(Inventory(Path("inv"), HOSTS), 3)
    runtime = runtime or SimpleNamespace(has_nodes=True, stop=lambda: stopped.append(time.monotonic()))
    cfg = configs.LaunchConfig(programs.resolve("lenet", [], JobOptions()), np=3, hang_timeout=hang_timeout, log=lambda line: None)
    fake = SimpleNamespace(config=cfg, attempt=configs.Attempt.first(cfg), placement=plan, losable={}, runtime=runtime,
                           started=time.monotonic())
    events: queue.Queue = queue.Queue()
    return events, fake, stopped


def test_the_watcher_outlives_a_look_that_raises_anything_and_says_so_once():
    """Issue 80, item 4: a Slurm controller that does not answer made the look raise
    TimeoutExpired; the watcher, which caught only EdgetrainError, died with the node checks."""
    looks = []

    def states():
        looks.append(time.monotonic())
        if len(looks) <= 2:
            raise subprocess.TimeoutExpired(["sinfo"], 60)
        return []

    events: queue.Queue = queue.Queue()
    runtime = SimpleNamespace(states=states, plan=SimpleNamespace(hosts=HOSTS), nodes=None)
    watcher = observers.Watcher(runtime, "r1", events.put, interval=0.01)
    watcher.start()
    try:
        seen = [events.get(timeout=10) for _ in range(4)]
    finally:
        watcher.end()
        watcher.join(timeout=10)
    assert [e.failed for e in seen[:2]] == ["TimeoutExpired: Command '['sinfo']' timed out after 60 seconds"] * 2
    assert seen[3].failed is None and seen[3].states == ()
    state, done = fed(seen, monitor.State(facts(), last_output=time.monotonic()))
    assert [a.line for a in done if isinstance(a, monitor.Say)] == [
        "edgetrain: warning: a look at the nodes failed (TimeoutExpired: Command '['sinfo']' timed out after 60 seconds); watching goes on"]
    assert state.watch is monitor.Watch.WATCHING and not any(isinstance(a, monitor.Stop) for a in done)


def test_a_hang_is_judged_on_the_clock_without_any_look():
    """Item 4: the hang checks ran on the watcher's looks; with no watcher left, a hung job held its nodes forever."""
    events, fake, stopped = _driven(hang_timeout=0.05)
    watched = launch.Watched(fake, observers.Observers(events, SimpleNamespace(), SimpleNamespace(interval=2.0, end=lambda: None)),
                             lambda event: None, lambda line: None)
    time.sleep(0.1)
    watched._next(0.01)  # nothing posted: no output, no look
    assert watched.state.verdict == (None, "hang: no output from any rank for 0 s (--hang-timeout)") and len(stopped) == 1


def test_a_dark_link_is_noticed_within_half_a_minute_by_the_timeouts_that_decide_it():
    # The next look, its check through the shared connection, the new connection's second opinion:
    # wall-clock limits on processes, so a busy machine cannot stretch them (README: half a minute).
    assert observers.DARK_LINK_NOTICED_S <= 30


def test_no_look_begins_after_the_one_whose_verdict_ends_the_attempt():
    """The head cut off: mpirun's stream ends (its ssh went with the link) while the watcher's look
    at the head still waits on ssh. The monitor awaits that look's verdict, and the attempt ends
    without a second look at the dark head (each waits on ssh again, and ending the attempt waits
    for the look under way: 45 s where the verdict took 27)."""
    head = HOSTS[0]
    looks: list[float] = []

    def states():
        looks.append(time.monotonic())
        time.sleep(0.6)  # ssh's timeout, then the new connection's, scaled down
        return [NodeState(h, h is not head, DARK if h is head else "", out_of_reach=h is head) for h in HOSTS]

    runtime = SimpleNamespace(states=states, has_nodes=True, out_of_reach=lambda names: None)
    events, fake, stopped = _driven(runtime=runtime)
    runtime.stop = lambda: stopped.append(time.monotonic())
    watcher = observers.Watcher(runtime, "r1", events.put, interval=0.05)
    found = observers.Observers(events, SimpleNamespace(join=lambda timeout: None), watcher)
    watched = launch.Watched(fake, found, lambda event: None, lambda line: None)
    watcher.start()
    while not looks:  # a look under way when mpirun ends
        time.sleep(0.01)
    watched.settle(255)
    settled = time.monotonic()
    found.stop()
    ended = time.monotonic()
    assert watched.state.lost.host is head and len(stopped) == 1
    assert len(looks) == 1, looks  # none after the verdict's
    assert ended - settled < 0.3, ended - settled  # no look under way to wait for


def test_what_the_watcher_saw_last_tells_the_cleanup_which_nodes_are_out_of_reach_and_judges_nothing():
    """A look posted as the attempt ended (mpirun exited 0, or Ctrl-C) is not judged - the attempt
    is over - but the cleanup that follows does not wait on a node it found out of reach."""
    told, stopped = [], []
    runtime = SimpleNamespace(has_nodes=True, out_of_reach=told.append, stop=lambda: stopped.append(True))
    events, fake, _ = _driven(runtime=runtime)
    idle = SimpleNamespace(interval=2.0, end=lambda: None, join=lambda timeout: None)
    watched = launch.Watched(fake, observers.Observers(events, SimpleNamespace(join=lambda timeout: None), idle),
                             lambda event: None, lambda line: None)
    events.put(observers.Looked((NodeState(HOSTS[2], False, DARK, out_of_reach=True),), time.monotonic()))
    watched.close()
    assert told == [frozenset({"node3"})] and stopped == [] and watched.state.verdict is None


def test_each_attempt_is_recorded_with_what_ended_it():
    """The phrase `runs show` prints on each attempt's line: a lost node with how, a node taken
    back, a rank's own failure (its finding), an interrupt, success."""
    cfg = config(max_restarts=1, rejoin=True)
    _, lost = attempt(cfg, configs.Attempt.first(cfg), lost="node3")
    _, back = attempt(cfg, configs.Attempt.first(cfg), back="node3")
    _, failed = attempt(cfg, configs.Attempt.first(cfg))
    failed.finding = SimpleNamespace(rank=2, host="node2", error="exited with 137")
    assert supervisor.ended_by(lost) == "node3 lost (unreachable: Connection timed out)"
    assert supervisor.ended_by(back) == "ended to take back node3, which answered again"
    assert supervisor.ended_by(failed) == "rank 2 on node2 failed: exited with 137"
    assert supervisor.ended_by(launch.Outcome(None, 130, Status.INTERRUPTED)) == "interrupted"
    assert supervisor.ended_by(launch.Outcome(None, 0, Status.COMPLETED)) == "completed"
