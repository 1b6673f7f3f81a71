"""What a run's containers are allowed: the run key's line as a node installs it (its expiry from that
node's clock, from the head only), and the privileges docker gives them. The key is installed by
the real shell script into a temp dir; a node with a wrong clock is a `date` that answers for it."""

from __future__ import annotations

import calendar
import subprocess
import time
from pathlib import Path

import pytest

from edgetrain.controller import containers
from edgetrain.controller.inventory import Host
from edgetrain.shared.errors import EdgetrainError

NODE_NOW = 1_600_000_000  # 2020-09-13 12:26:40 UTC: a Pi whose clock stepped back years


def host(address: str) -> Host:
    return Host(name="pi1", address=address, arch="aarch64", slots=1, runtime="docker")


@pytest.fixture
def public(tmp_path) -> str:
    key = tmp_path / "id_ed25519"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "edgetrain-r1", "-f", str(key)], check=True)
    return key.with_suffix(".pub").read_text()


def install(tmp_path: Path, public: str, env: dict | None = None) -> str:
    ssh = tmp_path / "ssh"
    subprocess.run(["sh", "-c", containers.authorize_key(public, ["127.0.0.1", "198.18.0.11"], str(ssh))], env=env, check=True)
    authorized = ssh / "authorized_keys"
    assert authorized.stat().st_mode & 0o777 == 0o600
    # ssh-keygen reads it as sshd does: options, then a key it can fingerprint.
    subprocess.run(["ssh-keygen", "-l", "-f", str(authorized)], check=True, capture_output=True)
    return authorized.read_text()


def test_the_run_key_expires_a_day_after_the_nodes_clock_not_the_controllers(tmp_path, public):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "date").write_text(f'#!/bin/sh\nif [ "$1" = "+%s" ]; then echo {NODE_NOW}; else exec /bin/date "$@"; fi\n')
    (bin_ / "date").chmod(0o755)
    line = install(tmp_path, public, env={"PATH": f"{bin_}:/usr/bin:/bin"})
    expiry = time.strftime("%Y%m%d%H%MZ", time.gmtime(NODE_NOW + containers.KEY_LIFETIME))
    assert expiry == "202009141226Z"
    assert line == f'restrict,from="127.0.0.1,198.18.0.11",expiry-time="{expiry}" {public.strip()}\n'


def test_on_a_node_whose_clock_is_right_the_key_lasts_a_day(tmp_path, public):
    before = time.time()
    line = install(tmp_path, public)
    expiry = line.split('expiry-time="', 1)[1][:13]
    seconds = calendar.timegm(time.strptime(expiry, "%Y%m%d%H%MZ"))
    assert before + containers.KEY_LIFETIME - 60 <= seconds <= time.time() + containers.KEY_LIFETIME


def test_the_key_is_accepted_from_the_heads_cluster_address_else_its_inventory_address():
    assert containers.head_sources(host("198.18.0.11"), "10.0.0.11") == ["10.0.0.11", "127.0.0.1", "198.18.0.11"]
    assert containers.head_sources(host("198.18.0.11"), None) == ["127.0.0.1", "198.18.0.11"]


def test_a_head_known_by_name_only_is_resolved_not_left_to_loopback():
    # "127.2" is a name to ipaddress and the resolver's 127.0.0.2, with no query sent anywhere.
    assert containers.head_sources(host("127.2"), None) == ["127.0.0.1", "127.0.0.2"]


def test_a_head_name_that_does_not_resolve_is_refused():
    name = "a" * 64 + ".lan"  # a DNS label holds 63 bytes at most: refused before any query
    with pytest.raises(EdgetrainError, match=f"cannot resolve {name}, the address of pi1, to an IPv4 address") as caught:
        containers.head_sources(host(name), None)
    assert "set edgetrain_iface of pi1" in caught.value.fix


def test_containers_gain_no_privileges_and_have_a_pids_limit():
    argv = containers.docker_run_argv(host("198.18.0.11"), "edgetrain-r1", "r1", "/d/r1", "img", "198.18.0.11")
    options = argv[:argv.index("img")]
    assert options[options.index("--security-opt") + 1] == "no-new-privileges"
    assert int(options[options.index("--pids-limit") + 1]) == containers.PIDS_LIMIT > 0
