"""The offline wheelhouse: every wheel an image installs, downloaded on the controller for the
target's platform (``pip download --platform``) and kept while each file matches its recorded
sha256, and edgetrain's own wheel, rebuilt every time. Builds install from it with ``--no-index``."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import zipfile
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path

from packaging.requirements import Requirement

from edgetrain.shared.datasets import sha256_file
from edgetrain.controller.inventory import project_root
from edgetrain.controller.images.targets import Target, marker_environment, target_constraints
from edgetrain.controller.images.tools import Log, run_tool

# Compiled inside the image against its own MPICH, so it enters the wheelhouse as a source. (mpi4py's
# wheel loads any MPICH by its ABI's name: images/link-mpich-abi.)
BUILT_FROM_SOURCE = ("horovod",)
# What the builder stage needs to compile Horovod, besides TensorFlow.
BUILD_REQUIREMENTS = ("cmake", "packaging", "psutil", "pyyaml", "cloudpickle", "wheel", "setuptools")


def build_project_wheel(dest: Path) -> Path:
    """edgetrain's own wheel, rebuilt from the source tree every time (it is cheap).

    Byte-for-byte reproducible (fixed SOURCE_DATE_EPOCH, the build tools already installed rather
    than fetched): an unchanged tree rebuilds to the same image ID, which `distribute` then skips.
    """
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    run_tool(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dest), str(project_root())],
        "building the edgetrain wheel",
        env={**os.environ, "SOURCE_DATE_EPOCH": "315532800"},
    )
    return next(dest.glob("edgetrain-*.whl"))


def wheel_requirements(wheel: Path, extra: str, tgt: Target) -> list[Requirement]:
    """The wheel's dependencies plus those of ``extra``, as they apply on the target platform."""
    with zipfile.ZipFile(wheel) as zf:
        meta_name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = Parser().parsestr(zf.read(meta_name).decode())
    env = marker_environment(tgt)
    reqs = []
    for line in meta.get_all("Requires-Dist") or []:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate({**env, "extra": extra}):
            reqs.append(req)
    return reqs


def image_requirements(project_wheel: Path, tgt: Target) -> list[Requirement]:
    """What edgetrain needs in a rank (its "train" extra) on the target, but TensorFlow, which the
    target picks (CPU, aarch64 or CUDA). An image installs these before edgetrain itself, which
    comes last, in a layer of its own: a new edgetrain then rebuilds, and travels to the nodes, as
    that layer alone."""
    reqs = [req for req in wheel_requirements(project_wheel, "train", tgt) if not req.name.lower().startswith("tensorflow")]
    for req in reqs:
        req.marker = None
    return sorted(reqs, key=str)


def wheelhouse_requirements(project_wheel: Path, tgt: Target) -> tuple[list[str], list[str]]:
    """(binary requirements, source-only requirements) for a target's wheelhouse."""
    binary = [*tgt.tensorflow, "torch", *BUILD_REQUIREMENTS]
    binary += [str(r) for r in image_requirements(project_wheel, tgt) if r.name.lower() not in BUILT_FROM_SOURCE]
    return sorted(set(binary)), list(BUILT_FROM_SOURCE)


@dataclass(frozen=True)
class Wheelhouse:
    root: Path
    wheels: Path
    project_wheel: Path
    reused: bool


def prepare_wheelhouse(tgt: Target, cache_dir: Path, log: Log = print) -> Wheelhouse:
    """Download (or reuse, when every file still matches its recorded sha256) a target's wheelhouse."""
    root = cache_dir / "wheelhouse" / tgt.name
    wheels = root / "wheels"
    project_wheel = build_project_wheel(root / "project")
    pins = target_constraints(tgt)
    binary, source = wheelhouse_requirements(project_wheel, tgt)
    key = hashlib.sha256(json.dumps([pins, binary, source, tgt.platform_tags(), tgt.python]).encode()).hexdigest()
    manifest_path = root / "wheelhouse.json"
    if manifest_path.exists():
        manifest = json.loads(manifest_path.read_text())
        files = manifest.get("files", {})
        if manifest.get("key") == key and files and all(
            (wheels / name).is_file() and sha256_file(wheels / name) == sha for name, sha in files.items()
        ):
            log(f"wheelhouse {wheels}: {len(files)} files, sha256 verified, reused")
            return Wheelhouse(root, wheels, project_wheel, reused=True)
    log(f"wheelhouse {wheels}: downloading for {tgt.platform} (python {tgt.python})")
    shutil.rmtree(wheels, ignore_errors=True)
    wheels.mkdir(parents=True)
    constraints = root / "constraints.txt"
    constraints.write_text(pins)
    pip = [sys.executable, "-m", "pip", "download", "-q", "--disable-pip-version-check", "-c", str(constraints), "-d", str(wheels)]
    platform_args = [arg for tag in tgt.platform_tags() for arg in ("--platform", tag)]
    fix = ("check that the package index is reachable and that constraints.txt pins exist for this platform "
           "(x86_64's CPU-only torch is on PyTorch's own index: set PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu)")
    # torch is resolved on its own: the CUDA image's torch, in a prefix of its own, needs other
    # versions of NVIDIA's nvidia-*-cu12 wheels than TensorFlow's, which one resolution cannot hold.
    for group in ([r for r in binary if r != "torch"], ["torch"]):
        run_tool(
            [*pip, "--only-binary=:all:", *platform_args, "--python-version", tgt.python, "--implementation", "cp", *group],
            f"pip download for {tgt.platform}",
            fix,
        )
    run_tool([*pip, "--no-deps", "--no-binary=:all:", *source], "pip download of Horovod's source", fix)
    files = {p.name: sha256_file(p) for p in sorted(wheels.iterdir())}
    manifest_path.write_text(json.dumps({"key": key, "files": files}, indent=1))
    log(f"wheelhouse {wheels}: {len(files)} files")
    return Wheelhouse(root, wheels, project_wheel, reused=False)
