"""Inventory reading (through the real ansible-inventory) and rank placement."""

from __future__ import annotations

import os
import textwrap

import pytest

from edgetrain.controller import inventory, placement, strategies
from edgetrain.shared import mpi
from edgetrain.shared.errors import EdgetrainError, UsageError

CLUSTER = """
cluster:
  children:
    head:
      hosts:
        pi0: {ansible_host: 198.18.0.10}
    rpi:
      hosts:
        pi0: {}
        pi1: {ansible_host: 198.18.0.11}
        pi2: {ansible_host: 198.18.0.12, edgetrain_slots: 2}
  vars:
    edgetrain_arch: aarch64
    edgetrain_slots: 4
    edgetrain_iface: eth0
"""


def write(tmp_path, text: str):
    path = tmp_path / "hosts.yml"
    path.write_text(textwrap.dedent(text))
    return path


def test_local_default_is_this_machine():
    inv = inventory.load()
    [host] = inv.hosts
    assert host.name == "localhost" and host.is_local and host.runtime == "host"
    assert host.slots == os.cpu_count() and inv.head is host


def test_cluster_inventory(tmp_path):
    inv = inventory.load(write(tmp_path, CLUSTER))
    assert [h.name for h in inv.hosts] == ["pi0", "pi1", "pi2"]
    assert inv.head.name == "pi0" and inv.head.address == "198.18.0.10"
    assert [h.slots for h in inv.hosts] == [4, 4, 2] and all(h.arch == "aarch64" for h in inv.hosts)


def test_ini_inventory_works_too(tmp_path):
    path = tmp_path / "hosts.ini"
    path.write_text("[head]\nn1 ansible_host=198.18.0.20 edgetrain_arch=x86_64 edgetrain_slots=2\n[cluster:children]\nhead\n")
    [host] = inventory.load(path).hosts
    assert (host.name, host.slots, host.arch) == ("n1", 2, "x86_64")


@pytest.mark.parametrize(
    "text, message",
    [
        ("cluster:\n  hosts:\n    a: {edgetrain_arch: sparc}\n", "edgetrain_arch is sparc"),
        ("cluster:\n  hosts:\n    a: {edgetrain_arch: aarch64, edgetrain_slots: 0}\n", "edgetrain_slots is 0; it must be a number of slots from 1"),
        ("cluster:\n  hosts:\n    a: {edgetrain_arch: aarch64, edgetrain_slots: many}\n", "edgetrain_slots is 'many', not a number of slots"),
        ("cluster:\n  hosts:\n    a: {edgetrain_arch: aarch64, edgetrain_lease_seconds: 5}\n", "edgetrain_lease_seconds is 5; it must be a number of seconds from 30"),
        ("cluster:\n  hosts:\n    a: {edgetrain_arch: aarch64, edgetrain_runtime: vm}\n", "edgetrain_runtime"),
        ("cluster:\n  hosts: {}\n", "no hosts"),
        ("cluster:\n  hosts:\n    a: {edgetrain_arch: aarch64, ansible_port: abc}\n", "ansible_port is 'abc', not a port number"),
        ("cluster:\n  hosts:\n    a: {edgetrain_arch: aarch64, datasets_dir: data}\n", "datasets_dir 'data' must be an absolute path"),
        ("cluster:\n  hosts:\n    a: {edgetrain_arch: aarch64, edgetrain_mpi_env: UCX_TLS=tcp}\n", "edgetrain_mpi_env must be a mapping"),
    ],
)
def test_bad_inventories(tmp_path, text, message):
    with pytest.raises(EdgetrainError, match=message):
        inventory.load(write(tmp_path, text))


def test_missing_inventory(tmp_path):
    with pytest.raises(EdgetrainError, match="does not exist"):
        inventory.load(tmp_path / "nope")


def test_ranks_fill_hosts_in_order(tmp_path):
    plan = placement.plan(inventory.load(write(tmp_path, CLUSTER)), 6)
    assert [(h.name, n) for h, n in plan.ranks] == [("pi0", 4), ("pi1", 2)]
    assert plan.machinefile() == "198.18.0.10:4\n198.18.0.11:2\n"
    assert not plan.oversubscribed


def test_cluster_refuses_more_ranks_than_slots(tmp_path):
    with pytest.raises(EdgetrainError, match="--np 11 needs more ranks than the 10 slots"):
        placement.plan(inventory.load(write(tmp_path, CLUSTER)), 11)


def test_single_host_oversubscribes():
    inv = inventory.load()
    plan = placement.plan(inv, inv.hosts[0].slots + 2)
    assert plan.oversubscribed and plan.ranks[0][1] == inv.hosts[0].slots + 2


def test_np_zero():
    with pytest.raises(UsageError, match="--np 0"):
        placement.plan(inventory.load(), 0)


def test_cpu_and_gpu_never_mix(tmp_path):
    gpu = "    gpu:\n      hosts:\n        g0: {ansible_host: 198.18.0.30, edgetrain_arch: x86_64}\n  vars:"
    mixed = CLUSTER.replace("  vars:", gpu)
    inv = inventory.load(write(tmp_path, mixed))
    with pytest.raises(UsageError, match="mixes CPU and GPU"):
        placement.plan(inv, 2)
    assert [h.name for h in placement.plan(inv, 1, group="gpu").hosts] == ["g0"]
    assert all(not h.is_gpu for h in placement.plan(inv, 9, group="rpi").hosts)


def test_ranks_never_span_aarch64_and_x86_64(tmp_path):
    # An x86_64 CPU box listed among the Pis: fine until a job's ranks would reach it.
    mixed = CLUSTER.replace("pi2: {ansible_host: 198.18.0.12, edgetrain_slots: 2}",
                            "pi2: {ansible_host: 198.18.0.12, edgetrain_slots: 2}\n        nuc: {ansible_host: 198.18.0.20, edgetrain_arch: x86_64}")
    inv = inventory.load(write(tmp_path, mixed))
    assert [h.name for h in placement.plan(inv, 10).hosts] == ["pi0", "pi1", "pi2"]
    with pytest.raises(UsageError) as err:
        placement.plan(inv, 11)
    assert "aarch64: pi0, pi1, pi2; x86_64: nuc" in str(err.value) and "--group" in str(err.value)


def test_ranks_on_several_cpu_nodes_get_gloo_and_a_cycle_for_its_transport_unless_the_inventory_says_otherwise(tmp_path):
    inv = inventory.load(write(tmp_path, CLUSTER))
    assert placement.plan(inv, 4).rank_env == {}  # one host: no negotiation between nodes
    # One rank: its gradients skip Horovod, whose idle 1 ms cycle would only cost CPU.
    assert placement.plan(inv, 1).rank_env == {"HOROVOD_CYCLE_TIME": str(placement.SLOW_CYCLE_TIME_MS)}
    # Gloo sleeps while it waits: a short cycle, so that no gradient waits long for its turn.
    assert placement.plan(inv, 6).rank_env == {
        "HOROVOD_CYCLE_TIME": str(placement.GLOO_CYCLE_TIME_MS), "HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo",
        "HOROVOD_GLOO_IFACE": "eth0", "HOROVOD_GLOO_TIMEOUT_SECONDS": str(placement.GLOO_TIMEOUT_S)}
    mine = write(tmp_path, CLUSTER + "    edgetrain_mpi_env: {HOROVOD_CYCLE_TIME: 5, UCX_TLS: tcp, HOROVOD_CPU_OPERATIONS: mpi}\n")
    assert placement.plan(inventory.load(mine), 6).rank_env == {"HOROVOD_CYCLE_TIME": "5", "UCX_TLS": "tcp", "HOROVOD_CPU_OPERATIONS": "mpi"}
    # MPI polls while it waits: its cycle stays long, whoever chose MPI.
    no_iface = write(tmp_path, CLUSTER.replace("    edgetrain_iface: eth0\n", ""))
    assert placement.plan(inventory.load(no_iface), 6).rank_env == {"HOROVOD_CYCLE_TIME": str(placement.SLOW_CYCLE_TIME_MS)}
    mpi = write(tmp_path, CLUSTER + "    edgetrain_mpi_env: {HOROVOD_CONTROLLER: mpi, HOROVOD_CPU_OPERATIONS: mpi}\n")
    assert placement.plan(inventory.load(mpi), 6).rank_env["HOROVOD_CYCLE_TIME"] == str(placement.SLOW_CYCLE_TIME_MS)
    gloo = write(tmp_path, CLUSTER + "    edgetrain_mpi_env: {HOROVOD_CONTROLLER: gloo, HOROVOD_CPU_OPERATIONS: gloo}\n")
    assert placement.plan(inventory.load(gloo), 6).rank_env["HOROVOD_CYCLE_TIME"] == str(placement.GLOO_CYCLE_TIME_MS)


def test_a_run_that_can_lose_a_hosts_ranks_starts_one_hydra_job_per_host(tmp_path):
    """tf-ps, --np 7 --ps 1: pi0 holds the chief, the parameter server and two workers, pi1 four
    workers; only pi1's job is one the run goes on without. Horovod loses no rank: one job."""
    plan = placement.plan(inventory.load(write(tmp_path, CLUSTER)), 7)
    hydra = mpi.Hydra("mpirun", "/m", "eth0", True, {"K": "V"})
    tf_ps = strategies.named("tf-ps")
    jobs = plan.host_jobs(hydra, ["python", "-m", "w"], lambda rank: tf_ps.can_lose(rank, 1) is not None)
    assert [(j.host, j.ranks, j.expendable) for j in jobs] == [("pi0", (0, 1, 2, 3), False), ("pi1", (4, 5, 6), True)]
    assert jobs[1].argv == ("mpirun", "-hosts", "198.18.0.11:3", "-n", "3", "-iface", "eth0", "-bootstrap", "ssh", "-genv", "K", "V",
                            "-genv", mpi.RANK_BASE, "4", "-genv", mpi.WORLD_SIZE, "7", "python", "-m", "w")
    assert [tf_ps.can_lose(r, 1) for r in range(4)] == [None, None, "worker 0", "worker 1"]
    horovod = strategies.named("horovod")
    assert plan.host_jobs(hydra, ["w"], lambda rank: horovod.can_lose(rank) is not None) is None
    assert hydra.argv(7) == ["mpirun", "-f", "/m", "-n", "7", "-iface", "eth0", "-bootstrap", "ssh", "-genv", "K", "V"]


def test_a_rank_of_a_host_job_knows_its_place_in_the_run():
    assert mpi.rank_and_size({"PMI_RANK": "2", "PMI_SIZE": "3", mpi.RANK_BASE: "4", mpi.WORLD_SIZE: "7"}) == (6, 7)
    assert mpi.rank_and_size({"PMI_RANK": "2", "PMI_SIZE": "3"}) == (2, 3)
    assert mpi.rank_and_size({}) == (0, 1)
