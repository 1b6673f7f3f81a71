"""Horovod's rendezvous and Gloo listen on the cluster interface only: the rendezvous server on rank
0's cluster address (a real Horovod server, on loopback addresses here), Gloo told the interface
whoever picked it, and no Gloo at all where no interface is named."""

from __future__ import annotations

import errno
import http.client
import socket

import pytest
from horovod.runner.common.util.hosts import get_host_assignments, parse_hosts

from edgetrain.controller import inventory, placement
from edgetrain.rank import rendezvous

from .test_placement import write


def test_the_rendezvous_listens_on_the_cluster_address_alone():
    server = rendezvous.serve("127.0.0.2", get_host_assignments(parse_hosts("127.0.0.2:2"), 2))
    try:
        address, port = server.server_address
        assert address == "127.0.0.2"
        ask = http.client.HTTPConnection("127.0.0.2", port, timeout=10)
        ask.request("GET", "/global/nothing")
        assert ask.getresponse().status == 404  # Horovod's store answers: no such key yet
        with pytest.raises(ConnectionRefusedError) as refused, socket.create_connection(("127.0.0.1", port), timeout=10):
            pass
        assert refused.value.errno == errno.ECONNREFUSED
    finally:
        server.shutdown()


def test_gloo_without_a_cluster_interface_is_refused_on_the_rank():
    env = {"HOROVOD_CONTROLLER": "gloo", "HOROVOD_CPU_OPERATIONS": "gloo", "PMI_SIZE": "2"}
    with pytest.raises(RuntimeError, match="Gloo asked for without HOROVOD_GLOO_IFACE: it would listen on every address"):
        rendezvous.set_up(env)


def test_gloo_the_inventory_picks_is_told_the_cluster_interface(tmp_path):
    text = ("cluster:\n  hosts:\n    pi0: {ansible_host: 198.18.0.10, edgetrain_arch: aarch64, edgetrain_slots: 2, edgetrain_iface: eth0,\n"
            "          edgetrain_mpi_env: {HOROVOD_CONTROLLER: gloo, HOROVOD_CPU_OPERATIONS: gloo}}\n")
    env = placement.plan(inventory.load(write(tmp_path, text)), 2).rank_env
    assert env["HOROVOD_GLOO_IFACE"] == "eth0"
