"""Building one image flavour offline: the build context (the wheelhouse, edgetrain's wheel, a
Horovod wheel compiled by scripts/setup where there is one, the pins) sent to this machine's engine,
whose build fails unless the in-image check passes."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from edgetrain import __version__
from edgetrain.shared.errors import EdgetrainError
from edgetrain.controller.inventory import project_root
from edgetrain.controller.images.base import base_tag, require_emulation
from edgetrain.controller.images.local_engine import engine, engine_build, inspect_image
from edgetrain.controller.images.targets import Target, pinned_versions, target_constraints
from edgetrain.controller.images.tools import Log
from edgetrain.controller.images.wheelhouse import image_requirements, prepare_wheelhouse


def prebuilt_horovod(cache_dir: Path, tgt: Target) -> Path:
    """Where scripts/setup keeps the Horovod wheel it compiled, and its key, for a target of the host's architecture."""
    return cache_dir / "horovod" / tgt.machine


def git_revision() -> str:
    root = project_root()
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True, check=False)
    if head.returncode != 0:
        return "unknown"
    dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True, check=False)
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def _link_tree(src: Path, dst: Path) -> None:
    """Hard links where possible: the context is rebuilt per build, the wheels are hundreds of MB."""
    dst.mkdir(parents=True)
    for p in src.iterdir():
        try:
            os.link(p, dst / p.name)
        except OSError:
            shutil.copy2(p, dst / p.name)


@dataclass(frozen=True)
class BuildResult:
    tag: str
    image_id: str
    size_bytes: int
    seconds: float
    base_image: str | None


# The build argument --apt-proxy travels in (images/apt-install reads it): one of Docker's
# predefined ones, which `docker history` leaves out unless a Dockerfile declares it; a custom
# argument's value, credentials included, would stay in the image's history on every node.
PROXY_ARG = "HTTP_PROXY"


def build(
    tgt: Target,
    cache_dir: Path,
    *,
    base_image: str | None = None,
    apt_mirror: str | None = None,
    apt_proxy: str | None = None,
    arch_flags: str | None = None,
    tag: str | None = None,
    log: Log = print,
    output: IO[str] | None = None,
) -> BuildResult:
    """Build one image flavour offline; the build fails unless the in-image Horovod check passes."""
    dockerfile = project_root() / "images" / tgt.dockerfile
    if not dockerfile.exists():
        raise EdgetrainError(f"{dockerfile} not found", "run image builds from an edgetrain source checkout")
    engine()
    require_emulation(tgt)
    tag = tag or tgt.tag
    if base_image is None and tgt.debootstrap_base and inspect_image(base_tag(tgt)):
        base_image = base_tag(tgt)
    wheelhouse = prepare_wheelhouse(tgt, cache_dir, log)
    pins = pinned_versions(tgt)
    args = {
        "TENSORFLOW_VERSION": pins.get("tensorflow"),
        "HOROVOD_VERSION": pins.get("horovod"),
        "TORCH_VERSION": pins.get("torch"),
        "TORCH_CUDA_VERSION": tgt.torch_cuda,
        "EDGETRAIN_VERSION": __version__,
        "GIT_REVISION": git_revision(),
        "BASE_IMAGE": base_image,
        "APT_MIRROR": apt_mirror,
        PROXY_ARG: apt_proxy,
        "HOROVOD_BUILD_ARCH_FLAGS": arch_flags,
    }
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="context-", dir=wheelhouse.root) as tmp:
        context = Path(tmp)
        _link_tree(wheelhouse.wheels, context / "wheels")
        _link_tree(wheelhouse.project_wheel.parent, context / "project")
        (context / "edgetrain-requires.txt").write_text("".join(f"{r}\n" for r in image_requirements(wheelhouse.project_wheel, tgt)))
        # The Horovod wheel scripts/setup compiled on this machine: the CPU images' builder takes
        # it where its key matches the one they print (images/horovod-fit), else compiles its own.
        prebuilt = prebuilt_horovod(cache_dir, tgt)
        if prebuilt.is_dir():
            _link_tree(prebuilt, context / "prebuilt")
        else:
            (context / "prebuilt").mkdir()
        shutil.copytree(dockerfile.parent, context / "images")
        (context / "constraints.txt").write_text(target_constraints(tgt))
        log(f"building {tag} ({tgt.platform}) from {base_image or 'the Dockerfile default base'}")
        # Streamed (to the console unless ``output`` is given), never held back: a cold build
        # takes minutes and its log is the progress report.
        image_id = engine_build(
            context, tag=tag, platform=tgt.platform, dockerfile=f"images/{tgt.dockerfile}",
            buildargs={name: value for name, value in args.items() if value}, network_mode="host", log=log, output=output,
        )
    seconds = time.monotonic() - start
    built = inspect_image(tag)
    if built is None:
        raise EdgetrainError(f"{tag} was built, yet this machine's Docker engine has no such image", "build it again")
    return BuildResult(tag, image_id, int(built["Size"]), seconds, base_image)
