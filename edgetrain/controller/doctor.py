"""Preflight: is this machine ready to train? Each check names what is wrong and how to fix it."""

from __future__ import annotations

import json
import secrets
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from edgetrain.controller import containers, placement, scheduler
from edgetrain.shared import datasets, jobs, mpi, runs
from edgetrain.shared.errors import EdgetrainError
from edgetrain.controller.inventory import Inventory
from edgetrain.controller.preflight import MIN_FREE_DISK, Check, NodeReport, ProbeReport, probe_report, check_nodes, probe
from edgetrain.controller.remote import Nodes

HOROVOD_BUILD = (
    "import json, horovod.tensorflow as hvd; "
    "print(json.dumps({'mpi': bool(hvd.mpi_built()), 'gloo': bool(hvd.gloo_built())}))"
)


def scheduler_checks(inv: Inventory) -> list[Check]:
    """Each node as Slurm sees it (idle, allocated, down, ...), where the inventory queues its runs
    through Slurm (edgetrain_scheduler); none otherwise."""
    if not any(h.vars.get("edgetrain_scheduler") == "slurm" for h in inv.hosts):
        return []
    try:
        seen = {v.name: v for v in scheduler.nodes_view()}
    except EdgetrainError as exc:
        return [Check("slurm", False, str(exc))]
    return [Check(h.name, seen[h.name].usable, seen[h.name].state) if h.name in seen else Check(h.name, False, "not in slurm.conf")
            for h in inv.hosts]


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout, check=False)


def check_mpirun() -> Check:
    exe = mpi.mpirun_path()
    return Check("mpirun", True, f"{exe} (MPICH {mpi.mpich_version(exe)})")


def check_horovod() -> Check:
    proc = _run([sys.executable, "-c", HOROVOD_BUILD], timeout=120)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise EdgetrainError(f"Horovod with TensorFlow does not import: {last}", "re-run the setup (make setup)")
    built = json.loads(proc.stdout.strip().splitlines()[-1])
    if not built["mpi"]:
        raise EdgetrainError("Horovod was built without MPI", "rebuild it: pip uninstall horovod, then make setup")
    # Without Gloo training still works; on several CPU nodes its collectives poll (edgetrain.rank.rendezvous).
    return Check("horovod", True, "TensorFlow + MPI + Gloo" if built["gloo"] else
                 "TensorFlow + MPI, no Gloo: several CPU nodes wait by polling (make setup rebuilds it)")


def check_probe(np: int = 2) -> Check:
    proc = _run([mpi.mpirun_path(), "-n", str(np), sys.executable, "-m", "edgetrain.rank.probe"], timeout=120)
    report = probe_report(proc, f"mpi4py probe with {np} ranks failed", "check that mpi4py was built against this MPICH (make setup)")
    if not report["allreduce_ok"]:
        raise EdgetrainError(f"mpi4py probe: the allreduce over {np} ranks gave a wrong sum")
    r0 = report["ranks"][0]
    torch = f", torch {r0['torch']}" if r0["torch"] else ""  # the torch strategy's, where the setup installed it
    return Check("mpi4py probe", True, f"{report['size']} ranks, allreduce ok; TF {r0['tensorflow']}, Horovod {r0['horovod']}{torch}, {r0['mpi']}")


def check_dataset(name: str, data_dir: Path | None) -> Callable[[], Check]:
    return lambda: Check(f"dataset {name}", True, datasets.locate(name, data_dir).describe())


def check_runs_dir(root: Path) -> Check:
    runs.ensure_writable(root)
    free = shutil.disk_usage(root).free
    if free < MIN_FREE_DISK:
        raise EdgetrainError(f"only {free / 1024**3:.1f} GiB free under {root}", "free some disk or pass --runs-dir elsewhere")
    return Check("run directory", True, f"{root.resolve()} writable, {free / 1024**3:.0f} GiB free")


def local_checks(runs_dir: Path, data_dir: Path | None = None) -> list[Check]:
    """Run every check; a failing one becomes a failed row rather than stopping the others."""
    steps: list[tuple[str, Callable[[], Check]]] = [
        ("mpirun", check_mpirun),
        ("horovod", check_horovod),
        ("mpi4py probe", check_probe),
        *((f"dataset {d}", check_dataset(d, data_dir)) for d in datasets.DATASETS),
        ("run directory", lambda: check_runs_dir(runs_dir)),
    ]
    results = []
    for name, step in steps:
        try:
            results.append(step())
        except EdgetrainError as exc:
            results.append(Check(name, False, str(exc)))
        except (OSError, subprocess.TimeoutExpired) as exc:
            results.append(Check(name, False, str(exc)))
    return results


@dataclass(frozen=True)
class ClusterReport:
    nodes: list[NodeReport]
    probe: ProbeReport | None  # None when a node check failed first


def check_cluster(inv: Inventory, np: int | None, group: str | None, job: str) -> ClusterReport:
    """``edgetrain doctor -i``: every node check, then the MPI probe in throwaway containers."""
    spec = jobs.get(job)
    hosts = placement.select(inv, group)
    if any(h.runtime != "docker" for h in hosts):
        raise EdgetrainError(f"doctor -i checks nodes that run containers; {inv.source} has hosts with edgetrain_runtime host",
                             "run edgetrain doctor on those hosts themselves")
    plan = placement.plan(inv, np or sum(h.slots for h in hosts), group)
    with Nodes() as nodes:
        reports = check_nodes(nodes, plan, (spec.dataset,), inv.source)
        if any(r.failure for r in reports):
            return ClusterReport(reports, None)
        probe_dirs = {r.host.name: f"{r.runs_dir}/.doctor" for r in reports}
        running = containers.Containers(nodes, plan, f"doctor-{secrets.token_hex(3)}", probe_dirs)
        try:
            running.start()
            probed = probe(nodes, running)
        except EdgetrainError as exc:
            reports[0].checks.append(Check("mpi probe", False, str(exc)))
            return ClusterReport(reports, None)
        finally:
            running.remove()
    return ClusterReport(reports, probed)
