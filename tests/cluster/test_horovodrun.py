"""One Horovod script, the seed's LeNet recipe, through edgetrain against the same script started
the way Horovod's documentation starts it in Docker ("Horovod in Docker": a container with sshd on
port 12345 on every node, host networking, the same key in each, and ``horovodrun --gloo`` run in
the first), on the emulated Pi 4 testbed, N = 1 to its nodes, one rank per node, interleaved so the
machine's drift falls on both alike: the time to the target validation accuracy (from the command,
and from the script's own first step), the epochs it took, and the last epoch's img/s.

horovodrun's clock starts when its containers are started, since ``edgetrain run`` starts its own
within its time; the start of horovodrun itself is given too. Each launcher runs with its own
defaults (edgetrain: Gloo and a long Horovod cycle on several CPU nodes; horovodrun: its cycle
and fusion defaults, Gloo on ``--network-interface eth0``), which is the comparison a user makes.

A measurement, reported rather than asserted (-m bench): ``pytest -m bench tests/cluster/test_horovodrun.py -s``,
under the optimistic bracket, or with EDGETRAIN_TESTBED_BRACKET=pessimistic the other (docs/scaling.md).

With EDGETRAIN_HOROVODRUN_TARGET (a held-out accuracy) the two launchers race edgetrain's own LeNet
recipe instead - the same module, ``edgetrain.rank.training --job lenet``, which ``edgetrain run
lenet`` starts in each rank and horovodrun starts here as any Horovod program - to that accuracy on
6,000 images held out of the training set, scored four times an epoch, its rate annealed over
EDGETRAIN_HOROVODRUN_EPOCHS epochs (4), seed EDGETRAIN_HOROVODRUN_SEED (44), at each N of
EDGETRAIN_HOROVODRUN_N (default "1 2 3 4"), the launchers taking turns at going first.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import subprocess
import tarfile
import tempfile
import time
from io import BytesIO
from pathlib import Path

import pytest

from edgetrain.controller import containers, images
from edgetrain.controller.bench.model import evaluation_interval
from edgetrain.shared import datasets, job_options, progress, runs
from edgetrain.shared.jobs import get as get_job
from lab.emulation import SEED as SCRIPT

from .long_run import TEST_ACCURACY, TimedOutput, completed, epoch_lines, in_turns

pytestmark = [pytest.mark.cluster, pytest.mark.docker, pytest.mark.slow, pytest.mark.bench]

# 98%: the seed's LeNet crosses it in its first epoch at every N (98.44% at one node, where 98.5%
# took a second epoch of 280 s): a target an epoch's random start flips would time the flip.
TARGET = float(os.environ.get("EDGETRAIN_BENCH_TARGET", "0.98"))
ARGS = ["--epochs", "3", "--stop-at-accuracy", str(TARGET)]
NAME = "horovodrun-bench"
TIMEOUT = 3600
RACE_TARGET = os.environ.get("EDGETRAIN_HOROVODRUN_TARGET")
RACE_COUNTS = tuple(int(n) for n in os.environ.get("EDGETRAIN_HOROVODRUN_N", "1 2 3 4").split())
HOLDOUT = 6000
# Rank 0's progress events on horovodrun's stdout carry this mark (edgetrain.shared.progress).
TOKEN = "horovodrun"


@dataclasses.dataclass
class Result:
    to_target: float | None  # seconds from the command to rank 0's line for the epoch that reached it
    from_first_step: float | None  # the same, by the script's clock from its first step
    epochs: int
    rate: float  # the last epoch's training img/s
    accuracy: list[float]  # each epoch's validation accuracy
    started: float = 0.0  # for horovodrun: seconds from the command to horovodrun's own start

    def __str__(self) -> str:
        reached = (f"{TARGET:.1%} in {self.to_target:.1f} s ({self.from_first_step:.1f} s from the first step, {self.epochs} epochs)"
                   if self.to_target is not None else f"{TARGET:.1%} not reached in {self.epochs} epochs")
        return f"{reached}, {self.rate:.0f} img/s, validation " + " / ".join(f"{a:.2%}" for a in self.accuracy)


def result(said: TimedOutput, start: float) -> Result:
    """What rank 0's epoch lines say, each at the time it came (horovodrun prefixes them with its rank)."""
    epochs = epoch_lines(said)
    hit = next(((t, e) for t, e in epochs if e["val_accuracy"] >= TARGET), None)
    return Result(hit and hit[0] - start, hit and hit[1]["seconds_from_first_step"], len(epochs), epochs[-1][1]["images_per_sec"],
                  [e["val_accuracy"] for _, e in epochs])


def through_edgetrain(cluster, inventory: str, n: int) -> Result:
    return result(*completed(cluster, str(SCRIPT), "--np", str(n), "-i", inventory, "--dataset", "mnist", "--hang-timeout", "3600",
                             "--", *ARGS, timeout=TIMEOUT))


def ssh_dir() -> bytes:
    """/root/.ssh for every container: one key, accepted by all, and the port horovodrun's ssh uses
    (what Horovod's Docker instructions share between the nodes)."""
    with tempfile.TemporaryDirectory() as tmp:
        keys = Path(tmp)
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(keys / "id_ed25519")], check=True)
        (keys / "authorized_keys").write_bytes((keys / "id_ed25519.pub").read_bytes())
        (keys / "config").write_text(f"Host *\n    Port {containers.SSH_PORT}\n    StrictHostKeyChecking no\n"
                                     "    UserKnownHostsFile /dev/null\n    LogLevel ERROR\n")
        buf = BytesIO()
        with tarfile.open(fileobj=buf, mode="w") as tar:
            for f in sorted(keys.iterdir()):
                tar.add(f, arcname=f.name)
        return buf.getvalue()


@contextlib.contextmanager
def horovodrun_containers(cluster, n: int, keys: bytes, files: dict[str, bytes]):
    """A container of the image on each of the first n nodes as Horovod's Docker instructions set
    them up (``files`` in /work), every sshd answering: yields the command that runs a program in
    the first, and the monotonic time the containers were started. Removed at the end."""
    nodes = cluster.bed.state.nodes[:n]
    work = f"{cluster.home}/{NAME}"
    for node in nodes:
        subprocess.run(cluster.bed.ssh_argv(node) + [f"rm -rf {work} && install -d -m 700 {work}/ssh && tar -C {work}/ssh -xf -"],
                       input=keys, check=True, timeout=60)
        for name, body in files.items():
            subprocess.run(cluster.bed.ssh_argv(node) + [f"cat > {work}/{name}"], input=body, check=True, timeout=60)
    start = time.monotonic()
    try:
        for i, node in enumerate(nodes):
            cluster.docker(node.name, "run", "--detach", "--name", f"{NAME}-{i}", "--network", "host", "--shm-size", containers.SHM_SIZE,
                           "-v", f"{work}/ssh:/root/.ssh", "-v", f"{work}:/work", "-v", f"{cluster.home}/datasets:/data:ro",
                           images.TARGETS["amd64"].tag)
        head = [*nodes[0].docker_cli, "exec", "-w", "/work", f"{NAME}-0"]
        # horovodrun checks every host's ssh once and gives up: it is started once each sshd answers.
        for node in nodes:
            while subprocess.run(head + ["ssh", "-o", "BatchMode=yes", node.address, "true"], capture_output=True).returncode:
                assert time.monotonic() - start < 120, f"sshd on {node.name} did not answer"
                time.sleep(0.2)
        yield head, start
    finally:
        for i, node in enumerate(nodes):
            cluster.docker(node.name, "rm", "-f", f"{NAME}-{i}", check=False)


def horovodrun(head: list[str], nodes, program: list[str]) -> TimedOutput:
    """``horovodrun --gloo`` of ``program`` on ``nodes``, one slot each, to its successful end."""
    # On one host horovodrun needs the loopback interface (it refuses eth0 there).
    nic = ["--network-interface", "eth0"] if len(nodes) > 1 else []
    proc = subprocess.Popen(head + ["horovodrun", "--gloo", "-np", str(len(nodes)), "-H", ",".join(f"{x.address}:1" for x in nodes),
                                    "-p", str(containers.SSH_PORT), *nic, "--start-timeout", "120", *program],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    said = TimedOutput(proc)
    proc.wait(timeout=TIMEOUT)
    said.caught_up()
    assert proc.returncode == 0, "".join(said.out)[-3000:] + "".join(said.err)[-3000:]
    return said


def through_horovodrun(cluster, n: int, keys: bytes) -> Result:
    with horovodrun_containers(cluster, n, keys, {"train.py": SCRIPT.read_bytes()}) as (head, start):
        began = time.monotonic()
        got = result(horovodrun(head, cluster.bed.state.nodes[:n], ["python", "train.py", "--data", "/data", *ARGS]), start)
        got.started = began - start
        return got


def test_a_horovod_script_through_edgetrain_against_horovodrun(cluster, emulated, conditions, report):
    inventory = cluster.docker_inventory("docker-one-slot.yml", head_slots=1)
    nodes = cluster.bed.state.nodes
    # Untimed, once on every node: a node's first container reads the image from a cold disk.
    for node in nodes:
        cluster.docker(node.name, "run", "--rm", "--network", "none", images.TARGETS["amd64"].tag, "python3", "-c", "import horovod.tensorflow")
    keys, rows = ssh_dir(), []
    if RACE_TARGET is not None:
        race(cluster, inventory, keys, conditions, report)
        return
    for n in range(1, len(nodes) + 1):
        et = through_edgetrain(cluster, inventory, n)
        print(f"N={n}: edgetrain {et}", flush=True)
        hr = through_horovodrun(cluster, n, keys)
        ratio = f"{hr.to_target / et.to_target:.2f}x" if et.to_target and hr.to_target else "n/a"
        rows.append(f"N={n}: edgetrain {et}; horovodrun --gloo {hr} (horovodrun started {hr.started:.1f} s after its containers); "
                    f"edgetrain's time to target {ratio} as fast")
        print(rows[-1], flush=True)
    report[f"seed LeNet to {TARGET:.1%}, {conditions}: edgetrain run against horovodrun --gloo"] = "; ".join(rows)
    assert cluster.leftovers() == {}


# -- the race to a held-out accuracy: edgetrain's LeNet recipe through each launcher ---------------

@dataclasses.dataclass
class Raced:
    to_target: float | None  # seconds from the command to rank 0's word that the target was reached
    from_first_step: float | None  # the same, by the recipe's clock from its first step
    images: int | None  # trained on by then
    rate: float  # the first epoch's img/s (its evaluations left out)
    test_accuracy: float | None
    wall: float

    def __str__(self) -> str:
        reached = (f"{RACE_TARGET} at {self.to_target:.1f} s ({self.from_first_step:.1f} s from the first step) after {self.images:,} images"
                   if self.to_target is not None else f"{RACE_TARGET} not reached")
        test = f"{self.test_accuracy:.2%}" if self.test_accuracy is not None else "not scored"
        return f"{self.rate:.0f} img/s, {reached}, test {test}, wall {self.wall:.1f} s"


def recipe_args(n: int) -> list[str]:
    """The recipe's options at n ranks, on the command line both ``edgetrain run lenet`` and the
    module take (the one edgetrain's worker gives the module)."""
    steps = datasets.trained_on("mnist", HOLDOUT) // n // get_job("lenet").batch_size
    options = job_options.JobOptions(epochs=int(os.environ.get("EDGETRAIN_HOROVODRUN_EPOCHS", "4")), holdout=HOLDOUT,
                                     target_accuracy=float(RACE_TARGET), seed=int(os.environ.get("EDGETRAIN_HOROVODRUN_SEED", "44")))
    options = dataclasses.replace(options, eval_every=evaluation_interval(steps, options.steps_per_execution))
    return job_options.argv(dataclasses.asdict(options))


def raced(start: float, reached_at: float | None, evaluations: list[dict], epochs: list[dict], test: dict | None) -> Raced:
    hit = next((e for e in evaluations if e.get("reached")), None)
    return Raced(reached_at - start if hit and reached_at else None, hit and hit["seconds"], hit and hit["images"],
                 epochs[0]["images_per_sec"], test and test["test_accuracy"], time.monotonic() - start)


def race_through_edgetrain(cluster, inventory: str, n: int) -> Raced:
    before = cluster.run_ids()
    said, start = completed(cluster, "lenet", "--np", str(n), "-i", inventory, "--hang-timeout", "600",
                            *recipe_args(n), timeout=TIMEOUT)
    run = runs.Run(cluster.runs / cluster.new_run(before))
    return raced(start, said.said("target val_accuracy"), run.evaluations(), run.metrics(), run.test_score())


def race_through_horovodrun(cluster, n: int, keys: bytes) -> Raced:
    """The module horovodrun starts on every rank, its events on stdout where the test reads them:
    what ``edgetrain run`` gives the module otherwise (the node's datasets, rank 0's events)."""
    env = ["env", "EDGETRAIN_DATA=/data", "EDGETRAIN_EVENTS_FD=1", f"{progress.TOKEN_ENV}={TOKEN}"]
    with horovodrun_containers(cluster, n, keys, {}) as (head, start):
        said = horovodrun(head, cluster.bed.state.nodes[:n],
                          [*env, "python", "-m", "edgetrain.rank.training", "--job", "lenet", *recipe_args(n)])
    events = [e for line in said.out for e in progress.parse(line, TOKEN) if isinstance(e, dict)]
    # The score is a record of metrics.jsonl, and a line rank 0 prints.
    tested = TEST_ACCURACY.search("".join(said.out))
    return raced(start, said.said('"reached": true'), [e for e in events if e.get("event") == "eval"],
                 [e for e in events if e.get("event") == "epoch"], tested and {"test_accuracy": float(tested.group(1))})


def race(cluster, inventory: str, keys: bytes, conditions: str, report) -> None:
    rows = []
    for i, n in enumerate(RACE_COUNTS):
        launchers = [("edgetrain", lambda: race_through_edgetrain(cluster, inventory, n)),
                     ("horovodrun", lambda: race_through_horovodrun(cluster, n, keys))]
        timed = in_turns(i, launchers)
        et, hr = timed["edgetrain"], timed["horovodrun"]
        row = f"N={n}: " + "; ".join(f"{name} {t}" for name, t in timed.items())
        if et.to_target is not None and hr.to_target is not None:
            # At 3 ranks and more the paths can part, even between two runs through one launcher:
            # Horovod fuses whichever gradients are ready at each cycle, and Gloo's ring then sums
            # some of them in another order (at 2 ranks a sum of two has one).
            row += (f"; edgetrain {hr.to_target / et.to_target:.2f}x horovodrun's speed to {RACE_TARGET} from the command, "
                    f"{hr.from_first_step / et.from_first_step:.2f}x from the first step, "
                    f"{(hr.from_first_step / hr.images) / (et.from_first_step / et.images):.2f}x per image trained")
        rows.append(row)
        print(row, flush=True)
    report[f"edgetrain's LeNet recipe to {RACE_TARGET} held-out, {conditions}: edgetrain run against horovodrun --gloo"] = "; ".join(rows)
    assert cluster.leftovers() == {}
