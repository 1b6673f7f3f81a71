"""The monitor of an attempt as the reducer it is: each verdict the testbed's fault tests reach
(tests/cluster/test_faults.py), and the rest of what it judges, driven by a list of events - no
thread, no clock, no node - with what it asks launch to do, in order."""

from __future__ import annotations

from dataclasses import FrozenInstanceError
from pathlib import Path
from types import SimpleNamespace

import pytest

from edgetrain.controller import config as configs
from edgetrain.controller import launch, monitor, placement, supervisor
from edgetrain.controller import program as programs
from edgetrain.controller.containers import NodeState
from edgetrain.controller.inventory import Inventory
from edgetrain.controller.monitor import (Clock, Closed, Exited, Hurry, LookFor, Lose, OutOfReach, Progress, RecordFailed, RecordStart,
                                          Say, Show, Stop, Watch)
from edgetrain.controller.observers import Back, Looked, Output, RankEvent, StreamEnded
from edgetrain.controller.strategies import STRATEGIES
from edgetrain.shared.job_options import JobOptions
from edgetrain.shared.runs import Status

from .test_containers_unit import host

HOSTS = (host("node1", groups=("head", "rpi")), host("node2"), host("node3"))
NODE1, NODE2, NODE3 = HOSTS
PLAN = placement.plan(Inventory(Path("inv"), HOSTS), 3)
DARK = "unreachable: Connection timed out"


def facts(**changes) -> monitor.Facts:
    """A horovod run on HOSTS (a rank each, none it can lose), on a runtime whose nodes are watched."""
    return monitor.Facts(**{"hosts": tuple(PLAN.hosts), "np": PLAN.np, "ranks": {h.name: tuple(PLAN.ranks_on(h)) for h in PLAN.hosts},
                            "losable": {}, "expendable": frozenset(), "hang_timeout": 300.0, "started": 100.0, "has_nodes": True,
                            "settle_s": 29.0, **changes})


def fed(events, state: monitor.State | None = None, **changes) -> tuple[monitor.State, list]:
    """The state after ``events``, and every action on the way."""
    state = state or monitor.State(facts(**changes), last_output=100.0)
    done: list = []
    for event in events:
        state, actions = monitor.step(state, event)
        done += actions
    return state, done


def look(at: float, *states: NodeState, **kw) -> Looked:
    alive = {s.host.name for s in states}
    return Looked((*states, *(NodeState(h, True, "") for h in HOSTS if h.name not in alive)), at, **kw)


def rank(event: str, at: float = 101.0, **fields) -> RankEvent:
    return RankEvent({"event": event, **fields}, at)


STARTED = [rank("rank", rank=r) for r in range(3)]


def test_a_killed_worker_container_ends_the_attempt_naming_the_node():
    dead = NodeState(NODE3, False, "container exited with status 137")
    state, done = fed([*STARTED, look(110.0, dead)])
    assert state.watch is Watch.FAILING and state.lost == (NODE3, "container exited with status 137")
    assert done[-2:] == [Say("edgetrain: node3: container exited with status 137; ending this attempt"), Stop()]
    # mpirun's end that follows (its ranks were stopped) asks nothing more: the first verdict stands.
    state, done = fed([Exited(1, 111.0), look(112.0, NodeState(NODE2, False, "container gone"))], state)
    assert done == [] and state.lost.host is NODE3 and not state.awaiting(112.0)
    assert monitor.status(state, 1) is Status.FAILED


@pytest.mark.parametrize("node", [NODE3, NODE1], ids=["worker", "head"])
def test_a_link_gone_dark_ends_the_attempt_after_mpirun_if_need_be(node):
    """Hydra's ssh often goes first: mpirun's stream ends and mpirun exits while the watcher's look
    at the node still waits on ssh. Its end then awaits that look (two at most, hurried), and the
    node the look names out of reach is the verdict; the runtime learns it is out of reach before
    it is stopped, so its cleanup does not wait on it."""
    state, done = fed([*STARTED, look(104.0), StreamEnded(), Exited(255, 110.0)])
    assert not state.said.open and state.watch is Watch.WATCHING and done[-1] == Hurry()
    assert state.awaiting(110.0) and state.awaiting(138.9) and not state.awaiting(139.0)  # settle_s after the end
    state, done = fed([Clock(120.0), look(125.0, NodeState(node, False, DARK, out_of_reach=True))], state)
    assert done == [OutOfReach(frozenset({node.name})), Say(f"edgetrain: {node.name}: {DARK}; ending this attempt"), Stop()]
    assert state.lost == (node, DARK) and state.unreachable == {node.name} and not state.awaiting(125.0)
    outcome = launch.Outcome(SimpleNamespace(id="r1"), 255, monitor.status(state, 255), lost=state.lost)
    restart = supervisor.restart_after(SimpleNamespace(config=config(max_restarts=1), attempt=configs.Attempt.first(config()),
                                                       placement=PLAN, run=SimpleNamespace(id="r1")), outcome)
    said = {NODE3: f"edgetrain: node3 lost ({DARK}); restarting on node1, node2 with 2 ranks",
            NODE1: "edgetrain: no restart: node1 was lost, and it holds rank 0"}
    assert restart.said.startswith(said[node]), restart.said


def test_a_failed_mpirun_awaits_two_looks_at_most_and_none_on_a_runtime_without_nodes():
    state, done = fed([Exited(1, 110.0), look(111.0)], fed(STARTED)[0])
    assert done == [Hurry(), Hurry()] and state.awaiting(111.0)  # the next look at once
    state, _ = fed([look(112.0)], state)
    assert not state.awaiting(112.0) and state.watch is Watch.WATCHING and monitor.status(state, 1) is Status.FAILED
    state, done = fed([Exited(1, 110.0)], fed(STARTED, has_nodes=False)[0])
    assert done == [] and not state.awaiting(110.0)


def config(**kw) -> configs.LaunchConfig:
    return configs.resolve(programs.resolve("lenet", [], JobOptions()), np=3, inventory=Path("inv"), restarts=configs.RestartPolicy(**kw))


def test_a_left_out_node_is_looked_for_once_an_epoch_is_trained_and_taken_back_when_it_answers():
    """--rejoin, the attempt after node3 was left out: node3 is looked for at the start of each
    epoch after the first this attempt trained (and checkpointed); once it answers, the attempt
    ends to take it back, and the restart that follows says so."""
    steps = [rank("step", epoch=e, step=s) for e, s in ((3, 1), (3, 2), (4, 1), (4, 2), (5, 1))]
    state, done = fed(steps, look_for=("node3",))
    assert [a for a in done if isinstance(a, LookFor)] == [LookFor(("node3",))] * 2 and state.looked_at == 5
    assert [a.event for a in done if isinstance(a, Progress)] == [s.event for s in steps]  # each shown, in order
    assert state.said.first_step == 1.0  # from the launch (at 100) to the first step's line (at 101)
    state, done = fed([Back(NODE3)], state)
    assert state.watch is Watch.TAKING_BACK and state.back is NODE3 and done == [Stop()] and state.verdict is None
    assert monitor.status(state, 0) is Status.FAILED
    excluded = configs.Attempt(np=2, resume="r1", excluded={"node3": DARK})
    plan = placement.plan(Inventory(Path("inv"), HOSTS[:2]), 2)
    restart = supervisor.restart_after(SimpleNamespace(config=config(max_restarts=1, rejoin=True), attempt=excluded, placement=plan,
                                                       run=SimpleNamespace(id="r1")),
                                       launch.Outcome(SimpleNamespace(id="r1"), 1, Status.FAILED, back=state.back))
    assert restart.said.startswith("edgetrain: node3 answers again; restarting on 3 nodes with 3 ranks")
    _, done = fed(steps)  # no --rejoin, or no node left out
    assert not any(isinstance(a, LookFor) for a in done)


def test_a_node_slow_to_answer_is_warned_about_each_time_not_called_lost():
    slow = NodeState(NODE2, True, "its shared connection failed (Timeout, server not responding) but a new one answered")
    state, done = fed([*STARTED, look(110.0, slow), look(112.0), look(114.0, slow)])
    assert [a for a in done if not isinstance(a, Progress)] == [
        Say(f"edgetrain: warning: node2: {slow.detail} (1 time(s) this attempt)"),
        Say(f"edgetrain: warning: node2: {slow.detail} (2 time(s) this attempt)")]
    assert state.watch is Watch.WATCHING and state.unreachable == frozenset() and state.looks == 3
    assert monitor.status(state, 0) is Status.COMPLETED


def test_a_rank_failure_gives_the_other_ranks_failed_grace_then_ends_the_attempt():
    failed = rank("failed", at=110.0, rank=1, host="node2", error="ValueError: boom", time=1.0, pid=7)
    state, done = fed([*STARTED, failed, Output("Traceback", 115.0), Clock(110.0 + monitor.FAILED_GRACE)])
    assert state.watch is Watch.WATCHING and [f.error for f in state.said.reported] == ["ValueError: boom"]
    assert Show("Traceback") in done and Progress(failed.event) in done
    state, done = fed([Clock(110.1 + monitor.FAILED_GRACE)], state)
    assert state.verdict == (None, "rank 0 failed and the other ranks had not ended 30 s later") and done == [Stop()]
    assert state.lost is None  # no node to leave out: a restart would fail the same way


def test_a_hang_is_judged_on_the_clock_and_a_stall_warning_is_no_sign_of_life():
    stall = Output("... submitted to be reduced, gathered or broadcasted by subset of ranks ...", 150.0, stall=True)
    state, done = fed([*STARTED, Output("epoch 1", 120.0), stall, Clock(130.0)], hang_timeout=20.0)
    assert state.watch is Watch.WATCHING and state.last_output == 120.0
    state, done = fed([Clock(140.1)], state)
    assert state.verdict == (None, "hang: no output from any rank for 20 s (--hang-timeout)") and done == [Stop()]
    # A look judges the clock too, so a hang is found on either.
    state, _ = fed([*STARTED, look(140.1)], hang_timeout=20.0, started=0.0)
    assert state.verdict == (None, "hang: no output from any rank for 20 s (--hang-timeout)")


def test_a_rank_that_never_started_the_worker_fails_a_run_that_exited_0():
    state, done = fed([*STARTED[:2], Exited(0, 110.0)])
    assert state.verdict == (None, "mpirun exited with 0, but rank 2 never started edgetrain's worker: mpirun ran something else "
                                   "in its place (look at the inventory's edgetrain_mpi_env, and at the output above)")
    assert done[-1] == Stop() and monitor.status(state, 0) is Status.FAILED
    state, _ = fed([Exited(0, 110.0)])
    assert state.verdict.why.startswith("mpirun exited with 0, but no rank started")
    state, done = fed([Exited(0, 110.0)], fed(STARTED)[0])
    assert done == [] and monitor.status(state, 0) is Status.COMPLETED


def test_every_rank_finished_but_mpirun_failed_is_said_and_recorded_as_failed():
    state, done = fed([*STARTED, rank("finished"), Exited(3, 110.0)], has_nodes=False)
    assert Show("every rank finished its program, but mpirun exited with 3: the run is recorded as failed", stream=False) in done
    assert monitor.status(state, 3) is Status.FAILED


def test_the_stream_ended_stops_following_and_ctrl_c_stops_judging():
    state, _ = fed([Output("a", 101.0), StreamEnded()])
    assert not state.said.open and state.watch is Watch.WATCHING
    # Ctrl-C (or the end settled): what the observers posted last is followed for the nodes' reach only.
    dark = NodeState(NODE3, False, DARK, out_of_reach=True)
    state, done = fed([Closed(), Output("b", 102.0), look(400.0, dark), rank("step", epoch=9, step=1), Back(NODE3)], state)
    assert done == [OutOfReach(frozenset({"node3"}))]
    assert state.watch is Watch.WATCHING and state.verdict is None and state.unreachable == {"node3"} and state.looks == 0


def test_a_node_answers_again_and_is_no_longer_out_of_reach_and_a_failed_look_says_nothing_of_it():
    dark = NodeState(NODE3, False, DARK, out_of_reach=True)
    state, _ = fed([Closed(), look(1.0, dark)])
    state, done = fed([Looked(None, 2.0, failed="OSError: x")], state)
    assert done == [] and state.unreachable == {"node3"}
    state, done = fed([look(3.0)], state)
    assert done == [OutOfReach(frozenset())] and state.unreachable == frozenset()


def test_a_failed_look_is_said_once_and_watching_goes_on():
    failed = Looked(None, 110.0, failed="TimeoutExpired: Command '['sinfo']' timed out after 60 seconds")
    state, done = fed([*STARTED, failed, failed, look(111.0)])
    assert [a for a in done if isinstance(a, Say)] == [
        Say("edgetrain: warning: a look at the nodes failed (TimeoutExpired: Command '['sinfo']' timed out after 60 seconds); "
            "watching goes on")]
    assert state.watch is Watch.WATCHING and state.looks == 3


def test_a_node_slurm_took_ends_the_attempt():
    state, done = fed([*STARTED, look(110.0, taken={"node2": "Slurm took it from job 7 (down)"})])
    assert state.lost == (NODE2, "Slurm took it from job 7 (down)") and done[-2:] == [
        Say("edgetrain: node2: Slurm took it from job 7 (down); ending this attempt"), Stop()]


def test_the_programs_start_is_recorded_and_a_full_disk_ends_the_attempt():
    start = rank("start", versions={"tensorflow": "2.15.0"}, batches=[32, 16, 16])
    state, done = fed([start])
    assert done == [RecordStart({"tensorflow": "2.15.0"}, [32, 16, 16]), Progress(start.event)]
    state, done = fed([RecordFailed(), start, *STARTED, Exited(0, 110.0)], state)
    assert done[0] == Stop(end_watch=False) and not any(isinstance(a, RecordStart) for a in done)
    assert state.watch is Watch.WATCHING and monitor.status(state, 0) is Status.FAILED


def test_the_last_epochs_event_is_kept():
    epoch = rank("epoch", epoch=2, accuracy=0.9)
    state, _ = fed([rank("epoch", epoch=1), epoch, rank("step", epoch=3, step=1)])
    assert state.said.last == epoch.event


def test_a_step_returns_a_new_state_and_leaves_the_old_one_as_it_was():
    before = monitor.State(facts(), last_output=100.0)
    after, _ = monitor.step(before, look(110.0, NodeState(NODE3, False, DARK, out_of_reach=True)))
    assert before == monitor.State(facts(), last_output=100.0) and after.watch is Watch.FAILING
    with pytest.raises(FrozenInstanceError):
        after.watch = Watch.WATCHING  # type: ignore[misc]


def tf_ps_facts(hosts) -> monitor.Facts:
    """tf-ps over node1 (the chief), node2 (the parameter server), and workers on the rest: its
    facts as launch derives them."""
    plan = placement.plan(Inventory(Path("inv"), hosts), len(hosts))
    cfg = configs.LaunchConfig(programs.resolve("lenet", [], JobOptions()), strategy=STRATEGIES["tf-ps"], ps=1)
    fake = SimpleNamespace(config=cfg, attempt=configs.Attempt.first(cfg), placement=plan, runtime=SimpleNamespace(has_nodes=True),
                           started=100.0)
    fake.losable = launch.Launch.losable.fget(fake)
    return launch._facts(fake, 2.0)


def test_a_tf_ps_run_goes_on_without_a_node_of_workers_and_not_without_its_parameter_server():
    """A node of workers lost is said once, no longer watched and kept for the attempt's record,
    whichever saw it first (the watcher, or the lost-job event on mpirun's stream); the parameter
    server's node lost ends the attempt, and the first verdict stands."""
    node4 = host("node4")
    known = tf_ps_facts((*HOSTS, node4))
    assert dict(known.losable) == {"node3": "worker 0 (rank 2)", "node4": "worker 1 (rank 3)"} and known.expendable == {2, 3}
    gone = NodeState(NODE3, False, "container gone")
    state, done = fed([look(110.0, gone), rank("lost", host="node3", ranks=[2], why="its job ended")], monitor.State(known, 100.0))
    assert state.watch is Watch.WATCHING and state.went_on_without == {"node3": "container gone"}
    assert [a for a in done if not isinstance(a, Progress)] == [
        Lose(NODE3), Say("edgetrain: node3: container gone; the run goes on without its worker 0 (rank 2)")]
    state, done = fed([look(112.0, NodeState(NODE2, False, "container gone"))], state)
    assert state.lost == (NODE2, "container gone") and done[-1] == Stop()
    state, done = fed([Back(NODE3), look(114.0, NodeState(node4, False, "container gone"))], state)
    assert done == [] and state.back is None and state.lost.host is NODE2
    # Every worker lost: nothing to go on with, and the attempt ends at once rather than wait.
    state, done = fed([look(110.0, gone, NodeState(node4, False, "container gone"))], monitor.State(known, 100.0))
    assert state.verdict == (None, "every rank the run could go on without was lost (node3, node4), and it cannot go on with none")
    assert done[-1] == Stop() and state.lost is None
    # A rank on a node it went on without never had to start: mpirun's exit 0 completes the run.
    state, _ = fed([*(rank("rank", rank=r) for r in (0, 1, 3)), look(110.0, gone), Exited(0, 120.0)], monitor.State(known, 100.0))
    assert monitor.status(state, 0) is Status.COMPLETED
