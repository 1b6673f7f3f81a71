"""What each image is: its flavour (``TARGETS``) and the node it runs on, the versions it pins
from constraints.txt (markers evaluated for the target, not this machine), its tag and the labels
it carries, and where its build's files are cached."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from packaging.markers import default_environment
from packaging.requirements import Requirement
from platformdirs import user_cache_path

from edgetrain import __version__
from edgetrain.shared.errors import EdgetrainError
from edgetrain.controller.inventory import Host, project_root

IMAGE_REPOSITORY = "edgetrain"
# Each image labels what its build-time check proved it holds (images/Dockerfile.*): what preflight
# knows of a node's image without starting it.
PACKAGE_LABEL = "org.edgetrain.{}.version"
LABELLED_PACKAGES = ("tensorflow", "horovod", "mpich", "torch")


@dataclass(frozen=True)
class Target:
    """One image flavour: which Dockerfile, which platform, which Python the base image has."""

    name: str
    dockerfile: str
    docker_arch: str  # Docker/Debian name: arm64, amd64
    machine: str  # inventory edgetrain_arch: aarch64, x86_64
    # The TensorFlow requirements for this target. pip download evaluates markers for the machine it
    # runs on, so a platform-specific dependency (aarch64: tensorflow -> tensorflow-cpu-aws) is
    # named here, or a cross-download would miss it.
    tensorflow: tuple[str, ...]
    python: str  # the base image's python3 (bookworm: 3.11)
    glibc: int  # newest manylinux_2_N the base image's glibc runs
    debootstrap_base: bool  # a Debian base can be made with `edgetrain images base`
    # The image's own torch pin, in place of constraints.txt's (its lines name CPU nodes by architecture).
    torch: str | None = None
    # The CUDA that pin's wheel is built for (major.minor): the build checks it and labels the image
    # with it (TORCH_CUDA_LABEL), and the GPU preflight checks the node's driver against it.
    torch_cuda: str | None = None

    @property
    def platform(self) -> str:
        return f"linux/{self.docker_arch}"

    @property
    def tag(self) -> str:
        return f"{IMAGE_REPOSITORY}:{__version__}-{self.name}"

    def platform_tags(self) -> list[str]:
        tags = [f"manylinux_2_{minor}_{self.machine}" for minor in range(17, self.glibc + 1)]
        return [f"manylinux2014_{self.machine}", *tags]


TARGETS: dict[str, Target] = {
    "arm64": Target("arm64", "Dockerfile.arm64", "arm64", "aarch64", ("tensorflow", "tensorflow-cpu-aws"), "3.11", 36, True),
    "amd64": Target("amd64", "Dockerfile.arm64", "amd64", "x86_64", ("tensorflow-cpu",), "3.11", 36, True),
    # The CUDA image builds on the same Debian base as amd64: CUDA, cuDNN and NCCL come as
    # TensorFlow's pip wheels, nvcc (for Horovod's kernels only) from Debian's non-free archive.
    # torch is PyPI's x86_64 wheel, a CUDA 12.8 build with kernels for Volta to Blackwell
    # (docs/gpu.md says why not 2.13's CUDA 13), with CUDA wheels of its own.
    "cuda": Target("cuda", "Dockerfile.cuda", "amd64", "x86_64", ("tensorflow[and-cuda]",), "3.11", 36, True,
                   torch="torch==2.9.1", torch_cuda="12.8"),
}


def target(name: str) -> Target:
    try:
        return TARGETS[name]
    except KeyError:
        raise EdgetrainError(f"unknown image arch {name!r}", f"use one of {', '.join(TARGETS)}") from None


def target_for(host: Host) -> Target:
    """The image flavour a node runs: CUDA on GPU hosts, else its CPU architecture."""
    if host.is_gpu:
        return TARGETS["cuda"]
    return next(t for t in TARGETS.values() if t.machine == host.arch and t.name != "cuda")


def image_for(host: Host) -> str:
    return host.image or target_for(host).tag


def default_cache_dir() -> Path:
    # scripts/setup names the same folder (its Horovod wheel goes to prebuilt_horovod's place).
    return Path(os.environ.get("EDGETRAIN_CACHE_DIR") or user_cache_path("edgetrain"))


def marker_environment(tgt: Target) -> dict[str, str]:
    """The marker environment of the target's Python."""
    env = {k: str(v) for k, v in default_environment().items()}
    env.update(
        platform_machine=tgt.machine,
        python_version=tgt.python,
        python_full_version=f"{tgt.python}.0",
        sys_platform="linux",
        platform_system="Linux",
        os_name="posix",
        implementation_name="cpython",
        platform_python_implementation="CPython",
    )
    return env


def constraints_file() -> Path:
    return project_root() / "constraints.txt"


def target_constraints(tgt: Target) -> str:
    """constraints.txt as it applies to the target: each line whose marker holds there (evaluated for
    the target, not this machine: a cross-build's pip would evaluate it here), without the marker,
    and the target's own torch pin in place of the file's. What its wheelhouse is downloaded by
    and its build installs by."""
    env = marker_environment(tgt)
    lines = []
    for line in constraints_file().read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        req = Requirement(line)
        if (req.marker is None or req.marker.evaluate(env)) and not (tgt.torch and req.name == "torch"):
            lines.append(f"{req.name}{req.specifier}")
    return "".join(f"{line}\n" for line in [*lines, *([tgt.torch] if tgt.torch else [])])


def pinned_versions(tgt: Target) -> dict[str, str]:
    """The version of each ``name==version`` pin the target takes, by canonical lower-case name."""
    pins = {}
    for line in target_constraints(tgt).splitlines():
        if "==" in line:
            name, version = line.split("==", 1)
            pins[name.strip().lower()] = version.strip()
    return pins


def packages(labels: dict[str, str]) -> dict[str, str]:
    """Package -> version for each package an image's labels say it holds (an empty label: built without it)."""
    return {name: version for name in LABELLED_PACKAGES if (version := labels.get(PACKAGE_LABEL.format(name)))}
