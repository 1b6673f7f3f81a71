"""`edgetrain doctor|run|collect -i` on the testbed: ranks in the edgetrain image on three nodes.

The nodes are provisioned by site.yml (the session's `converged`), each runs its own Docker engine,
gets the amd64 image through `edgetrain images distribute`, and keeps its datasets and run
directories in its own private /root, so nothing a node holds is visible to another except over
the network. Links are shaped to 1 Gbit/s and UCX is told to use TCP, so MPI traffic crosses them.
"""

from __future__ import annotations

import json
import time

import pytest

from edgetrain.shared import runs
from tests.conftest import edgetrain


pytestmark = [pytest.mark.cluster, pytest.mark.docker, pytest.mark.slow]


def test_doctor_checks_every_node_and_probes_mpi_in_containers(cluster):
    r = edgetrain("doctor", "-i", cluster.inventory, env=cluster.env)
    assert r.returncode == 0, r.stdout + r.stderr
    for node in ("node1", "node2", "node3"):
        for check in ("ssh", "docker", "image", "dataset", "disk"):
            assert any(line.split()[:3] == [node, check, "ok"] for line in r.stdout.splitlines()), (node, check, r.stdout)
    assert "MPI probe: 4 ranks, allreduce ok" in r.stdout
    assert "TensorFlow" in r.stdout and "2.15.1" in r.stdout and "0.28.1" in r.stdout
    assert cluster.leftovers() == {}


@pytest.fixture(scope="module")
def trained(cluster, report) -> str:
    """One LeNet run across the three nodes, its link traffic measured."""
    before, runs_before = cluster.bed.link_bytes(), cluster.run_ids()
    start = time.monotonic()
    r = edgetrain("run", "lenet", "--np", "4", "-i", cluster.inventory, "--epochs", "2", "--max-steps", "40",
                  env=cluster.env, timeout=1200)
    seconds = time.monotonic() - start
    after = cluster.bed.link_bytes()
    assert r.returncode == 0, r.stdout + r.stderr
    run_id = cluster.new_run(runs_before)
    moved = {n: (after[n] - before[n]) / 1e6 for n in after}
    info = cluster.run_json(run_id)
    report["container run, lenet np 4 on 3 nodes, 2 x 40 steps"] = (
        f"{seconds:.0f} s in all, first step after {info['attempts'][-1]['first_step_s']} s; link MB "
        + ", ".join(f"{n} {mb:.0f}" for n, mb in moved.items())
    )
    cluster.moved = moved
    return run_id


def test_run_trains_across_the_nodes_in_containers(cluster, trained):
    info = cluster.run_json(trained)
    assert info["status"] == "completed"
    assert info["placement"]["runtime"] == "docker"
    assert [(h["host"], h["ranks"]) for h in info["placement"]["hosts"]] == [("node1", 2), ("node2", 1), ("node3", 1)]
    # What the image's labels say it holds (its build-time check proved them): the run's versions.
    assert info["versions"]["mpich"] == "4.0.2" and info["versions"]["horovod"] == "0.28.1", info["versions"]
    assert info["versions"]["tensorflow"].startswith("2.15.") and info["versions"]["torch"], info["versions"]
    # Every rank's log came home, and each rank ran on the node the placement says.
    where = {}
    for rank in range(4):
        log = (cluster.runs / trained / f"rank.{rank}.log").read_text()
        first = next(line for line in log.splitlines() if line.startswith(f"rank {rank}/4 on "))
        where[rank] = first.split()[3]
    assert where == {0: "node1", 1: "node1", 2: "node2", 3: "node3"}
    metrics = runs.Run(cluster.runs / trained).metrics()  # the epochs' lines (evaluations have their own kind)
    assert [m["epoch"] for m in metrics] == [1, 2] and metrics[-1]["ranks"] == 4
    # Gradients of a 1.6M-parameter model, allreduced 80 times, went through the nodes' links.
    assert cluster.moved["node2"] > 300 and cluster.moved["node3"] > 300, cluster.moved
    # Checkpoints stay on the rank-0 node until collected.
    assert cluster.node_ls("node1", f"{cluster.home}/runs/{trained}/checkpoints") == ["epoch-0001", "epoch-0002"]
    assert cluster.node_ls("node2", f"{cluster.home}/runs/{trained}/checkpoints") == []
    assert cluster.leftovers() == {}


def test_collect_fetches_and_verifies_rank0_checkpoints(cluster, trained, tmp_path):
    r = edgetrain("collect", trained, "-i", cluster.inventory, "--dest", str(tmp_path), env=cluster.env)
    assert r.returncode == 0, r.stderr
    assert "checkpoints 1, 2 verified" in r.stdout
    dest = tmp_path / trained
    manifest = json.loads((dest / "checkpoints" / "epoch-0002" / "manifest.json").read_text())
    assert manifest["epoch"] == 2 and manifest["host"] == "node1"
    assert {p.name for p in dest.glob("rank.*.log")} == {f"rank.{i}.log" for i in range(4)}
    again = edgetrain("collect", trained, "-i", cluster.inventory, "--dest", str(tmp_path), env=cluster.env)
    assert again.returncode == 0 and " 0 files copied" in again.stdout, again.stdout
    damaged = next(p for p in (dest / "checkpoints" / "epoch-0001").iterdir() if p.name.startswith("state.data"))
    damaged.write_bytes(b"damaged")
    repaired = edgetrain("collect", trained, "-i", cluster.inventory, "--dest", str(tmp_path), env=cluster.env)
    assert repaired.returncode == 0 and " 1 files copied" in repaired.stdout, repaired.stdout
    assert not list(tmp_path.glob(".*incoming*"))


def test_doctor_and_run_refuse_a_wrong_image_and_a_corrupt_dataset(cluster, tmp_path):
    tag = "edgetrain:0.1.0-amd64"
    original = cluster.docker("node2", "image", "inspect", "--format", "{{.Id}}", tag).stdout.strip()
    node3 = cluster.bed.state.nodes[2]
    data = f"{cluster.home}/datasets/mnist/mnist.pkl.gz"
    cluster.docker("node2", "tag", "edgetrain-testbed/probe:1", tag)
    cluster.bed.ssh(node3, f"cp {data} {data}.good && printf x >> {data}")
    try:
        r = edgetrain("doctor", "-i", cluster.inventory, env=cluster.env)
        assert r.returncode == 1
        rows = [line for line in r.stdout.splitlines() if "FAIL" in line]
        assert any(row.split()[:2] == ["node2", "image"] and "this machine's is" in row for row in rows), r.stdout
        assert any(row.split()[:2] == ["node3", "dataset"] and "corrupt" in row for row in rows), r.stdout
        assert not any(row.split()[0] == "node1" for row in rows), r.stdout
        assert "node2 (image)" in r.stderr and "node3 (dataset)" in r.stderr

        before = {p.name for p in cluster.runs.iterdir()}
        run = edgetrain("run", "lenet", "--np", "4", "-i", cluster.inventory, "--max-steps", "5", env=cluster.env)
        assert run.returncode == 1 and "preflight: node2: image" in run.stderr, run.stderr
        assert {p.name for p in cluster.runs.iterdir()} == before  # nothing started, no run directory
        assert cluster.leftovers() == {}
    finally:
        cluster.docker("node2", "tag", original, tag)
        cluster.bed.ssh(node3, f"mv {data}.good {data}")


def test_the_login_user_owns_what_the_ranks_wrote_and_can_remove_it(cluster, trained):
    """On a Pi the login user is `pi`, not root: checkpoints, logs and metrics the ranks wrote in
    containers are that user's, so collect and resume can read them and the user can delete them."""
    user = cluster.bed.state.login_user
    run_dir = f"{cluster.home}/runs/{trained}"
    assert cluster.owner("node1", f"{run_dir}/checkpoints/epoch-0002") == user
    assert cluster.owner("node1", f"{run_dir}/checkpoints/epoch-0002/manifest.json") == user
    assert cluster.owner("node1", f"{run_dir}/metrics.jsonl") == user
    assert cluster.owner("node3", f"{run_dir}/rank.3.log") == user
    for node in ("node1", "node2", "node3"):
        removed = cluster.as_login(node, f"rm -rf {run_dir} && ! test -e {run_dir}")
        assert removed.returncode == 0, (node, removed.stderr)
