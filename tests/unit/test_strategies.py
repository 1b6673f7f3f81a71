"""Strategies as objects, a launcher's half (edgetrain.controller.strategies) and a rank's
(edgetrain.rank.strategies) with the peers record between them (edgetrain.shared.strategies): what
each asks of the hosts and tells the ranks, read from a real inventory's placement, what a rank
does with it; and the launcher and the worker that use them name none."""

from __future__ import annotations

import importlib.util
import json
import os
import re
from pathlib import Path

import pytest

from edgetrain.controller import blame, containers, images, inventory, placement, runtimes, strategies
from edgetrain.controller import program as programs
from edgetrain.controller.program import JobOptions
from edgetrain.rank import worker
from edgetrain.rank import strategies as rank_strategies
from edgetrain.rank import tf_ps, torch_rank
from edgetrain.shared.errors import EdgetrainError
from edgetrain.shared.strategies import DEFAULT, MultiWorkerPeers, Name, ParameterServerPeers, TorchPeers

from .test_containers_unit import host
from .test_placement import CLUSTER, write

ROOT = Path(__file__).resolve().parents[2]


def test_multiworker_gives_every_worker_a_port_of_its_host_in_rank_order(tmp_path):
    plan = placement.plan(inventory.load(write(tmp_path, CLUSTER)), 6)
    s = strategies.STRATEGIES["tf-multiworker"]
    assert s.ports(plan, 23456) == {"pi0": [23456, 23457, 23458, 23459], "pi1": [23456, 23457]}
    flag, peers = s.worker_args(plan, 23456)
    assert flag == "--peers" and json.loads(peers)["tasks"] == [f"198.18.0.10:{p}" for p in range(23456, 23460)] + \
        ["198.18.0.11:23456", "198.18.0.11:23457"]
    config = json.loads(MultiWorkerPeers.parse(peers).tf_config(5))
    assert config["task"] == {"type": "worker", "index": 5} and len(config["cluster"]["worker"]) == 6


def test_horovod_asks_for_no_ports_and_only_it_trains_the_built_in_jobs(tmp_path):
    plan = placement.plan(inventory.load(write(tmp_path, CLUSTER)), 6)
    h = strategies.STRATEGIES[DEFAULT]
    assert h.ports(plan, 23456) == {} and h.worker_args(plan, 23456) == []
    assert [s.name for s in strategies.STRATEGIES.values() if s.builtin_jobs] == ["horovod"]
    # In this process nobody called hvd.init(): several ranks would each have trained alone.
    rank = rank_strategies.STRATEGIES[DEFAULT]
    assert rank.unmet(2).kind == "no-init" and rank.unmet(1) is None


def test_the_launcher_and_the_worker_compare_no_strategy_names():
    names = "|".join(re.escape(n) for n in strategies.STRATEGIES)
    for module in ("controller/launch.py", "rank/worker.py", "controller/runtimes.py"):
        text = (ROOT / "edgetrain" / module).read_text()
        assert not re.search(rf"(==|!=|\bin)\s*\(?[\"']({names})[\"']|[\"']({names})[\"']\s*(==|!=)", text), module


def test_what_each_strategy_needs_is_what_every_image_labels():
    """The docker runtime checks a strategy's ``needs`` against each node's image labels, the host
    runtime with importlib: a name only one of them knows would refuse every run."""
    for dockerfile in ("Dockerfile.arm64", "Dockerfile.cuda"):
        text = (ROOT / "images" / dockerfile).read_text()
        for name in images.LABELLED_PACKAGES:
            assert f'{images.PACKAGE_LABEL.format(name)}="${{' in text, (dockerfile, name)
    for s in strategies.STRATEGIES.values():
        assert s.needs in images.LABELLED_PACKAGES and importlib.util.find_spec(s.needs) is not None, s.name
    labels = {images.PACKAGE_LABEL.format("horovod"): "0.28.1", images.PACKAGE_LABEL.format("torch"): "", "other": "1"}
    assert images.packages(labels) == {"horovod": "0.28.1"}  # an empty label: built without it


def test_every_strategy_takes_the_launchers_call_and_the_worker_reads_the_command():
    """The launcher asks each strategy the same way, and edgetrain's one worker command builder
    (runtimes.worker_command: launch's and lab/launch_cost.py's) says it all in words the rank's
    worker parses back."""
    plan = placement.plan(inventory.Inventory(Path("inv"), (host("node1", groups=("head", "rpi")), host("node2"), host("node3"))), 3)
    program = programs.resolve("lenet", [], JobOptions(epochs=1))
    for strategy in strategies.STRATEGIES.values():
        ps = 1 if strategy.name == "tf-ps" else None
        strategy.check_tasks(3, ps)
        args = strategy.worker_args(plan, 23456, ps)
        assert all(isinstance(a, str) for a in args), strategy.name
        argv = runtimes.worker_command("python3", runtimes.IN_CONTAINER, strategy, program, "tok", args)
        assert argv[:3] == ["python3", "-m", runtimes.WORKER_MODULE]
        told = worker.parse_args(argv[3:])
        assert (str(told.run_dir), str(told.store), str(told.data)) == (containers.RUN_MOUNT, containers.STORE_MOUNT, containers.DATA_MOUNT)
        assert (told.strategy, told.job_name, told.events_token) == (strategy.name, "lenet", "tok")
        assert told.peers == (args[1] if args else ""), strategy.name
        assert argv[-len(program.worker_args()):] == program.worker_args()  # the program last, after --
        assert (told.module, told.program, told.args[:2]) == (True, "edgetrain.rank.training", ["--job", "lenet"]), strategy.name


def test_a_rank_pinned_to_a_gpu_its_host_lacks_is_told_why_and_offered_no_resume(monkeypatch):
    """Two NCCL ranks of the DDP example on a one-GPU host: rank 1's set_device(1) fails so."""
    import torch

    error = "AcceleratorError: CUDA error: invalid device ordinal\nGPU device may be out of range, do you have enough GPUs?"
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    fix = rank_strategies.Torch().advice(error)
    assert fix == f"one GPU per local rank, and this host has {torch.cuda.device_count()} for 2 local ranks"
    assert "no more ranks on a host than it has GPUs" in blame.Finding(1, "gpu1", f"{error} - {fix}").instead_of_resume
    assert "requirements.txt" in blame.Finding(0, "gpu1", "ModuleNotFoundError: No module named 'x'").instead_of_resume
    assert blame.Finding(1, "gpu1", "RuntimeError: Connection reset by peer").instead_of_resume is None


def test_both_halves_know_every_strategy_by_its_name():
    assert list(strategies.STRATEGIES) == list(rank_strategies.STRATEGIES) == list(Name)
    assert strategies.named("tf-ps").name == Name.TF_PS == "tf-ps" and f"{Name.TF_PS}" == "tf-ps"
    with pytest.raises(EdgetrainError, match="unknown --strategy 'mpi'"):
        strategies.named("mpi")


def test_each_strategys_peers_go_to_the_ranks_as_json_and_come_back_whole(tmp_path):
    plan = placement.plan(inventory.load(write(tmp_path, CLUSTER)), 6)
    for s in strategies.STRATEGIES.values():
        peers = s.peers(plan, 23456, None)
        if peers is None:
            continue
        flag, text = s.worker_args(plan, 23456, None)
        assert flag == "--peers" and type(peers).parse(text) == peers and isinstance(json.loads(text), dict), s.name
    assert strategies.STRATEGIES[Name.TORCH].peers(plan, 29500) == \
        TorchPeers("198.18.0.10", 29500, "eth0", (("pi0", 4), ("pi1", 2)))
    with pytest.raises(EdgetrainError, match="is not a TorchPeers record"):
        TorchPeers.parse("127.0.0.1:29500::gpu1=1")  # the encoding of old


def test_a_tf_ps_rank_serves_in_the_programs_place_and_the_chief_runs_it(monkeypatch):
    """The worker acts on the role its strategy's set-up returns: the program's arguments, or a
    server to run instead (until the chief ends), never an exit from inside the set-up."""
    layout = ParameterServerPeers(("h:1", "h:2", "h:3", "h:4"), 1, "h:5")
    served, chiefs = [], []
    monkeypatch.setattr(tf_ps, "serve", lambda peers, rank: served.append((peers, rank)))
    monkeypatch.setattr(tf_ps, "become_chief", chiefs.append)
    monkeypatch.setenv("TF_CONFIG", "")
    s = rank_strategies.STRATEGIES[Name.TF_PS]
    role = s.set_up(2, layout.to_json(), ["--epochs", "1"])
    assert role.args == () and served == [] and json.loads(os.environ["TF_CONFIG"])["task"] == {"type": "worker", "index": 0}
    role.serve()
    assert served == [(layout, 2)]
    chief = s.set_up(0, layout.to_json(), ["--epochs", "1"])
    assert chief == rank_strategies.Role(("--epochs", "1")) and chiefs == [layout]


def test_a_torch_rank_finds_its_place_in_the_peers_record():
    told = TorchPeers("198.18.0.10", 29500, "eth1", (("pi0", 2), ("pi1", 3)))
    place = torch_rank.Place.of(told, {"PMI_RANK": "3", "PMI_SIZE": "5"})
    assert (place.rank, place.size, place.node, place.local_rank, place.local_size) == (3, 5, 1, 1, 3)
    assert place.arguments(["--url", "{master_url}", "{rank}"]) == ["--url", "tcp://198.18.0.10:29500", "3"]
