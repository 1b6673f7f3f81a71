"""What follows a failed attempt under --max-restarts, decided from what the attempt saw: the
next request (which must pass the same checks as the user's), or the line that says why not."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from edgetrain.controller import launch, placement
from edgetrain.controller import program as programs
from edgetrain.controller.inventory import Inventory
from edgetrain.shared.job_options import JobOptions
from edgetrain.shared.runs import Status

from .test_containers_unit import host

HOSTS = (host("node1", groups=("head", "rpi")), host("node2"), host("node3"))


def attempt(req: launch.RunRequest, lost: str | None = None, back: str | None = None):
    plan = placement.plan(Inventory(Path("inv"), tuple(h for h in HOSTS if h.name not in req.excluded)), req.np)
    by_name = {h.name: h for h in HOSTS}
    outcome = launch.Outcome(SimpleNamespace(id="r1"), 1, Status.FAILED,
                             lost=(by_name[lost], "unreachable: Connection timed out") if lost else None,
                             back=by_name[back] if back else None)
    return SimpleNamespace(request=req, placement=plan, run=SimpleNamespace(id="r1")), outcome


def request(**kw) -> launch.RunRequest:
    return launch.RunRequest(program=programs.resolve("lenet", [], JobOptions()), np=3, inventory=Path("inv"), **kw)


def test_a_lost_node_is_left_out_until_the_restarts_asked_for_are_used():
    first = request(max_restarts=1, rejoin=True)
    nxt = launch.restart_after(*attempt(first, lost="node3"))
    assert nxt.request.np == 2 and nxt.request.excluded == {"node3": "unreachable: Connection timed out"}
    assert nxt.request.resume == "r1" and "restarting on node1, node2 with 2 ranks" in nxt.said and "(0 restart(s) left)" in nxt.said
    launch._check_request(nxt.request)  # the next attempt's checks pass: the request is still what the user asked
    last = launch.restart_after(*attempt(nxt.request, lost="node2"))
    assert last.request is None and "the 1 restart(s) of --max-restarts are used" in last.said


def test_a_node_back_is_taken_back_with_its_ranks():
    shrunk = launch.restart_after(*attempt(request(max_restarts=1, rejoin=True), lost="node3")).request
    back = launch.restart_after(*attempt(shrunk, back="node3"))
    assert back.request.np == 3 and back.request.excluded == {} and "node3 answers again; restarting on 3 nodes" in back.said
    launch._check_request(back.request)


def test_what_is_never_restarted():
    req = request(max_restarts=2)
    assert launch.restart_after(*attempt(request(), lost="node3")) is None  # no restart asked for
    assert "no node was lost" in launch.restart_after(*attempt(req)).said
    assert "node1 was lost, and it holds rank 0" in launch.restart_after(*attempt(req, lost="node1")).said
    assert "fewer than --min-nodes 3" in launch.restart_after(*attempt(request(max_restarts=2, min_nodes=3), lost="node2")).said
