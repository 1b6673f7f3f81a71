"""Where the ranks run: on the hosts themselves (``host``) or in the edgetrain image on every node
(``docker``). Both sit behind one small interface, so the launcher never asks which it has.

A runtime is made by checking its nodes (``checked``: what the checks found is part of it, so
every method works from then on), stages what a run needs there (the shipped working directory,
the datasets), starts whatever the ranks run in, gives the ``mpirun`` command line, is told the
``mpirun`` process (``attach``), reports whether each node is still alive, interrupts or stops
the ranks, and removes everything it started.
"""

from __future__ import annotations

import importlib.util
import os
import posixpath
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from edgetrain.controller import containers, images, preflight, requirements, shipping
from edgetrain.controller.containers import NodeState
from edgetrain.shared import datasets, mpi, runs, workdir
from edgetrain.shared.errors import EdgetrainError
from edgetrain.shared.layout import RankFile, RunLayout
from edgetrain.controller.inventory import Host, Inventory
from edgetrain.controller.placement import Placement
from edgetrain.controller.program import Program
from edgetrain.controller.remote import Nodes
from edgetrain.controller.strategies import Strategy

CHECK_PORTS = (
    "import socket, sys\n"
    "for p in sys.argv[1:]:\n"
    "    s = socket.socket()\n"
    "    s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "    try:\n"
    "        s.bind(('', int(p)))\n"
    "    except OSError:\n"
    "        print(p)\n"
    "    s.close()\n"
)


@dataclass(kw_only=True)
class Runtime:
    """The part both runtimes share: the placement, the ssh session to the nodes, and what ranks see."""

    name: ClassVar[str] = ""
    python: ClassVar[str] = sys.executable  # the ranks' Python
    has_nodes: ClassVar[bool] = False  # whether states() looks at the run's nodes (its containers) or at nothing
    plan: Placement
    inventory: Inventory
    nodes: Nodes
    versions: dict = field(default_factory=dict)
    log: Callable[[str], None] = print
    shipped: list[shipping.Shipped] = field(default_factory=list)
    mpirun_process: subprocess.Popen | None = None  # once attached

    @classmethod
    def checked(cls, plan: Placement, inventory: Inventory, program: Program, *, data_dir: Path | None = None,
                strategy: Strategy, log: Callable[[str], None] = print) -> Runtime:
        """The runtime for ``plan`` once every check that needs no run directory has passed
        (``data_dir``: where this machine keeps its datasets, for the host runtime; ``strategy``:
        the run's, whose ``needs`` every rank imports)."""
        nodes = Nodes()
        try:
            found = cls.check(nodes, plan, inventory, program, data_dir, strategy, log)
        except BaseException:
            nodes.close()
            raise
        return cls(plan=plan, inventory=inventory, nodes=nodes, log=log, **found)

    @staticmethod
    def check(nodes: Nodes, plan: Placement, inventory: Inventory, program: Program, data_dir: Path | None, strategy: Strategy,
              log: Callable[[str], None]) -> dict:
        """Every check that needs no run directory; raises on the first failure, else returns what
        it found (this runtime's fields)."""
        raise NotImplementedError

    # -- what the ranks see -------------------------------------------------------------------
    def run_dir(self, run: runs.Run) -> str:
        raise NotImplementedError

    def store(self, run: runs.Run) -> str:
        raise NotImplementedError

    def data_dir(self, run: runs.Run) -> str:
        raise NotImplementedError

    # -- the steps of a launch ----------------------------------------------------------------
    def check_ports(self, ports: dict[str, list[int]], strategy: Strategy) -> None:
        """Refuse ports (per host name) that something already listens on."""
        for h in self.plan.hosts:
            wanted = [str(p) for p in ports.get(h.name, [])]
            if not wanted:
                continue
            python = sys.executable if h.is_local else "python3"
            busy = self.nodes.check(h, [python, "-c", CHECK_PORTS, *wanted], "checking ports").split()
            if busy:
                taken = f"port {wanted[0]}" if len(wanted) == 1 else f"ports {wanted[0]}-{wanted[-1]}"
                raise EdgetrainError(f"port {busy[0]} is already in use on {h.name}; {strategy.name} needs {taken} there",
                                     f"pass another --{(strategy.port_option or 'port').replace('_', '-')}")

    def node_run_dirs(self, run: runs.Run) -> dict[str, str]:
        raise NotImplementedError

    def stage(self, run: runs.Run, manifest: workdir.Manifest | None) -> None:
        """Ship the working directory to every node's store and leave its manifest in the run dir."""
        if manifest is None:
            return
        dirs = self.node_run_dirs(run)
        body = manifest.to_json()

        def one(h: Host) -> shipping.Shipped:
            store = containers.store_dir(dirs[h.name])
            shipped = shipping.ship(self.nodes, h, store, manifest)
            shipping.give_view(self.nodes, h, store, containers.store_view(dirs[h.name]), manifest)
            target = str(RunLayout.posix(dirs[h.name]).workdir_manifest)
            self.nodes.check(h, ["sh", "-c", f"{containers.private_dirs(dirs[h.name])} && {containers.write_file(target)}"],
                             "writing the working directory's manifest", input=body)
            return shipped

        # Every node at once: one after another, a launch waited for the sum of the nodes' Python starts.
        with ThreadPoolExecutor(max_workers=min(16, len(self.plan.hosts))) as pool:
            self.shipped.extend(pool.map(one, self.plan.hosts))

    def start(self, run: runs.Run) -> None:
        """Start what the ranks run in (nothing on the host runtime)."""

    def hydra(self, run: runs.Run) -> mpi.Hydra:
        """mpirun as it starts where rank 0 runs."""
        raise NotImplementedError

    def on_head(self, argv: list[str]) -> list[str]:
        """The local argv that runs ``argv`` where rank 0 runs, its output streamed."""
        return argv

    def mpirun(self, run: runs.Run, worker: list[str], expendable: Callable[[int], bool] = lambda rank: False,
               token: str = "") -> list[str]:
        """The local argv that starts ``worker`` on every rank: one ``mpirun`` over the placement,
        or, where the run goes on without some host's ranks (``expendable``), one per host under
        edgetrain.rank.hostjobs, whose lost-job events carry ``token``."""
        hydra = self.hydra(run)
        jobs = self.plan.host_jobs(hydra, worker, expendable)
        if jobs is None:
            return self.on_head([*hydra.argv(self.plan.np), *worker])
        return self.on_head([self.python, "-m", "edgetrain.rank.hostjobs", "--events-token", token, mpi.encode_jobs(jobs)])

    def lose(self, host: Host) -> None:
        """The run goes on without ``host``: it is no longer watched."""

    def attach(self, process: subprocess.Popen) -> None:
        """The ``mpirun`` started from ``mpirun()``'s command line, in a session of its own."""
        self.mpirun_process = process

    def states(self) -> list[containers.NodeState]:
        """Each node's state while the run goes on; empty when there is nothing to watch."""
        return []

    def out_of_reach(self, names: frozenset[str]) -> None:
        """The nodes the latest looks found out of reach (the attempt's monitor says): its stop and
        cleanup do not wait on them."""

    def stop(self) -> None:
        """End every rank at once (the watcher's way out, and a disk full before the start)."""

    def interrupt(self) -> None:
        """Ctrl-C: the ranks are asked to end; the launcher waits a grace period, then kills mpirun."""
        self.stop()

    def finish(self, run: runs.Run) -> list[str]:
        """Remove what was started and bring the rank logs home; the problems met doing so."""
        self.nodes.close()
        return []

    def record(self, run: runs.Run) -> dict:
        return {}


WORKER_MODULE = "edgetrain.rank.worker"


@dataclass(frozen=True)
class RankDirs:
    """Where a rank finds the run's directory, the store's view of its files, and the datasets."""

    run: str
    store: str
    data: str


IN_CONTAINER = RankDirs(containers.RUN_MOUNT, containers.STORE_MOUNT, containers.DATA_MOUNT)


def worker_command(python: str, dirs: RankDirs, strategy: Strategy, program: Program, token: str, extra: list[str]) -> list[str]:
    """``edgetrain.rank.worker``'s command line, the same for every rank: ``extra`` (the strategy's
    peers, a resume) before the program and its arguments."""
    return [python, "-m", WORKER_MODULE, "--run-dir", dirs.run, "--store", dirs.store, "--data", dirs.data,
            "--strategy", strategy.name, "--job-name", program.name, "--events-token", token, *extra, *program.worker_args()]


def training_already(nodes: Nodes, host: Host) -> list[str]:
    """The host-runtime runs whose ranks train on ``host`` now, whoever started them, each as
    "run ID (N ranks, user U)": their workers' processes. A run in containers is not counted: the
    docker runtime refuses a node with another run's container."""
    workers: dict[str, tuple[str, str, str]] = {}  # pid -> parent pid, user, run directory
    for line in nodes.check(host, ["ps", "-ww", "-eo", "pid=,ppid=,user=,args="], "listing processes").splitlines():
        pid, ppid, user, *argv = line.split()
        # A rank's worker, as Hydra starts it (mpirun's own argv holds the same words further on).
        if argv[1:3] == ["-m", WORKER_MODULE] and "--run-dir" in argv[:-1]:
            workers[pid] = (ppid, user, argv[argv.index("--run-dir") + 1])
    found: dict[tuple[str, str], int] = {}
    for ppid, user, run_dir in workers.values():
        # A worker's own child (the program it runs) is the same rank; a container's are another runtime's.
        if ppid not in workers and run_dir != IN_CONTAINER.run:
            key = (posixpath.basename(run_dir.rstrip("/")), user)
            found[key] = found.get(key, 0) + 1
    return [f"run {rid} ({n} rank{'s' if n > 1 else ''}, user {user})" for (rid, user), n in sorted(found.items())]


@dataclass(kw_only=True)
class HostRuntime(Runtime):
    """Ranks run on the hosts themselves, ``mpirun`` on this machine (the embedded default)."""

    name: ClassVar[str] = "host"
    mpirun_exe: str
    required: dict[str, datasets.DatasetFiles]  # the datasets the program names
    staged: dict[str, datasets.DatasetFiles]  # every dataset this machine has, the required ones among them

    @staticmethod
    def check(nodes: Nodes, plan: Placement, inventory: Inventory, program: Program, data_dir: Path | None, strategy: Strategy,
              log: Callable[[str], None]) -> dict:
        if not plan.head.is_local:
            raise EdgetrainError(
                f"the host runtime starts mpirun on this machine, but rank 0's host {plan.head.name} is another machine",
                "use --runtime docker, or run edgetrain on the head node",
            )
        if importlib.util.find_spec(strategy.needs) is None:
            raise EdgetrainError(f"this machine's Python ({sys.executable}) has no {strategy.needs}, which the run's strategy needs",
                                 strategy.install_fix)
        mpirun_exe = mpi.mpirun_path()
        required = {d: datasets.locate(d, data_dir) for d in program.datasets}
        # As on a provisioned node, every dataset this machine has is staged, so that a script's
        # Keras load_data() finds it offline without naming it; --dataset only makes one required.
        staged = dict(required)
        for d in datasets.DATASETS:
            if d not in staged:
                try:
                    staged[d] = datasets.locate(d, data_dir)
                except EdgetrainError:
                    pass
        if program.requirements is not None:
            requirements.install_here(program.requirements, requirements.read(program.requirements), log)
        for h in plan.hosts:
            for other in training_already(nodes, h):
                log(f"edgetrain: warning: {h.name} already trains {other}: the two runs share its cores, each slower than alone")
        return {"mpirun_exe": mpirun_exe, "required": required, "staged": staged,
                "versions": {"python": sys.version.split()[0], "mpich": mpi.mpich_version(mpirun_exe)}}

    def run_dir(self, run: runs.Run) -> str:
        return str(run.path.resolve())

    def node_run_dirs(self, run: runs.Run) -> dict[str, str]:
        return {h.name: self.run_dir(run) for h in self.plan.hosts}

    def store(self, run: runs.Run) -> str:
        return containers.store_view(self.run_dir(run))

    def data_dir(self, run: runs.Run) -> str:
        return str(run.data.resolve())

    def stage(self, run: runs.Run, manifest: workdir.Manifest | None) -> None:
        # The ranks find every dataset under one directory, as they do in a container. It is made
        # anew: a rank may have left a link in its place, or in place of a dataset's directory,
        # which mkdir and unlink would follow into another directory of this machine.
        data = run.data
        if data.is_symlink() or not data.is_dir():
            data.unlink(missing_ok=True)
        else:
            shutil.rmtree(data)
        for found in self.staged.values():
            d = data / found.dataset
            d.mkdir(parents=True)
            for p in found.paths:
                (d / p.name).symlink_to(p.resolve())
        super().stage(run, manifest)

    def hydra(self, run: runs.Run) -> mpi.Hydra:
        iface = self.plan.head.iface if len(self.plan.hosts) > 1 else None
        return mpi.Hydra(self.mpirun_exe, str(run.machinefile), iface, False, self.plan.rank_env)

    def stop(self) -> None:
        process = self.mpirun_process
        if process is not None and process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)  # Hydra ends the ranks

    def interrupt(self) -> None:
        if self.mpirun_process is not None:
            self.mpirun_process.send_signal(signal.SIGINT)  # Hydra forwards it to every rank

    def record(self, run: runs.Run) -> dict:
        return {"dataset": {name: {"format": f.fmt, "files": {str(p): datasets.sha256_file(p) for p in f.paths}}
                            for name, f in self.required.items()}}


@dataclass(kw_only=True)
class DockerRuntime(Runtime):
    """One container of the node's image per node; ``mpirun`` inside the rank-0 container."""

    name: ClassVar[str] = "docker"
    python: ClassVar[str] = containers.PYTHON
    has_nodes: ClassVar[bool] = True
    reports: list[preflight.NodeReport]  # what preflight found on each node
    containers: containers.Containers | None = None  # once started

    @staticmethod
    def check(nodes: Nodes, plan: Placement, inventory: Inventory, program: Program, data_dir: Path | None, strategy: Strategy,
              log: Callable[[str], None]) -> dict:
        reports = preflight.check_nodes(nodes, plan, program.datasets, inventory.source)
        preflight.require(reports, strategy.needs, strategy.loads)
        for line in preflight.skewed(reports):
            log(line)
        if program.requirements is not None:
            lines = requirements.read(program.requirements)
            with ThreadPoolExecutor(max_workers=min(16, len(plan.hosts))) as pool:
                lacking = list(pool.map(lambda h: requirements.missing_in_image(nodes, h, images.image_for(h), lines), plan.hosts))
            for h, missing in zip(plan.hosts, lacking, strict=True):
                if missing:
                    raise EdgetrainError(f"preflight: {h.name}: requirements: {images.image_for(h)} lacks {', '.join(missing)} "
                                         f"({program.requirements})", requirements.fix_command(images.target_for(h).name, program.requirements))
        return {"reports": reports, "versions": reports[0].packages}

    def node_run_dirs(self, run: runs.Run) -> dict[str, str]:
        return {r.host.name: f"{r.runs_dir}/{run.id}" for r in self.reports}

    def run_dir(self, run: runs.Run) -> str:
        return IN_CONTAINER.run

    def store(self, run: runs.Run) -> str:
        return IN_CONTAINER.store

    def data_dir(self, run: runs.Run) -> str:
        return IN_CONTAINER.data

    def start(self, run: runs.Run) -> None:
        self.containers = containers.Containers(self.nodes, self.plan, run.id, self.node_run_dirs(run))
        self.containers.start()

    def hydra(self, run: runs.Run) -> mpi.Hydra:
        assert self.containers is not None
        return self.containers.hydra

    def on_head(self, argv: list[str]) -> list[str]:
        assert self.containers is not None
        return self.containers.on_head(argv)

    def lose(self, host: Host) -> None:
        assert self.containers is not None
        self.containers.lost.add(host.name)

    def states(self) -> list[NodeState]:  # (the attribute containers hides the module here)
        return self.containers.states() if self.containers is not None else []

    def out_of_reach(self, names: frozenset[str]) -> None:
        if self.containers is not None:
            self.containers.unreachable = names

    def stop(self) -> None:
        if self.containers is not None:
            self.containers.remove()  # ends mpirun and every rank with their containers

    def finish(self, run: runs.Run) -> list[str]:
        failed: list[str] = []
        if self.containers is not None:
            failed = self.containers.remove()
            dirs = self.node_run_dirs(run)
            for host in self.plan.hosts:
                if host.name in self.containers.unreachable:
                    failed.append(f"{host.name}: rank logs not copied (unreachable); they stay in {dirs[host.name]} there")
                    continue
                try:
                    refused = self.nodes.fetch(host, dirs[host.name], node_files(self.plan, host), run.path, timeout=120)
                    failed += [f"{host.name}: not copied: {r}" for r in refused]
                except EdgetrainError as exc:
                    failed.append(f"{host.name}: logs not copied: {exc}")
        self.nodes.close()
        return failed

    def record(self, run: runs.Run) -> dict:
        dirs = self.node_run_dirs(run)
        return {"nodes": {r.host.name: {"runs_dir": dirs[r.host.name], "image": images.image_for(r.host), "image_id": r.image_id}
                          for r in self.reports},
                "dataset": {d: {"format": self.reports[0].data_formats.get(d), "verified_on": [r.host.name for r in self.reports]}
                            for d in self.reports[0].data_formats}}


RUNTIMES: dict[str, type[Runtime]] = {"host": HostRuntime, "docker": DockerRuntime}


def node_files(plan: Placement, host: Host) -> list[str]:
    """What a node's run directory gives back when the run ends: its own ranks' files (a node
    cannot send another rank's failure record), and rank 0's metrics and outputs list from the head."""
    names = [RunLayout.rank_name(rank, kind) for rank in plan.ranks_on(host) for kind in RankFile]
    return names + ([RunLayout.METRICS, RunLayout.OUTPUTS_LIST] if host is plan.head else [])
