"""A Slurm allocation as `edgetrain run` reads it: the compressed node list, the tasks per node, and
the inventory narrowed to the allocated nodes with their slots."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgetrain.controller import allocation, placement
from edgetrain.controller import config as configs
from edgetrain.controller import program as programs
from edgetrain.controller.inventory import Host, Inventory
from edgetrain.shared import runs
from edgetrain.shared.errors import EdgetrainError, UsageError
from edgetrain.shared.job_options import JobOptions
from tests.conftest import assert_one_line_error, edgetrain


@pytest.mark.parametrize("text, hosts", [
    ("node1", ["node1"]),
    ("node[1-3,5]", ["node1", "node2", "node3", "node5"]),
    ("pi[08-10],gpu1", ["pi08", "pi09", "pi10", "gpu1"]),
    ("rack[1-2]-n[01-02]", ["rack1-n01", "rack1-n02", "rack2-n01", "rack2-n02"]),
    ("a,b[2],c", ["a", "b2", "c"]),
])
def test_node_lists_expand_as_scontrol_show_hostnames_does(text, hosts):
    assert allocation.parse_hostlist(text) == hosts


@pytest.mark.parametrize("text", ["node[1-3", "node1]", "node[3-1]", "node[a-b]"])
def test_a_malformed_node_list_is_refused(text):
    with pytest.raises(ValueError):
        allocation.parse_hostlist(text)


@pytest.mark.parametrize("text, counts", [("1", [1]), ("2(x3),1", [2, 2, 2, 1]), ("4,1(x2)", [4, 1, 1])])
def test_tasks_per_node_expand(text, counts):
    assert allocation.parse_tasks(text) == counts


def _inventory() -> Inventory:
    hosts = tuple(Host(f"node{i}", f"198.18.0.{10 + i}", "x86_64", 1, "docker", groups=frozenset({"rpi"})) for i in range(1, 5))
    return Inventory(Path("hosts.yml"), hosts)


def test_outside_slurm_nothing_is_read_and_the_inventory_stands():
    assert allocation.current({"PATH": "/usr/bin"}) is None
    inv = _inventory()
    assert allocation.within(inv, None) is inv


def test_inside_an_allocation_the_run_gets_its_nodes_and_slots_alone(monkeypatch):
    monkeypatch.delenv("SLURM_CONF", raising=False)
    held = allocation.current({"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "node[4,2]", "SLURM_TASKS_PER_NODE": "2(x2)"})
    assert held == allocation.Allocation("7", (("node4", 2), ("node2", 2)))
    inv = allocation.within(_inventory(), held)
    assert [(h.name, h.slots) for h in inv.hosts] == [("node4", 2), ("node2", 2)]
    plan = placement.plan(inv, 3)
    assert [(h.name, n) for h, n in plan.ranks] == [("node4", 2), ("node2", 1)]
    with pytest.raises(EdgetrainError, match="needs more ranks than the 4 slots"):
        placement.plan(inv, 5)


def test_an_allocated_node_the_inventory_lacks_is_refused():
    held = allocation.Allocation("9", (("node1", 1), ("other7", 1)))
    with pytest.raises(EdgetrainError, match="Slurm job 9 holds other7, which inventory hosts.yml does not name"):
        allocation.within(_inventory(), held)


def test_counts_that_disagree_with_the_node_list_are_refused():
    with pytest.raises(EdgetrainError, match="counts 1 nodes"):
        allocation.current({"SLURM_JOB_ID": "3", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_TASKS_PER_NODE": "1"})


# -- hostile allocation variables (issue 80, item 10) ----------------------------------------------

@pytest.mark.parametrize("text", ["n[0-99][0-99][0-99]", "n[0-999][0-999][0-9]", "n[0-999999999]"])
def test_a_node_list_naming_more_nodes_than_any_cluster_is_refused_before_it_is_expanded(text):
    with pytest.raises(ValueError, match="names more than 10,000 nodes"):
        allocation.parse_hostlist(text)


@pytest.mark.parametrize("text", ["1(x99999999999)", "1(x10001)", "99999999999", "1(x2"])
def test_tasks_past_any_cluster_are_refused_before_they_are_counted_out(text):
    with pytest.raises(ValueError):
        allocation.parse_tasks(text)


def test_a_node_named_twice_is_refused(monkeypatch):
    """localhost,localhost with 3(x2) ran 6 ranks on 2 cores without the oversubscription warning."""
    monkeypatch.delenv("SLURM_CONF", raising=False)
    with pytest.raises(EdgetrainError, match="Slurm job 5: SLURM_JOB_NODELIST names localhost more than once"):
        allocation.current({"SLURM_JOB_ID": "5", "SLURM_JOB_NODELIST": "localhost,localhost", "SLURM_TASKS_PER_NODE": "3(x2)"})


def test_a_run_id_from_the_environment_is_matched_whole(tmp_path):
    """EDGETRAIN_RUN_ID=$'abc\\n' made a run directory named abc and a newline."""
    with pytest.raises(UsageError, match="is not a run id"):
        runs.create(tmp_path, "lenet", "abc\n")
    assert list(tmp_path.iterdir()) == []
    with pytest.raises(UsageError, match=r"from EDGETRAIN_RUN_ID\) is not a run id"):
        configs.resolve(programs.resolve("lenet", [], JobOptions()), run_id="abc\n")


# -- without --np, the allocation's tasks (issue 78, item 3) ---------------------------------------

@pytest.mark.parametrize("environ, tasks, said", [
    ({"SLURM_TASKS_PER_NODE": "2(x2)"}, 4, "SLURM_TASKS_PER_NODE"),
    ({"SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_NTASKS": "3"}, 3, "SLURM_NTASKS"),
])
def test_the_tasks_a_run_takes_are_those_asked_for(monkeypatch, environ, tasks, said):
    monkeypatch.delenv("SLURM_CONF", raising=False)
    held = allocation.current({"SLURM_JOB_ID": "8", "SLURM_JOB_NODELIST": "node[1-2]", **environ})
    assert (held.tasks, held.tasks_from) == (tasks, said)


@pytest.mark.parametrize("ntasks", ["5", "0", "x", "3\n"])
def test_ntasks_the_nodes_cannot_hold_is_refused(monkeypatch, ntasks):
    monkeypatch.delenv("SLURM_CONF", raising=False)
    with pytest.raises(EdgetrainError, match="SLURM_NTASKS=.* is not a number of tasks from 1 to the 4 its nodes hold"):
        allocation.current({"SLURM_JOB_ID": "8", "SLURM_JOB_NODELIST": "node[1-2]", "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_NTASKS": ntasks})


ALLOCATION = {"SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": "localhost", "SLURM_TASKS_PER_NODE": "2", "SLURM_CONF": ""}


def test_inside_an_allocation_a_run_without_np_takes_its_tasks_and_says_so_first(tmp_path):
    # --hang-timeout 0 is refused right after the ranks are chosen: nothing trains, the first line is seen.
    r = edgetrain("run", "lenet", "--hang-timeout", "0", env={**ALLOCATION, "EDGETRAIN_RUNS": str(tmp_path)})
    assert r.stdout.splitlines()[0] == "inside Slurm job 4242: --np 2, the tasks it holds (SLURM_TASKS_PER_NODE)", r.stdout + r.stderr
    assert_one_line_error(r, "--hang-timeout 0.0 must be a positive number of seconds", code=2)


def test_inside_an_allocation_np_past_its_tasks_stays_refused(tmp_path):
    r = edgetrain("run", "lenet", "--np", "3", env={**ALLOCATION, "EDGETRAIN_RUNS": str(tmp_path)})
    assert_one_line_error(r, "--np 3 needs more ranks than the 2 tasks Slurm job 4242 holds")
    assert "inside Slurm job" not in r.stdout
