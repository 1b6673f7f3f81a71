"""The container launcher's commands and defaults, checked without nodes (the testbed tests run them)."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from edgetrain.controller.strategies import STRATEGIES
from edgetrain.controller import blame, containers, inventory, placement, preflight
from edgetrain.rank import keeper
from edgetrain.shared import datasets, failures, runs
from edgetrain.shared.errors import EdgetrainError
from edgetrain.controller.inventory import Host, Inventory
from edgetrain.controller.remote import Nodes

ROOT = Path(__file__).resolve().parents[2]


def host(name: str, groups=("rpi",), mpi_env=None, **hv) -> Host:
    return Host(name=name, address=f"198.18.0.{len(name)}", arch="aarch64", slots=1, runtime="docker", user="pi",
                iface="eth0", groups=frozenset(groups), mpi_env=mpi_env or {}, vars=hv)


def test_node_dataset_default_is_the_datasets_roles_default():
    defaults = yaml.safe_load((ROOT / "roles/datasets/defaults/main.yml").read_text())
    assert inventory.DEFAULT_DATASETS_DIR == defaults["datasets_dir"]


def test_docker_run_mounts_run_and_data_and_asks_for_gpus_only_on_gpu_hosts():
    cpu = containers.docker_run_argv(host("pi1"), "edgetrain-r1", "r1", "/home/pi/edgetrain/runs/r1", "edgetrain:0.1.0-arm64", "198.18.0.3")
    assert cpu[:2] == ["docker", "run"]
    assert "edgetrain-sshd" in cpu[cpu.index("edgetrain:0.1.0-arm64"):]  # under its lease
    assert "--network" in cpu and cpu[cpu.index("--network") + 1] == "host"
    assert "/home/pi/edgetrain/runs/r1:/edgetrain/run" in cpu
    assert "/srv/edgetrain/datasets:/edgetrain/data:ro" in cpu
    assert "/home/pi/edgetrain/runs/.views/r1:/edgetrain/store:ro" in cpu  # the run's own files, not the store
    assert f"{containers.LABEL}=r1" in cpu and "--gpus" not in cpu
    gpu = containers.docker_run_argv(host("gpu1", groups=("gpu",)), "edgetrain-r1", "r1", "/x", "edgetrain:0.1.0-cuda", None)
    assert gpu[gpu.index("--gpus") + 1] == "all"
    assert not any(a.startswith("-oListenAddress") for a in gpu)


def test_containers_remove_themselves_are_never_pulled_and_keep_few_capabilities():
    argv = containers.docker_run_argv(host("pi1"), "edgetrain-r1", "r1", "/d/r1", "img", "198.18.0.3")
    assert "--rm" in argv and argv[argv.index("--pull") + 1] == "never"
    assert argv[argv.index("--cap-drop") + 1] == "ALL"
    added = {argv[i + 1] for i, a in enumerate(argv) if a == "--cap-add"}
    assert added == set(containers.CAPABILITIES) and "NET_RAW" not in added and "SYS_ADMIN" not in added
    sshd = argv[argv.index("edgetrain-sshd") + 1:]
    assert "-oListenAddress=198.18.0.3" in sshd and "-oAllowTcpForwarding=no" in sshd and "-oPermitTunnel=no" in sshd


def test_mpirun_runs_in_the_rank0_container_with_the_inventorys_interface_and_env():
    hosts = (host("pi1", groups=("head", "rpi"), mpi_env={"UCX_TLS": "tcp,self"}), host("pi2"))
    plan = placement.plan(Inventory(Path("inv"), hosts), 2)
    with Nodes() as nodes:
        argv = containers.Containers(nodes, plan, "r1", {}).mpirun(["python", "-m", "edgetrain.rank.probe"])
    remote = argv[-1]  # one shell word list for the node, after the ssh options
    assert argv[0] == "ssh" and "pi@198.18.0.3" in argv and "ControlMaster=auto" in argv
    assert remote.startswith("docker exec edgetrain-r1 mpirun -f /etc/edgetrain/machinefile -n 2 -iface eth0 -bootstrap ssh")
    assert "-genv UCX_TLS tcp,self" in remote
    assert remote.endswith("python -m edgetrain.rank.probe")
    assert plan.ranks_on(hosts[1]) == [1] and plan.ranks_on(hosts[0]) == [0]


def test_dataset_format_from_digests_hashed_on_a_node():
    pkl = datasets.files_of("mnist", "pkl")[0]
    good = next(iter(pkl.sha256))
    assert datasets.choose_format("mnist", {"mnist.pkl.gz": good}, "pi1:/d/mnist", "stage it") == "pkl"
    with pytest.raises(EdgetrainError, match="pi1:/d/mnist/mnist.pkl.gz is corrupt"):
        datasets.choose_format("mnist", {"mnist.pkl.gz": "0" * 64}, "pi1:/d/mnist", "stage it")
    with pytest.raises(EdgetrainError, match="dataset mnist not found in pi1:/d/mnist - stage it"):
        datasets.choose_format("mnist", {"train-images-idx3-ubyte.gz": "0" * 64}, "pi1:/d/mnist", "stage it")


def _blame(tmp_path, plan, output) -> blame.Finding:
    return blame.find(blame.Observed(runs.Run(tmp_path), plan, output))


def test_a_node_hydra_lost_over_ssh_is_named_when_nothing_else_names_it(tmp_path):
    hosts = (host("head", groups=("head", "rpi")), host("node3"))  # addresses differ by name length
    plan = placement.plan(Inventory(Path("inv"), hosts), 2)
    out = [f"Connection to {hosts[1].address} closed by remote host.", "[mpiexec@head] control_cb: assert (!closed) failed"]
    found = _blame(tmp_path, plan, out)
    assert (found.rank, found.host, found.error) == (None, "node3", "lost its connection to mpirun")
    assert found.log_tail == tuple(out)


def test_a_node_mpiruns_ssh_cannot_reach_is_named_with_ssh_s_reason(tmp_path):
    """No MPI probe before a run: a node Hydra's ssh cannot connect to is named from ssh's own words
    (real OpenSSH here, to a loopback port nothing listens on)."""
    hosts = (host("head", groups=("head", "rpi")), replace(host("node3"), address="127.0.0.1"))
    plan = placement.plan(Inventory(Path("inv"), hosts), 2)
    said = subprocess.run(["ssh", "-p", "1", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "127.0.0.1", "true"],
                          capture_output=True, text=True, timeout=30)
    assert said.returncode == 255
    out = [*said.stderr.strip().splitlines(), "[mpiexec@head] HYDU_sock_write (lib/utils/sock.c:250): write error (Bad file descriptor)"]
    found = _blame(tmp_path, plan, out)
    assert (found.rank, found.host) == (None, "node3")
    assert found.error.startswith("mpirun could not reach it over ssh (Connection refused) - check that the nodes reach each other"), found.error


def test_preflight_refuses_an_image_without_what_the_strategy_needs_then_images_that_disagree():
    """What each node's image holds comes from its labels (preflight reads them with docker image
    inspect); a run starts only where every image holds what its strategy needs, and one version of
    each package its ranks load - torch differs between the amd64 and arm64 images by design, which
    a torch run refuses, naming the nodes, and a Horovod run does not care about."""
    torch, horovod = STRATEGIES["torch"], STRATEGIES["horovod"]
    built = {"tensorflow": "2.15.1", "horovod": "0.28.1", "mpich": "4.0.2", "torch": "2.9.1"}
    reports = [preflight.NodeReport(host(f"node{i}"), packages=dict(built)) for i in (1, 2, 3)]
    preflight.require(reports, torch.needs, torch.loads)
    del reports[2].packages["torch"]  # an image built without it: its label empty
    with pytest.raises(EdgetrainError) as err:
        preflight.require(reports, torch.needs, torch.loads)
    assert str(err.value).startswith("preflight: node3: the image has no torch, which the run's strategy needs")
    reports[1] = replace(reports[1], host=replace(reports[1].host, arch="x86_64"))  # an amd64 node among Pis
    reports[1].packages["torch"] = "2.13.0+cpu"
    preflight.require(reports[:2], horovod.needs, horovod.loads)
    with pytest.raises(EdgetrainError) as err:
        preflight.require(reports[:2], torch.needs, torch.loads)
    assert str(err.value).startswith("preflight: the image on node2 has torch 2.13.0+cpu, the one on node1 2.9.1"), err.value
    assert preflight.TORCH_VERSIONS_FIX in str(err.value)
    reports[1].packages["horovod"] = "0.28.0"
    with pytest.raises(EdgetrainError) as err:
        preflight.require(reports[:2], horovod.needs, horovod.loads)
    assert str(err.value).startswith("preflight: the image on node2 has horovod 0.28.0, the one on node1 0.28.1"), err.value
    assert preflight.SAME_VERSIONS_FIX in str(err.value)


def test_the_earliest_failure_record_is_named_not_hydras_view(tmp_path):
    plan = placement.plan(Inventory(Path("inv"), (host("node1", groups=("head", "rpi")), host("node2"), host("node3"))), 3)
    failures.write(tmp_path, 2, "node3", "ValueError: second", None)
    first = failures.write(tmp_path, 1, "node2", "ValueError: first", None)
    record = failures.path(tmp_path, 1)
    record.write_text(json.dumps({**json.loads(record.read_text()), "elapsed": first.elapsed - 5}))  # it failed first
    (tmp_path / "rank.1.log").write_text("rank 1/3 on node2 (pid 77)\nTraceback ...\nValueError: first\n")
    found = _blame(tmp_path, plan, ["PID 99 RUNNING AT 198.18.0.5", "EXIT CODE: 9"])
    assert (found.rank, found.host, found.error) == (1, "node2", "ValueError: first")
    assert found.log_tail[-1] == "ValueError: first"


def test_a_damaged_failure_record_is_skipped_and_hydras_report_names_the_rank(tmp_path):
    plan = placement.plan(Inventory(Path("inv"), (host("head", groups=("head", "rpi")), host("node2"))), 2)
    failures.path(tmp_path, 0).write_text("{not json")
    (tmp_path / "rank.1.log").write_text("rank 1/2 on node2 (pid 4242)\ntraining\n")
    found = _blame(tmp_path, plan, ["BAD TERMINATION", "PID 4242 RUNNING AT 198.18.0.5", "EXIT CODE: 9"])
    assert (found.rank, found.host) == (1, "node2")
    assert found.error == "process 4242 ended abnormally (exit code 9)"


def test_hydra_reports_a_keepers_pid_and_the_rank_it_keeps_is_named(tmp_path):
    plan = placement.plan(Inventory(Path("inv"), (host("head", groups=("head", "rpi")), host("node2"))), 2)
    (tmp_path / "rank.1.log").write_text("rank 1/2 on node2 (pid 4243, keeper 4242)\ntraining\n")
    found = _blame(tmp_path, plan, ["BAD TERMINATION", "PID 4242 RUNNING AT 198.18.0.5", "EXIT CODE: 9"])
    assert (found.rank, found.host) == (1, "node2")


def test_a_rank_a_signal_ended_is_named_from_its_keepers_record_not_the_rank_hydra_reports(tmp_path):
    """Hydra may report a rank it ended itself (the lowest, rank 0, with the SIGKILL of its
    cleanup); the keeper of the rank that went first wrote what ended it."""
    plan = placement.plan(Inventory(Path("inv"), (host("head", groups=("head", "rpi")), host("node2"))), 2)
    (tmp_path / "rank.0.log").write_text("rank 0/2 on head (pid 101, keeper 100)\n")
    (tmp_path / "rank.1.log").write_text("rank 1/2 on node2 (pid 201, keeper 200)\n")
    error, fix = keeper.failure(signal.SIGKILL)
    failures.write(tmp_path, 1, "node2", error, None, fix=fix, kind=failures.Kind.SIGNAL)
    found = _blame(tmp_path, plan, ["BAD TERMINATION", "PID 100 RUNNING AT 198.18.0.4", "EXIT CODE: 9"])
    assert (found.rank, found.host) == (1, "node2")
    assert found.error == f"killed by SIGKILL (signal 9) - {fix}" and "out-of-memory" in fix


GLOO_RESET = ("UnknownError: Graph execution error:\n\nDetected at node HorovodAllreduce_grads_6_0 defined at ...\n"
              "[third_party/gloo/gloo/transport/tcp/pair.cc:589] Read error [{peer}]:20128: Connection reset by peer\n"
              "\t [[{{{{node DistributedAdam_Allreduce/cond_6/HorovodAllreduce_grads_6_0}}}}]] [Op:__inference_train_function_2742]")


def three_nodes():
    hosts = (host("node1", groups=("head", "rpi")), host("n2"), host("node03"))
    return hosts, placement.plan(Inventory(Path("inv"), hosts), 3)


def test_a_rank_that_lost_its_peer_names_the_peer_not_itself(tmp_path):
    # The peer's container was killed: it wrote nothing, the rank beside it saw the reset.
    hosts, plan = three_nodes()
    failures.write(tmp_path, 1, "n2", GLOO_RESET.format(peer=hosts[2].address), "Traceback ...")
    (tmp_path / "rank.2.log").write_text("rank 2/3 on node03 (pid 47)\n")
    found = _blame(tmp_path, plan, ["BAD TERMINATION", f"PID 50 RUNNING AT {hosts[1].address}"])
    assert (found.rank, found.host) == (2, "node03")
    assert found.error == (f"it went away during a collective (rank 1 on n2: Read error [{hosts[2].address}]:20128: "
                                    "Connection reset by peer)")
    assert found.log_tail == ("rank 2/3 on node03 (pid 47)",)


def test_a_rank_that_failed_by_itself_is_named_before_one_that_lost_it(tmp_path):
    hosts, plan = three_nodes()
    failures.write(tmp_path, 0, "node1", GLOO_RESET.format(peer=hosts[2].address), "Traceback ...")
    failures.write(tmp_path, 2, "node03", "MemoryError: out of memory", "Traceback ...")
    found = _blame(tmp_path, plan, [])
    assert (found.rank, found.host, found.error) == (2, "node03", "MemoryError: out of memory")


def test_a_lost_peer_outside_the_plan_leaves_the_rank_that_saw_it_in_one_line(tmp_path):
    _, plan = three_nodes()
    failures.write(tmp_path, 1, "n2", GLOO_RESET.format(peer="198.18.9.9"), "Traceback ...")
    found = _blame(tmp_path, plan, [])
    assert (found.rank, found.host) == (1, "n2")
    assert found.error == "Read error [198.18.9.9]:20128: Connection reset by peer"


class ScriptedMpirun:
    """Stands in for running containers: each mpirun is the next shell script, run for real."""

    def __init__(self, *scripts: str) -> None:
        self.scripts = list(scripts)
        self.plan = SimpleNamespace(np=4)

    def mpirun(self, argv: list[str]) -> list[str]:
        return ["sh", "-c", self.scripts.pop(0)]


REPORT = ('{"size": 4, "allreduce_ok": true, "ranks": ['
          + ", ".join(f'{{"rank": {r}, "host": "n{r}", "tensorflow": "2.15.1", "horovod": "0.28.1", "mpi": "MPICH 4.0.2"}}' for r in range(4))
          + "]}")
HYDRA_ERROR = "echo 'Launching'; echo 'main (ui/mpich/mpiexec.c:325): process manager error waiting for completion' >&2; exit 255"


def test_probe_reads_rank_zeros_report():
    report = preflight.probe(None, ScriptedMpirun(f"echo '{REPORT}'"))
    assert [r["host"] for r in report.ranks] == ["n0", "n1", "n2", "n3"]


def test_a_failed_probe_fails_at_once_with_hydras_words():
    running = ScriptedMpirun(HYDRA_ERROR, f"echo '{REPORT}'")
    with pytest.raises(EdgetrainError) as err:
        preflight.probe(None, running)
    assert "the MPI probe across 4 ranks failed" in str(err.value) and "process manager error" in str(err.value)
    assert len(running.scripts) == 1  # not tried again


def test_a_rank_that_ended_early_is_named_when_hydra_ended_it_before_it_could_say_so(tmp_path):
    plan = placement.plan(Inventory(Path("inv"), (host("head", groups=("head", "rpi")), host("node2"))), 2)
    failures.write(tmp_path, 0, "head", "FailedPreconditionError: Mismatched data types", "... HorovodAllreduce ...")
    failures.mark_ended(tmp_path, 1)
    (tmp_path / "rank.1.log").write_text("rank 1/2 on node2 (pid 4242)\n")
    found = _blame(tmp_path, plan, [])
    assert (found.rank, found.host) == (1, "node2")
    assert found.error.startswith("its script ended while other ranks were still training")


def test_an_exception_after_other_ranks_finished_is_still_the_cause(tmp_path):
    plan = placement.plan(Inventory(Path("inv"), (host("head", groups=("head", "rpi")), host("node2"))), 2)
    failures.write(tmp_path, 0, "head", "OSError: disk full", "Traceback ... OSError: disk full")
    failures.mark_ended(tmp_path, 1)
    found = _blame(tmp_path, plan, [])
    assert (found.rank, found.error) == (0, "OSError: disk full")


def found(running=True, lease="/home/mpi/runs/r/.lease/renewed", seconds=30.0):
    return containers.Found("edgetrain-r", "r", running, lease, seconds)


@pytest.mark.parametrize(("c", "here", "age", "removed", "said"), [
    (found(running=False), containers.Here.UNKNOWN, None, True, "stopped"),
    (found(), containers.Here.LIVE, None, False, "its run is going"),
    (found(), containers.Here.ENDED, None, True, "no command here holds it"),
    # Another controller's, or another runs directory's: only its lease, on the node's clock, can prove it dead.
    (found(), containers.Here.UNKNOWN, 4.0, False, "another controller renewed its lease 4 s ago"),
    (found(), containers.Here.UNKNOWN, 95.0, True, "its lease ran out 65 s ago"),
    (found(), containers.Here.UNKNOWN, None, False, "not proven dead"),
    (found(lease="", seconds=None), containers.Here.UNKNOWN, None, False, "not proven dead"),
], ids=["stopped", "live-here", "ended-here", "renewed-elsewhere", "lease-out", "lease-unreadable", "unlabelled"])
def test_clean_removes_only_a_container_proven_dead(c, here, age, removed, said):
    dead, why = containers.verdict(c, here, age)
    assert dead is removed and said in why


def test_the_containers_command_is_its_lease_which_the_ranks_cannot_renew():
    argv = containers.docker_run_argv(host("n1"), "edgetrain-r", "r", "/home/mpi/runs/r", "img", None)
    at = argv.index("img")
    assert "--init" in argv[:at]
    assert argv[at + 1:at + 8] == [containers.PYTHON, "-m", "edgetrain.rank.lease", f"{containers.RUN_MOUNT}/.lease/renewed",
                                   str(host("n1").lease_seconds), containers.LEASE_STATE, "--"]
    assert argv[at + 8] == "edgetrain-sshd"
    assert f"/home/mpi/runs/r/.lease:{containers.RUN_MOUNT}/.lease:ro" in argv
    assert f"{containers.LEASE_LABEL}=/home/mpi/runs/r/.lease/renewed" in argv


def test_a_node_that_refuses_a_new_connection_does_not_answer():
    """The second opinion before a node is called lost: a new connection, not the shared one."""
    refused = replace(host("n1"), address="127.0.0.1", port=1)  # nothing listens on loopback port 1
    with Nodes() as nodes:
        begun = time.monotonic()
        assert not nodes.answers(refused) and time.monotonic() - begun < 10
        assert nodes.answers(replace(host("here"), connection="local"))


def test_a_resumed_attempt_forgets_the_last_ones_records_so_a_rank_that_could_write_none_is_named_by_its_report(tmp_path):
    # Seen in a storm: rank 0's disk filled, so its record of this attempt was never written and
    # never came home; the home copy from the attempt before (a peer lost) was blamed instead.
    plan = placement.plan(Inventory(Path("inv"), (host("node1", groups=("head", "rpi")), host("node2"))), 2)
    failures.write(tmp_path, 0, "node1", "Horovod has been shut down. This was caused by an exception on one of the ranks", None)
    failures.mark_ended(tmp_path, 1)
    (tmp_path / "rank.0.log").write_text("rank 0/2 on node1 (pid 41)\n")
    reported = failures.Failure(0, "node1", 41, f"{failures.RUN_DIR_FULL}{failures.WRITING}checkpoints/epoch-0045", time.time())

    def found() -> blame.Finding:
        return blame.find(blame.Observed(runs.Run(tmp_path), plan, ["EXIT CODE: 1"], reported=(reported,)))

    assert failures.RUN_DIR_FULL not in found().error  # the stale records are blamed while they are there
    failures.clear_all(tmp_path)
    assert failures.read_all(tmp_path) == [] and failures.ended(tmp_path) == [] and (tmp_path / "rank.0.log").exists()
    assert (found().rank, found().error) == (0, reported.error)
