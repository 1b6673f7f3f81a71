"""site.yml against three namespace hosts over real SSH: converge, idempotence, MPI across nodes."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from lab.bench import allreduce_bandwidth, line_rate_mb_s

from .conftest import PROBE_IMAGE, ROOT

pytestmark = [pytest.mark.cluster, pytest.mark.slow]


def test_site_converges_on_fresh_nodes(converged, testbed, report):
    nodes = [n.name for n in testbed.state.nodes]
    assert set(nodes) <= set(converged.recap), converged.output[-3000:]
    # Fresh nodes: the hostname, /etc/hosts and MPI user changed on every one of them.
    assert all(converged.changed()[n] > 0 for n in nodes), converged.changed()
    report["first converge, 3 nodes"] = f"{converged.seconds:.0f} s"


def test_second_run_changes_nothing(converged, playbook, site_vars, report):
    again = playbook.run("playbooks/site.yml", "-e", f"@{site_vars}").check()
    report["re-run, 3 nodes"] = f"{again.seconds:.0f} s, changed={sum(again.changed().values())}"
    assert again.changed() and set(again.changed().values()) == {0}, again.changed_tasks()


def test_check_mode_on_converged_cluster(converged, playbook, site_vars):
    check = playbook.run("playbooks/site.yml", "--check", "-e", f"@{site_vars}").check()
    assert set(check.changed().values()) == {0}, check.changed_tasks()


def test_nodes_are_named_after_the_inventory(converged, testbed):
    for n in testbed.state.nodes:
        assert testbed.ssh(n, "hostname").stdout.strip() == n.name
        hosts = testbed.ssh(n, "cat /etc/hosts").stdout
        for other in testbed.state.nodes:
            assert f"{other.address} {other.name}\n" in hosts
        # The factory name no longer resolves to loopback (MPI would call head back on 127.0.1.1).
        assert "127.0.1.1" not in hosts
    assert "edgetrain cluster" not in Path("/etc/hosts").read_text(), "the machine's own /etc/hosts was edited"


def test_machinefile_on_head_lists_every_node(converged, testbed):
    machinefile = f"{testbed.state.dir}/mpi/machinefile"
    lines = [line for line in testbed.ssh(testbed.state.head, f"cat {machinefile}").stdout.splitlines() if not line.startswith("#")]
    assert lines == [f"{n.name}:1" for n in testbed.state.nodes]


def test_mpirun_reaches_three_distinct_hosts(converged, testbed):
    out = testbed.as_mpi_user(testbed.state.head, f"mpirun -f {testbed.state.dir}/mpi/machinefile -n 3 hostname")
    assert sorted(out.stdout.split()) == ["node1", "node2", "node3"]


def test_head_reaches_every_node_and_only_head_holds_the_cluster_key(converged, testbed):
    head, second, third = testbed.state.nodes
    out = testbed.as_mpi_user(head, "ssh -o BatchMode=yes -o StrictHostKeyChecking=yes node3 hostname")
    assert out.stdout.strip() == third.name
    mode = testbed.ssh(head, f"stat -c %a ~{testbed.state.mpi_user}/.ssh/id_ed25519").stdout.strip()
    assert mode == "600"
    key = f"~{testbed.state.mpi_user}/.ssh/id_ed25519"
    assert testbed.ssh(second, f"test -e {key}", check=False).returncode == 1, "a worker holds the cluster's private key"
    authorized = testbed.ssh(third, f"cat ~{testbed.state.mpi_user}/.ssh/authorized_keys").stdout
    assert f'restrict,from="{head.address},127.0.0.1" ' in authorized
    # With head's key, but from node2's address, node3 refuses: the key is head's alone. (The testbed's
    # directory is one for all nodes, so the copy is there on node2 too.)
    stolen = f"{testbed.state.dir}/stolen-key"
    user = testbed.state.mpi_user
    testbed.ssh(head, f"install -o {user} -m 600 {key} {stolen}")
    try:
        tried = testbed.as_mpi_user(second, f"ssh -i {stolen} -o BatchMode=yes -o StrictHostKeyChecking=yes node3 true", check=False)
        assert tried.returncode == 255 and "Permission denied" in tried.stderr, tried.stderr
    finally:
        testbed.ssh(head, f"rm -f {stolen}", check=False)


def test_private_key_never_printed(converged, testbed):
    key = testbed.ssh(testbed.state.head, f"cat ~{testbed.state.mpi_user}/.ssh/id_ed25519").stdout
    body = [line for line in key.splitlines() if line and not line.startswith("-----")]
    assert body, "no private key on head"
    assert not any(line in converged.output for line in body)


def test_allreduce_crosses_the_shaped_links(converged, testbed, report):
    head, second, third = testbed.state.nodes
    before = testbed.link_bytes()
    rows = allreduce_bandwidth(testbed, python=str(ROOT / ".venv/bin/python"))
    after = testbed.link_bytes()
    assert [r["bytes"] for r in rows] == [1 << 20, 4 << 20, 16 << 20, 64 << 20]
    assert all(r["hosts"] == ["node1", "node2"] for r in rows)
    moved = sum(r["bytes"] * (r["iters"] + 1) for r in rows)
    # Each rank sends and receives the whole buffer per allreduce, so both links carry it.
    for n in (head, second):
        assert after[n.name] - before[n.name] >= 2 * moved, (n.name, after[n.name] - before[n.name], moved)
    assert after[third.name] - before[third.name] < moved / 100
    best, line = max(r["mb_per_s"] for r in rows), line_rate_mb_s(testbed)
    # tbf caps what crosses a link: above line rate the traffic did not use it.
    assert line / 6 < best <= line * 1.05, rows
    report[f"allreduce, 2 nodes, tbf {testbed.state.link_mbit} Mbit/s"] = ", ".join(
        f"{r['bytes'] >> 20} MiB {r['mb_per_s']:.0f} MB/s" for r in rows) + f" (line rate {line:.0f} MB/s)"


def test_datasets_staged_and_verified(converged, testbed, site_vars, playbook):
    import yaml

    files = yaml.safe_load(Path(site_vars).read_text())["datasets_files"]
    for n in testbed.state.nodes:
        paths = " ".join(f"{testbed.state.dir}/datasets/{f['dest']}" for f in files)
        sums = testbed.ssh(n, f"sha256sum {paths}").stdout.split()[::2]
        assert sums == [f["sha256"] for f in files]

    # A corrupted copy is found by its checksum and replaced. The nodes share this file, so the
    # first node to get there repairs it for all of them.
    staged = Path(testbed.state.dir, "datasets", files[0]["dest"])
    staged.write_bytes(b"corrupt")
    repair = playbook.run("playbooks/site.yml", "--tags", "datasets", "-e", f"@{site_vars}").check()
    assert sum(repair.changed()[n.name] for n in testbed.state.nodes) >= 1, repair.changed()
    assert hashlib.sha256(staged.read_bytes()).hexdigest() == files[0]["sha256"]


def test_wrong_dataset_checksum_stops_before_copying(converged, testbed, site_vars, playbook, tmp_path):
    bad = tmp_path / "bad.yml"
    src = "/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz"
    bad.write_text(json.dumps({"datasets_files": [{"src": src, "dest": "bad/labels.gz", "sha256": "0" * 64}]}))
    result = playbook.run("playbooks/site.yml", "--tags", "datasets", "-e", f"@{bad}")
    assert result.returncode != 0
    assert f"datasets: {src} on the controller has sha256" in result.output
    assert not Path(testbed.state.dir, "datasets", "bad").exists()


def test_edgetrain_cli_installed_on_head(converged, testbed):
    out = testbed.ssh(testbed.state.head, f"{testbed.state.dir}/edgetrain-venv/bin/python -c 'import edgetrain; print(edgetrain.__version__)'")
    assert out.stdout.strip() == (ROOT / "edgetrain/__init__.py").read_text().split('__version__ = "')[1].split('"')[0]


def test_each_node_reaches_its_own_docker_engine(converged, testbed):
    if not testbed.state.docker:
        pytest.skip("dockerd is not installed")
    roots = set()
    for n in testbed.state.nodes:
        root = testbed.ssh(n, "docker info --format '{{.DockerRootDir}}'").stdout.strip()
        assert root == n.docker_root
        roots.add(root)
        config = json.loads(testbed.ssh(n, "cat /etc/docker/daemon.json").stdout)
        assert config["log-opts"]["max-size"] == "10m"
    assert len(roots) == 3


def test_image_archive_loaded_into_every_engine(converged, testbed):
    if not testbed.state.docker:
        pytest.skip("dockerd is not installed")
    for n in testbed.state.nodes:
        testbed.ssh(n, f"docker image inspect {PROBE_IMAGE}")
