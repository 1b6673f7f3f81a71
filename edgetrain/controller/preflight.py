"""Node preflight: every check a run needs on every node of its placement; ``edgetrain doctor -i``
shows the same checks as a table, then an MPI probe across throwaway containers."""

from __future__ import annotations

import functools
import json
import shlex
import subprocess
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from edgetrain.controller import containers, gpu, images
from edgetrain.shared import datasets
from edgetrain.shared.errors import EdgetrainError
from edgetrain.controller.inventory import Host
from edgetrain.controller.placement import Placement
from edgetrain.controller.remote import Nodes

MIN_FREE_DISK = 2 * 1024**3
# A node's clock further than this from the controller's is reported: the times in its logs and
# records disagree with the controller's, and one hours or years off (a Pi without a real-time
# clock, before NTP) is not synced at all.
CLOCK_SKEW_REPORTED = 2.0


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


def probe_report(proc: subprocess.CompletedProcess, failed: str, fix: str) -> dict:
    """Rank 0's report in a probe's output. It proves every rank started and took part in the gather
    and the allreduce; how Hydra then judges the ranks' ends (see edgetrain.rank.training.main) does not
    change that."""
    reports = [line for line in proc.stdout.splitlines() if line.startswith('{"size"')]
    if not reports:
        said = proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines() or ["no output"]
        raise EdgetrainError(f"{failed}: {' | '.join(said[-3:])}", fix)
    return json.loads(reports[-1])


@dataclass(frozen=True)
class Skew:
    """A node's clock against this machine's: ``seconds`` ahead (negative: behind), known to within
    ``error`` (half the round trip of the reading)."""

    seconds: float
    error: float

    @property
    def reported(self) -> bool:
        return abs(self.seconds) - self.error > CLOCK_SKEW_REPORTED

    def describe(self) -> str:
        if not self.reported:
            return f"within {CLOCK_SKEW_REPORTED:.0f} s of this machine's"
        return f"{_span(abs(self.seconds))} {'ahead of' if self.seconds > 0 else 'behind'} this machine's"


def _span(seconds: float) -> str:
    for unit, size in (("days", 86400), ("h", 3600), ("min", 60)):
        if seconds >= 2 * size:
            return f"{seconds / size:.0f} {unit}"
    return f"{seconds:.1f} s"


def read_skew(nodes: Nodes, host: Host) -> Skew:
    """The node's clock read once over its ssh connection, against this machine's around the reading."""
    before = time.time()
    said = nodes.check(host, ["date", "+%s.%N"], "reading the clock")
    after = time.time()
    try:
        return Skew(float(said) - (before + after) / 2, (after - before) / 2)
    except ValueError:
        raise EdgetrainError(f"the clock of {host.name} reads {said.strip()[:40]!r}, not seconds") from None


def skewed(reports: list[NodeReport]) -> list[str]:
    """One line per node whose clock is far from this machine's."""
    return [f"preflight: the clock of {r.host.name} is {r.skew.describe()} (sync it with NTP: timedatectl set-ntp true)"
            for r in reports if r.skew and r.skew.reported]


@dataclass
class NodeReport:
    host: Host
    checks: list[Check] = field(default_factory=list)
    runs_dir: str | None = None  # the node's runs directory, absolute
    image_id: str | None = None
    packages: dict[str, str] = field(default_factory=dict)  # what the node's image holds, from its labels
    data_formats: dict[str, str] = field(default_factory=dict)  # dataset -> format found on the node
    skew: Skew | None = None  # its clock against this machine's

    @property
    def failure(self) -> Check | None:
        return next((c for c in self.checks if not c.ok), None)


def _node_checks(nodes: Nodes, host: Host, wanted: tuple[str, ...], expected_id: str | None, fix_data: str) -> NodeReport:
    """ssh first (nothing else can be asked without it), then the engine, the image (and a GPU
    node's driver and GPUs), each dataset, the disk; the report holds each check's result."""
    node = _NodeChecks(nodes, host, NodeReport(host), expected_id, fix_data)
    if not node.step("ssh", node.ssh):
        return node.rep
    node.step("clock", node.clock)
    if node.step("docker", node.engine) and node.step("image", node.image) and host.is_gpu:
        # The driver answers and supports the image's CUDA, a container sees the GPUs, one per slot.
        node.step("gpu", lambda: "; ".join([(found := gpu.check_host(nodes, host)).summary(), *found.warnings]))
    for dataset in wanted:
        node.step("dataset", functools.partial(node.dataset, dataset))
    node.step("disk", node.disk)
    return node.rep


@dataclass
class _NodeChecks:
    """One node's checks, each returning what it found (a line) or raising what is wrong."""

    nodes: Nodes
    host: Host
    rep: NodeReport
    expected_id: str | None
    fix_data: str

    def step(self, name: str, fn: Callable[[], str]) -> bool:
        try:
            self.rep.checks.append(Check(name, True, fn()))
            return True
        except EdgetrainError as exc:
            self.rep.checks.append(Check(name, False, str(exc)))
            return False

    def ssh(self) -> str:
        host = self.host
        said = self.nodes.check(host, ["true"], "ssh")
        if said.strip():
            # Every answer edgetrain reads from a node would start with this text.
            raise EdgetrainError(f"the login shell of {host.ssh_target} prints text for commands run over ssh "
                                 f"({said.strip().splitlines()[0][:60]!r})",
                                 "make the shell's startup files print only in interactive shells (e.g. test $- for i in ~/.bashrc)")
        return f"{host.ssh_target} port {host.port}"

    def clock(self) -> str:
        self.rep.skew = read_skew(self.nodes, self.host)
        return self.rep.skew.describe()

    def engine(self) -> str:
        version = self.nodes.check(self.host, ["docker", "version", "--format", "{{.Server.Version}}"], "asking the Docker engine",
                                   "start Docker on the node, and let the ssh user use it (ansible-playbook ... --tags docker)")
        left = containers.leftovers(self.nodes, self.host)
        if left:
            raise EdgetrainError(f"container {next(iter(left))} of another run is still on {self.host.name}",
                                 "if no run is going: edgetrain clean -i INVENTORY")
        return f"Docker {version.strip()}"

    def image(self) -> str:
        host, tag = self.host, images.image_for(self.host)
        proc = self.nodes.run(host, ["docker", "image", "inspect", "--format", "{{.Id}} {{.Architecture}} {{json .Config.Labels}}", tag])
        if proc.returncode != 0:
            raise EdgetrainError(f"{host.name} has no image {tag}", "edgetrain images distribute -i INVENTORY")
        self.rep.image_id, arch, labels = proc.stdout.split(maxsplit=2)
        self.rep.packages = images.packages(json.loads(labels) or {})
        want = images.target_for(host).docker_arch
        if arch != want:
            raise EdgetrainError(f"{tag} on {host.name} is {arch}, the node is {want}", "set edgetrain_image to an image of its arch")
        if self.expected_id and self.rep.image_id != self.expected_id:
            raise EdgetrainError(f"{tag} on {host.name} is {self.rep.image_id[7:19]}, this machine's is {self.expected_id[7:19]}",
                                 "edgetrain images distribute -i INVENTORY")
        return f"{tag} {self.rep.image_id[7:19]} ({arch})"

    def dataset(self, dataset: str) -> str:
        where = f"{self.host.datasets_dir}/{dataset}"
        script = f"cd {shlex.quote(where)} 2>/dev/null && sha256sum -- {' '.join(datasets.candidate_names(dataset))} 2>/dev/null; true"
        out = self.nodes.check(self.host, ["sh", "-c", script], "hashing the dataset")
        digests = {name: digest for digest, name in (line.split(None, 1) for line in out.splitlines() if line.strip())}
        self.rep.data_formats[dataset] = datasets.choose_format(dataset, digests, f"{self.host.name}:{where}", self.fix_data)
        return f"{dataset} ({self.rep.data_formats[dataset]}) in {where}, sha256 verified"

    def disk(self) -> str:
        d = self.host.runs_dir
        out = self.nodes.check(self.host, ["sh", "-c", f"mkdir -p {shlex.quote(d)} && cd {shlex.quote(d)} && pwd && df -Pk ."],
                               f"creating {d}")
        lines = out.splitlines()
        self.rep.runs_dir, free = lines[0], int(lines[-1].split()[3]) * 1024
        if free < MIN_FREE_DISK:
            raise EdgetrainError(f"only {free / 1024**3:.1f} GiB free in {self.rep.runs_dir} on {self.host.name}",
                                 "free some disk or set edgetrain_runs_dir for the node")
        return f"{self.rep.runs_dir}, {free / 1024**3:.0f} GiB free"


def check_nodes(nodes: Nodes, plan: Placement, wanted: tuple[str, ...], inventory_source: Path) -> list[NodeReport]:
    """Every check on every node of the placement, in parallel; nothing is changed but run dirs."""
    expected = {tag: images.local_image_id(tag) for tag in {images.image_for(h) for h in plan.hosts}}
    fix_data = f"stage it: ansible-playbook -i {inventory_source} playbooks/site.yml --tags datasets"
    with ThreadPoolExecutor(max_workers=min(16, len(plan.hosts))) as pool:
        reports = list(pool.map(lambda h: _node_checks(nodes, h, wanted, expected[images.image_for(h)], fix_data), plan.hosts))
    # With no copy on this machine to compare with, the nodes must at least agree with each other.
    for tag, want in expected.items():
        held = [(r, r.image_id) for r in reports if images.image_for(r.host) == tag and r.image_id]
        if want is None and held:
            ref, ref_id = held[0]
            for r, image_id in held[1:]:
                if image_id != ref_id:
                    r.checks.append(Check("image", False, f"{tag} on {r.host.name} is {image_id[7:19]} but {ref_id[7:19]} on {ref.host.name}"))
    return reports


SAME_VERSIONS_FIX = "rebuild and distribute the images so every node runs the same versions"
# torch is pinned per architecture (constraints.txt): the newest each CPU runs, so images of two
# architectures disagree by design, and a rebuild would not make them agree.
TORCH_VERSIONS_FIX = ("train with torch on nodes of one architecture (--group), or pin one torch for every "
                      "architecture in constraints.txt and rebuild the images")


def require(reports: list[NodeReport], needs: str, loads: tuple[str, ...]) -> None:
    """Every node passed its checks, its image holds what the run's strategy ``needs``, and the
    images hold one version of each package the ranks ``loads`` (all by their labels)."""
    for r in reports:
        if r.failure:
            raise EdgetrainError(f"preflight: {r.host.name}: {r.failure.name}: {r.failure.detail}")
    lacking = [r.host.name for r in reports if needs not in r.packages]
    if lacking:
        raise EdgetrainError(f"preflight: {', '.join(lacking)}: the image has no {needs}, which the run's strategy needs",
                             "rebuild the image (edgetrain images build --arch ARCH) and distribute it (edgetrain images distribute)")
    first = reports[0]
    for r in reports[1:]:
        for name in loads:
            if r.packages.get(name) != first.packages.get(name):
                arches = {images.target_for(x.host).name for x in (first, r)}
                fix = TORCH_VERSIONS_FIX if name == "torch" and len(arches) > 1 else SAME_VERSIONS_FIX
                raise EdgetrainError(f"preflight: the image on {r.host.name} has {name} {r.packages.get(name) or 'missing'}, "
                                     f"the one on {first.host.name} {first.packages.get(name) or 'missing'}", fix)


@dataclass(frozen=True)
class ProbeReport:
    ranks: list[dict]
    seconds: float




def _probe_once(running: containers.Containers, timeout: float) -> dict:
    proc = subprocess.run(running.mpirun([containers.PYTHON, "-m", "edgetrain.rank.probe"]), capture_output=True, text=True, timeout=timeout, check=False)
    return probe_report(proc, f"the MPI probe across {running.plan.np} ranks failed", containers.REACH_FIX)


def probe(nodes: Nodes, running: containers.Containers, timeout: float = 180) -> ProbeReport:
    """mpi4py across the planned ranks inside the containers: where each runs, with what, and one allreduce."""
    start = time.monotonic()
    # No second try: the probe's occasional "process manager error waiting for completion" was
    # Hydra taking the ranks' ends for deaths, which edgetrain.rank.pmi prevents.
    try:
        report = _probe_once(running, timeout)
    except subprocess.TimeoutExpired:
        raise EdgetrainError(f"the MPI probe across {running.plan.np} ranks did not finish within {timeout:.0f} s", containers.REACH_FIX) from None
    if not report["allreduce_ok"]:
        raise EdgetrainError(f"the MPI probe's allreduce over {report['size']} ranks gave a wrong sum")
    keys = ("tensorflow", "horovod", "mpi")
    ref = report["ranks"][0]
    for r in report["ranks"]:
        for k in keys:
            if r[k] != ref[k]:
                raise EdgetrainError(f"rank {r['rank']} on {r['host']} has {k} {r[k]}, rank 0 on {ref['host']} has {ref[k]}",
                                     SAME_VERSIONS_FIX)
    return ProbeReport(report["ranks"], time.monotonic() - start)


