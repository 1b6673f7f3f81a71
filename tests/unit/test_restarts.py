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
from edgetrain.controller.inventory import Inventory
from edgetrain.shared.job_options import JobOptions
from edgetrain.shared.runs import Status
from edgetrain.controller.strategies import STRATEGIES

from .test_containers_unit import host

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


def test_a_tf_ps_run_goes_on_without_a_node_of_workers_and_not_without_its_parameter_server():
    """The watcher's verdict on a lost node: tf-ps over node1 (the chief), node2 (the parameter
    server) and node3 and node4 (workers). A node of workers lost is said once, no longer watched and
    kept for the attempt's record, whichever saw it first (the watcher, or the lost-job event on
    mpirun's stream); the parameter server's node lost ends the attempt."""
    hosts = (*HOSTS, host("node4"))
    plan = placement.plan(Inventory(Path("inv"), hosts), 4)
    said, lost_hosts, stopped = [], [], []
    dead: set[str] = set()
    runtime = SimpleNamespace(states=lambda: [SimpleNamespace(host=h, alive=h.name not in dead, detail="container gone" if h.name in dead else "")
                                              for h in hosts],
                              lose=lost_hosts.append, stop=lambda: stopped.append(True))
    cfg = configs.LaunchConfig(programs.resolve("lenet", [], JobOptions()), strategy=STRATEGIES["tf-ps"], ps=1, log=said.append)
    fake = SimpleNamespace(config=cfg, attempt=configs.Attempt.first(cfg), placement=plan, runtime=runtime)
    fake.losable = launch.Launch.losable.fget(fake)
    assert fake.losable == {"node3": "worker 0 (rank 2)", "node4": "worker 1 (rank 3)"}
    watched = monitor.Monitor(fake, lambda event: None, lambda line: None)

    def look() -> None:
        watched.handle(observers.Looked(tuple(runtime.states()), time.monotonic()))

    dead.add("node3")
    look()
    assert watched.watch is monitor.Watch.WATCHING and watched.verdict is None and stopped == []
    watched.handle(observers.RankEvent({"event": "lost", "host": "node3", "ranks": [2], "why": "its job ended"}, time.monotonic()))
    assert watched.went_on_without == {"node3": "container gone"} and [h.name for h in lost_hosts] == ["node3"]
    assert said == ["edgetrain: node3: container gone; the run goes on without its worker 0 (rank 2)"]
    dead.add("node2")
    look()
    assert watched.watch is monitor.Watch.FAILING and watched.lost.host.name == "node2" and stopped == [True]
    # The first verdict stands: what is seen later changes nothing, and stops nothing again.
    watched.handle(observers.Back(HOSTS[2]))
    look()
    assert watched.verdict.host.name == "node2" and watched.back is None and stopped == [True]
    assert watched.status(0) is Status.FAILED
    # Every worker lost: nothing to go on with, and the attempt ends at once rather than wait.
    watched, stopped[:] = monitor.Monitor(fake, lambda event: None, lambda line: None), []
    dead.discard("node2")
    dead.add("node4")
    look()
    assert stopped == [True] and watched.verdict == (None, (
        "every rank the run could go on without was lost (node3, node4), and it cannot go on with none"))
    assert watched.lost is None


def _watched(hang_timeout: float = 300.0):
    """A monitor of a horovod run on HOSTS, its runtime's stops and the lines it said."""
    said, stopped = [], []
    plan = placement.plan(Inventory(Path("inv"), HOSTS), 3)
    cfg = configs.LaunchConfig(programs.resolve("lenet", [], JobOptions()), np=3, hang_timeout=hang_timeout, log=said.append)
    fake = SimpleNamespace(config=cfg, attempt=configs.Attempt.first(cfg), placement=plan, losable={},
                           runtime=SimpleNamespace(stop=lambda: stopped.append(True)))
    return monitor.Monitor(fake, lambda event: None, lambda line: None), stopped, said


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
    watched, stopped, said = _watched()
    for e in seen:
        watched.handle(e)
    assert said == ["edgetrain: warning: a look at the nodes failed (TimeoutExpired: Command '['sinfo']' timed out after 60 seconds); "
                    "watching goes on"]
    assert watched.watch is monitor.Watch.WATCHING and stopped == []


def test_a_hang_is_judged_on_the_clock_without_any_look():
    """Item 4: the hang checks ran on the watcher's looks; with no watcher left, a hung job held its nodes forever."""
    watched, stopped, _ = _watched(hang_timeout=0.05)
    time.sleep(0.1)
    watched._next(queue.Queue(), 0.01)  # nothing posted: no output, no look
    assert watched.verdict == (None, "hang: no output from any rank for 0 s (--hang-timeout)") and stopped == [True]
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
    plan = placement.plan(Inventory(Path("inv"), HOSTS), 3)
    looks, stopped = [], []

    def states():
        looks.append(time.monotonic())
        time.sleep(0.6)  # ssh's timeout, then the new connection's, scaled down
        return [SimpleNamespace(host=h, alive=h is not head, detail="unreachable: Connection timed out" if h is head else "")
                for h in plan.hosts]

    runtime = SimpleNamespace(states=states, has_nodes=True, stop=lambda: stopped.append(time.monotonic()))
    cfg = configs.LaunchConfig(programs.resolve("lenet", [], JobOptions()), log=lambda line: None)
    fake = SimpleNamespace(config=cfg, attempt=configs.Attempt.first(cfg), placement=plan, runtime=runtime, losable={})
    watched = monitor.Monitor(fake, lambda event: None, lambda line: None)
    events = queue.Queue()
    watcher = observers.Watcher(runtime, "r1", events.put, interval=0.05)
    watched.watcher = watcher
    found = monitor.Observers(events, SimpleNamespace(join=lambda timeout: None), watcher)
    watcher.start()
    while not looks:  # a look under way when mpirun ends
        time.sleep(0.01)
    watched.settle(255, found)
    settled = time.monotonic()
    found.stop()
    ended = time.monotonic()
    assert watched.lost.host is head and len(stopped) == 1
    assert len(looks) == 1, looks  # none after the verdict's
    assert ended - settled < 0.3, ended - settled  # no look under way to wait for


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
