"""--batch-by speed on an emulated mixed cluster: the session's testbed with node1 an emulated Pi 5
(500 LeNet img/s, assumed twice a Pi 4) and node2, node3 Pi 4s (250), each a calibrated quota
(conftest's ``mixed``), one rank per node, in the nodes' containers. The testbed's inventory names
each node's board and its calibrated rate as its ``edgetrain_speed``, so the batches go 2:1:1:
the built-in LeNet job, a Horovod/Keras script through edgetrain.callbacks and a torch DDP script
through edgetrain.ddp, each for a few steps; each run records its batches, and each script ends
with the weights one process gets training on the union of the ranks' batches (a model without
batch statistics) - which it would not without the loss weight."""

from __future__ import annotations

import json
import os
import re
import shlex
import time
from pathlib import Path

import pytest
import yaml

from lab import mixed_bench
from lab.__main__ import main as lab_main
from tests.conftest import ROOT, edgetrain

from .conftest import BRACKET

pytestmark = [pytest.mark.cluster, pytest.mark.docker, pytest.mark.slow]

SCRIPTS = ROOT / "tests" / "scripts" / "batches"
SAID = "--batch-by speed: from the inventory's edgetrain_speed: node1 500, node2 250, node3 250"
# The scripts' steps and per-rank batch: a global batch of 12 over 64 examples, 5 steps an epoch.
STEPS, PER_RANK = 3, 4
RESULT = re.compile(r"^batches (\S+) weighted (\S+) unweighted (\S+)$", re.M)


@pytest.fixture
def inventory(cluster, mixed) -> str:
    """The nodes as a container cluster, one slot each, written while they emulate their boards."""
    path = cluster.docker_inventory("mixed.yml", head_slots=1)
    hosts = yaml.safe_load(Path(path).read_text())["all"]["children"]["cluster"]["children"]["rpi"]["hosts"]
    assert {h: (v["edgetrain_model"], v["edgetrain_speed"]) for h, v in hosts.items()} == {
        "node1": ("pi5", 500), "node2": ("pi4", 250), "node3": ("pi4", 250)}, hosts
    return path


@pytest.mark.parametrize(("program", "args", "batches"), [
    ("lenet", ("--epochs", "1", "--max-steps", "6"), [96, 48, 48]),  # a global batch of 3 x 64
    ("keras_exact.py", ("--strategy", "horovod", "--", str(STEPS), str(PER_RANK)), [6, 3, 3]),
    ("torch_exact.py", ("--strategy", "torch", "--", str(STEPS), str(PER_RANK)), [6, 3, 3]),
], ids=["lenet", "keras", "torch"])
def test_batch_by_speed_trains_on_a_pi5_beside_two_pi4s(cluster, inventory, report, program, args, batches):
    target = program if program == "lenet" else str(SCRIPTS / program)
    before = cluster.run_ids()
    start = time.monotonic()
    r = edgetrain("run", target, "--np", "3", "-i", inventory, "--batch-by", "speed", *args, env=cluster.env, timeout=900)
    took = time.monotonic() - start
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert SAID in r.stdout, r.stdout[-3000:]
    shown = "/".join(map(str, batches))
    assert f"on 3 ranks, batches {shown} by speed" in r.stdout, r.stdout[-3000:]
    run_id = cluster.new_run(before)
    placement = cluster.run_json(run_id)["placement"]
    assert placement["speeds"] == [500.0, 250.0, 250.0] and placement["batches"] == batches, placement
    assert [h["host"] for h in placement["hosts"]] == ["node1", "node2", "node3"], placement["hosts"]
    listed = edgetrain("runs", "show", run_id, env=cluster.env)
    assert ("batches by speed (from the inventory's edgetrain_speed): "
            f"rank 0 on node1: {batches[0]}, rank 1 on node2: {batches[1]}, rank 2 on node3: {batches[2]}") in listed.stdout, listed.stdout
    if program != "lenet":
        log = (cluster.runs / run_id / "rank.0.log").read_text()
        found = RESULT.search(log)
        assert found and found[1] == shown, log[-3000:]
        weighted, unweighted = float(found[2]), float(found[3])
        assert weighted < 1e-5, found[0]  # the union's update, step for step, to float tolerance
        assert unweighted > 1e-3, found[0]  # the loss weight is what makes it so
    report[f"--batch-by speed on pi5 + 2 x pi4 ({BRACKET} bracket), {program}"] = f"{took:.0f} s (smoke figure: start to end, one run)"
    assert cluster.leftovers() == {}


@pytest.mark.bench
def test_the_mixed_cluster_benchmark(cluster, report):
    """`python -m lab mixed-bench` on this cluster in one command (lab/mixed_bench.py): one sitting a
    seed, the Pi 5 alone, with two Pi 4s by equal batches and by speed, and three Pi 4s, LeNet to
    99.0% on the held-out split; each seed's JSON in EDGETRAIN_MIXED_OUT (default docs/benches/mixed):
    sudo EDGETRAIN_MIXED_SEEDS=60,61,62 .venv/bin/python -m pytest -m bench tests/cluster/test_mixed.py -s
    (EDGETRAIN_MIXED_ARGS: the command's other options, e.g. --max-steps 40 --target 0.9 for a short try)."""
    seeds = os.environ.get("EDGETRAIN_MIXED_SEEDS", "60,61,62")
    out = Path(os.environ.get("EDGETRAIN_MIXED_OUT", mixed_bench.KEPT))
    inventory = cluster.docker_inventory("mixed-bench.yml", head_slots=1)
    argv = ["mixed-bench", cluster.bed.state.id, "-i", inventory, "--seeds", seeds, "--out", str(out), "--runs-dir", str(cluster.runs),
            *shlex.split(os.environ.get("EDGETRAIN_MIXED_ARGS", ""))]
    before = set(out.glob("*.json"))
    assert lab_main(argv) == 0
    written = sorted(set(out.glob("*.json")) - before)
    assert len(written) == len(seeds.split(",")), written
    for path in written:
        record = json.loads(path.read_text())
        assert record["order"] == [s.name for s in mixed_bench.schedule(record["seed"])], record["order"]
        assert all(r["status"] == "completed" for r in record["runs"]), record["runs"]
        report[f"mixed-cluster bench, seed {record['seed']}"] = path.name
    report["mixed-cluster table"] = "\n" + mixed_bench.table(mixed_bench.kept(out))
