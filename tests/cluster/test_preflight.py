"""Each inventory mistake stops site.yml in preflight, with its own message, before any node is touched."""

from __future__ import annotations

import pytest
import yaml

pytestmark = pytest.mark.cluster


def _inventory(bed, mutate) -> dict:
    """The testbed's own inventory (real, reachable nodes), with one mistake in it."""
    inv = yaml.safe_load(open(bed.state.inventory))
    mutate(inv["all"]["children"]["cluster"])
    return inv


def _two_heads(cluster):
    cluster["children"]["head"]["hosts"]["node2"] = {}


def _duplicate_hostnames(cluster):
    # Two boards whose inventory names differ only by domain would both be called "node2".
    rpi = cluster["children"]["rpi"]["hosts"]
    rpi["node2.lab"] = rpi.pop("node2")
    rpi["node2.shelf"] = rpi.pop("node3")


def _unknown_arch(cluster):
    cluster["children"]["rpi"]["hosts"]["node3"]["edgetrain_arch"] = "armv7l"


def _empty_cluster(cluster):
    cluster["children"] = {"head": {"hosts": {}}, "rpi": {"hosts": {}}}


def _zero_slots(cluster):
    cluster["children"]["rpi"]["hosts"]["node2"]["edgetrain_slots"] = 0


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (_two_heads, "preflight: group 'head' must hold exactly one host of group 'cluster' (it runs mpirun and holds rank 0); it holds 2: node1, node2"),
        (_duplicate_hostnames, "preflight: duplicate hostname 'node2': hosts node2.lab, node2.shelf would all be called node2"),
        (_unknown_arch, "preflight: host node3 has edgetrain_arch 'armv7l'"),
        (_empty_cluster, "preflight: group 'cluster' has no hosts"),
        (_zero_slots, "preflight: host node2 has edgetrain_slots '0'"),
    ],
    ids=["two-heads", "duplicate-hostnames", "unknown-arch", "empty-cluster", "zero-slots"],
)
def test_bad_inventory_fails_before_any_node(testbed, playbook, tmp_path, mutate, message):
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump(_inventory(testbed, mutate)))
    result = playbook.run("playbooks/site.yml", inventory=str(path))
    assert result.returncode != 0
    assert message in " ".join(result.output.split()), result.output[-3000:]
    # Only the controller ran anything: no node was even asked for its facts.
    assert set(result.recap) == {"localhost"}, result.recap
    assert result.recap["localhost"]["failed"] == 1


def test_gpu_host_without_nvidia_gpu_fails_before_any_change(testbed, playbook, tmp_path):
    def node3_is_gpu(cluster):
        cluster["children"]["gpu"] = {"hosts": {"node3": cluster["children"]["rpi"]["hosts"].pop("node3")}}

    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump(_inventory(testbed, node3_is_gpu)))
    result = playbook.run("playbooks/site.yml", inventory=str(path))
    assert result.returncode != 0
    assert "preflight: node3 is in group gpu but has no NVIDIA GPU (/dev/nvidia0 is missing)" in " ".join(result.output.split())
    assert "PLAY [Base system" not in result.output
    assert all(r["changed"] == 0 for r in result.recap.values()), result.recap
