"""The user's own scripts on the testbed's three nodes, in containers: a Horovod Keras script with
a package baked into the image offline, loading MNIST through Keras as users' scripts do, its
working directory shipped once, its rank-0 outputs collected; TensorFlow's
MultiWorkerMirroredStrategy and a torch DDP script across the nodes (parameter servers: test_faults,
which runs them across the nodes losing a worker); failures named by node."""

from __future__ import annotations

import re

import time
from pathlib import Path

import pytest

from edgetrain.controller import images
from edgetrain.shared import runs
from tests.conftest import ROOT, edgetrain


pytestmark = [pytest.mark.cluster, pytest.mark.docker, pytest.mark.slow]

EXTRA_TAG = "edgetrain:test-requirements"


# What users' MNIST scripts start with, riding on the project's runs: Keras' mnist.load_data() as
# Horovod's examples call it (a file per rank) and as the Pi-cluster article's LeNet script does, each
# served the node's copy in every container, offline (edgetrain.rank.keras_datasets).
MNIST_LIKE_USERS = """import tensorflow as tf
import horovod.tensorflow.keras as hvd
hvd.init()
(mnist_images, mnist_labels), _ = tf.keras.datasets.mnist.load_data(path='mnist-%d.npz' % hvd.rank())
(x_train, y_train), (x_test, y_test) = tf.keras.datasets.mnist.load_data()
assert mnist_images.shape == x_train.shape == (60000, 28, 28) and mnist_images.dtype == x_train.dtype == 'uint8'
"""


@pytest.fixture(scope="module")
def project(tmp_path_factory) -> Path:
    """A tutorial-style Horovod Keras script with a dependency of its own, loading MNIST as users do."""
    root = tmp_path_factory.mktemp("project")
    source = (ROOT / "examples" / "horovod_keras" / "train.py").read_text()
    (root / "train.py").write_text("import tabulate  # this project's own dependency\n" + MNIST_LIKE_USERS + source)
    (root / "requirements.txt").write_text("tabulate==0.9.0\n")
    (root / ".edgetrainignore").write_text("*.h5\n")
    return root


@pytest.fixture(scope="module")
def extra_inventory(cluster, report) -> str:
    """The same nodes, running an image with the project's requirements baked in, built here offline."""
    start = time.monotonic()
    built = edgetrain("images", "build", "--arch", "amd64", "--tag", EXTRA_TAG, "--requirements",
                      str(ROOT / "tests" / "scripts" / "with_requirements" / "requirements.txt"), env=cluster.env, timeout=1800)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    inventory = cluster.docker_inventory("docker-requirements.yml", edgetrain_image=EXTRA_TAG)
    shipped = edgetrain("images", "distribute", "-i", inventory, env=cluster.env, timeout=1800)
    assert shipped.returncode == 0, shipped.stderr
    report["image with requirements (build + distribute)"] = f"{time.monotonic() - start:.0f} s"
    return inventory


def test_a_script_whose_requirement_the_image_lacks_is_refused_with_the_fix(cluster, project):
    before = {p.name for p in cluster.runs.iterdir()}
    r = edgetrain("run", str(project / "train.py"), "--np", "4", "-i", cluster.inventory, env=cluster.env)
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert "preflight: node1: requirements: edgetrain:0.1.0-amd64 lacks tabulate==0.9.0" in last, last
    assert "edgetrain images build --arch amd64 --requirements" in last and "edgetrain images distribute" in last
    assert {p.name for p in cluster.runs.iterdir()} == before
    assert cluster.leftovers() == {}


def test_a_tutorial_script_trains_across_the_nodes_and_its_outputs_come_home(cluster, extra_inventory, project, report, tmp_path):
    before, runs_before = cluster.bed.link_bytes(), cluster.run_ids()
    start = time.monotonic()
    r = edgetrain("run", str(project / "train.py"), "--np", "4", "-i", extra_inventory,
                  "--", "--epochs", "1", "--steps-per-epoch", "20", env=cluster.env, timeout=1200)
    seconds = time.monotonic() - start
    after = cluster.bed.link_bytes()
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run_id = cluster.new_run(runs_before)
    info = cluster.run_json(run_id)
    assert info["status"] == "completed" and info["kind"] == "script"
    assert info["program"]["requirements"] == ["tabulate==0.9.0"]
    shipped = {s["host"]: s for s in info["attempts"][-1]["shipped"]}
    assert set(shipped) == {"node1", "node2", "node3"} and all(s["files"] == 3 for s in shipped.values())
    # Rank 0 alone saved, into its working copy on node1.
    assert "checkpoint-1.h5" in cluster.node_ls("node1", f"{cluster.home}/runs/{run_id}/work")
    assert "checkpoint-1.h5" not in cluster.node_ls("node2", f"{cluster.home}/runs/{run_id}/ranks/2/work")
    moved = {n: (after[n] - before[n]) / 1e6 for n in after}
    assert moved["node2"] > 50 and moved["node3"] > 50, moved  # the gradients crossed the shaped links
    report["user script (horovod_keras + tabulate) np 4, 1 x 20 steps"] = (
        f"{seconds:.0f} s in all, first step after {info['attempts'][-1]['first_step_s']} s; shipped "
        + ", ".join(f"{h} {s['files']} files {s['bytes']} B in {s['seconds']:.2f} s" for h, s in shipped.items())
        + "; " + link_mb(moved))

    got = edgetrain("collect", run_id, "-i", extra_inventory, "--dest", str(tmp_path), env=cluster.env)
    assert got.returncode == 0, got.stderr
    assert "outputs verified" in got.stdout
    assert (tmp_path / run_id / "work" / "checkpoint-1.h5").stat().st_size > 1_000_000
    again = edgetrain("collect", run_id, "-i", extra_inventory, "--dest", str(tmp_path), env=cluster.env)
    assert again.returncode == 0 and " 0 files copied" in again.stdout, again.stdout

    runs_before = cluster.run_ids()
    second = edgetrain("run", str(project / "train.py"), "--np", "4", "-i", extra_inventory,
                       "--", "--epochs", "1", "--steps-per-epoch", "5", env=cluster.env, timeout=1200)
    assert second.returncode == 0, second.stderr[-3000:]
    for node in ("node1", "node2", "node3"):
        assert f"{node}: working directory 3 files, 0 shipped" in second.stdout, second.stdout
    again_shipped = cluster.run_json(cluster.new_run(runs_before))["attempts"][-1]["shipped"]
    report["working directory, second run"] = ", ".join(f"{s['host']} {s['files']} files in {s['seconds']:.2f} s" for s in again_shipped)
    assert cluster.leftovers() == {}


def example_across_the_nodes(cluster, example: str, *run_args: str) -> tuple[str, dict[str, float]]:
    """examples/EXAMPLE/train.py on 4 ranks over the 3 nodes, 1 x 20 steps: its run id, and the MB that
    went through each node's link meanwhile."""
    before, runs_before = cluster.bed.link_bytes(), cluster.run_ids()
    r = edgetrain("run", str(ROOT / "examples" / example / "train.py"), "--np", "4", *run_args, "-i", cluster.inventory,
                  "--", "--epochs", "1", "--steps-per-epoch", "20", env=cluster.env, timeout=1200)
    after = cluster.bed.link_bytes()
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return cluster.new_run(runs_before), {n: (after[n] - before[n]) / 1e6 for n in after}


def link_mb(moved: dict[str, float]) -> str:
    return "link MB " + ", ".join(f"{n} {mb:.0f}" for n, mb in moved.items())


def test_multiworker_strategy_trains_across_the_nodes(cluster, report):
    run_id, moved = example_across_the_nodes(cluster, "multiworker", "--strategy", "tf-multiworker")
    assert "keras-model" in cluster.node_ls("node1", f"{cluster.home}/runs/{run_id}/work")
    assert moved["node2"] > 50 and moved["node3"] > 50, moved
    report["tf-multiworker example np 4, 1 x 20 steps"] = link_mb(moved)
    assert cluster.leftovers() == {}


def test_a_torch_ddp_script_trains_across_the_nodes_in_the_images(cluster, report):
    """The DDP LeNet example, unchanged, in the nodes' containers (the image's CPU-only torch): Gloo
    between the nodes, rank 0's weights in its working copy, nothing left."""
    run_id, moved = example_across_the_nodes(cluster, "torch_ddp", "--strategy", "torch")
    assert "lenet.pt" in cluster.node_ls("node1", f"{cluster.home}/runs/{run_id}/work")
    assert "on 4 ranks" in (cluster.runs / run_id / "rank.0.log").read_text()
    assert moved["node2"] > 1 and moved["node3"] > 1, moved  # 20 steps of DDP's gradient buckets each way
    report["torch DDP example np 4, 1 x 20 steps"] = link_mb(moved)
    assert cluster.leftovers() == {}


def test_a_torch_2_script_runs_unchanged_across_the_nodes_containers(cluster):
    """tests/scripts/torch/modern_ddp.py (no backend named, scaled_dot_product_attention, bfloat16
    autocast, weights_only loading: torch 2 throughout) on one rank per node, in the images' torch."""
    runs_before = cluster.run_ids()
    r = edgetrain("run", str(ROOT / "tests" / "scripts" / "torch" / "modern_ddp.py"), "--np", "3", "--strategy", "torch",
                  "-i", cluster.inventory, env=cluster.env, timeout=900)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    run_id = cluster.new_run(runs_before)
    logs = "".join((cluster.runs / run_id / f"rank.{rank}.log").read_text() for rank in range(3))
    trained = re.findall(r"rank (\d)/3: loss ([\d.]+) -> ([\d.]+)", logs)
    assert sorted(rank for rank, _, _ in trained) == ["0", "1", "2"], logs[-3000:]
    assert "rank 0 loaded 6 tensors back with weights_only, the same" in logs, logs[-3000:]
    assert cluster.leftovers() == {}


def test_a_torch_run_where_a_nodes_image_lacks_torch_is_refused_naming_it(cluster):
    """node3 runs an image built from the session's without torch, labelled so as images were
    before it: preflight reads the labels, so nothing starts."""
    lacking = "edgetrain:test-no-torch"
    cluster.docker("node3", "build", "-q", "--network", "none", "-t", lacking, "-",
                   input=f"FROM {images.TARGETS['amd64'].tag}\nRUN pip uninstall -q -y torch\n"
                         f"LABEL {images.PACKAGE_LABEL.format('torch')}=\n")
    try:
        inventory = cluster.docker_inventory("docker-no-torch.yml", host_vars={"node3": {"edgetrain_image": lacking}})
        r = edgetrain("run", str(ROOT / "examples" / "torch_ddp" / "train.py"), "--np", "4", "--strategy", "torch",
                      "-i", inventory, env=cluster.env, timeout=600)
    finally:
        cluster.docker("node3", "rmi", lacking)
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("edgetrain: error: preflight: node3: the image has no torch"), r.stderr[-3000:]
    assert "edgetrain images build --arch ARCH" in last
    assert cluster.leftovers() == {}


def test_a_script_that_raises_on_a_worker_node_is_named_and_nothing_is_left(cluster):
    runs_before = cluster.run_ids()
    r = edgetrain("run", str(ROOT / "tests" / "scripts" / "raises.py"), "--np", "4", "-i", cluster.inventory,
                  "--", "--rank", "3", env=cluster.env, timeout=600)
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert "rank 3 on node3 failed: ValueError: bad batch on rank 3" in last, r.stderr[-3000:]
    assert (cluster.runs / cluster.new_run(runs_before) / "rank.3.failure.json").is_file()  # came home from node3
    assert cluster.leftovers() == {}


def test_a_dataset_a_node_lacks_is_a_preflight_error_naming_it(cluster):
    node3 = cluster.bed.state.nodes[2]
    data = f"{cluster.home}/datasets/fashion-mnist"
    cluster.bed.ssh(node3, f"mv {data} {data}.away")
    try:
        r = edgetrain("run", str(ROOT / "examples" / "multiworker" / "train.py"), "--np", "4", "--dataset", "fashion-mnist",
                      "-i", cluster.inventory, env=cluster.env)
    finally:
        cluster.bed.ssh(node3, f"mv {data}.away {data}")
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith("edgetrain: error: preflight: node3: dataset: dataset fashion-mnist not found in node3:"), last
    assert "--tags datasets" in last
    assert cluster.leftovers() == {}



@pytest.mark.bench
def test_the_same_model_trains_with_horovod_and_with_multiworker(cluster, report):
    """LeNet both ways across the nodes: both complete and move gradients over the links; their
    images/s and link bytes are reported side by side (figures, not assertions: 2 cores serve all nodes)."""
    script = str(ROOT / "examples" / "lenet_strategies" / "train.py")
    figures = {}
    for strategy in ("horovod", "tf-multiworker"):
        before, runs_before = cluster.bed.link_bytes(), cluster.run_ids()
        r = edgetrain("run", script, "--np", "4", "--strategy", strategy, "-i", cluster.inventory,
                      "--", "--epochs", "2", "--steps-per-epoch", "40", env=cluster.env, timeout=1200)
        after = cluster.bed.link_bytes()
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
        metrics = runs.Run(cluster.runs / cluster.new_run(runs_before)).metrics()  # the epochs' lines
        assert [m["epoch"] for m in metrics] == [1, 2] and metrics[-1]["ranks"] == 4
        moved = {n: (after[n] - before[n]) / 1e6 for n in after}
        assert moved["node3"] > 100, moved
        figures[strategy] = f"{metrics[-1]['images_per_sec']:.0f} img/s (epoch 2), " + link_mb(moved)
    report["same LeNet, np 4, 2 x 40 steps, horovod vs tf-multiworker"] = "; ".join(f"{k}: {v}" for k, v in figures.items())
    assert cluster.leftovers() == {}
