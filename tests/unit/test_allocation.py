"""A Slurm allocation as `edgetrain run` reads it: the compressed node list, the tasks per node, and
the inventory narrowed to the allocated nodes with their slots."""

from __future__ import annotations

from pathlib import Path

import pytest

from edgetrain.controller import allocation, placement
from edgetrain.controller.inventory import Host, Inventory
from edgetrain.shared.errors import EdgetrainError


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
