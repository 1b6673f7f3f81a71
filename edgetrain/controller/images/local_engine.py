"""Training images: offline wheelhouse, debootstrap base, build, and distribution to the nodes.

Builds never reach a Python package index: the controller downloads a wheelhouse for the target
platform (``pip download --platform``), and the image installs from it with ``--no-index``. Only
the distribution's package mirror is used inside the build. Nodes receive images over SSH
(``docker save | ssh node docker load``), so no registry is needed anywhere.

The controller's own engine (``DOCKER_HOST`` or the default socket) is driven through the Docker
SDK for Python: builds (their log streamed, each step reported as progress), inspection, labels and
``save``. Nodes are reached with ssh exactly as Ansible reaches them and run the ``docker`` CLI
there: the SDK's ``ssh://`` transport cannot take the inventory's per-host key, port and ssh
arguments (docs/images.md).
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import io
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import zipfile
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from email.parser import Parser
from pathlib import Path
from typing import IO

import docker
import docker.errors
from packaging.markers import default_environment
from packaging.requirements import Requirement
from platformdirs import user_cache_path

from edgetrain import __version__
from edgetrain.shared.errors import EdgetrainError
from edgetrain.controller.inventory import Host, Inventory, project_root
from edgetrain.controller.remote import ssh_command

DEFAULT_DEBIAN_MIRROR = "http://deb.debian.org/debian"
DEBIAN_SUITE = "bookworm"
IMAGE_REPOSITORY = "edgetrain"
# Compiled inside the image against its own MPICH, so it enters the wheelhouse as a source. (mpi4py's
# wheel loads any MPICH by its ABI's name: images/link-mpich-abi.)
BUILT_FROM_SOURCE = ("horovod",)
# What the builder stage needs to compile Horovod, besides TensorFlow.
BUILD_REQUIREMENTS = ("cmake", "packaging", "psutil", "pyyaml", "cloudpickle", "wheel", "setuptools")
BASE_SHA_LABEL = "org.edgetrain.base.rootfs-sha256"
# Each image labels what its build-time check proved it holds (images/Dockerfile.*): what preflight
# knows of a node's image without starting it.
PACKAGE_LABEL = "org.edgetrain.{}.version"
LABELLED_PACKAGES = ("tensorflow", "horovod", "mpich", "torch")

Log = Callable[[str], None]


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


def default_cache_dir() -> Path:
    # scripts/setup names the same folder (its Horovod wheel goes to prebuilt_horovod's place).
    return Path(os.environ.get("EDGETRAIN_CACHE_DIR") or user_cache_path("edgetrain"))


def prebuilt_horovod(cache_dir: Path, tgt: Target) -> Path:
    """Where scripts/setup keeps the Horovod wheel it compiled, and its key, for a target of the host's architecture."""
    return cache_dir / "horovod" / tgt.machine


def _run(cmd: list[str], what: str, fix: str | None = None, **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, text=True, capture_output=True, **kwargs)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines() or ["(no output)"])[-1]
        raise EdgetrainError(f"{what} failed: {last}", fix)
    return proc


def _need(tool: str, package: str) -> None:
    if shutil.which(tool) is None:
        raise EdgetrainError(f"{tool} is not installed on this machine", f"install it (Debian: apt-get install {package})")


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def constraints_file() -> Path:
    return project_root() / "constraints.txt"


def target_constraints(tgt: Target) -> str:
    """constraints.txt as it applies to the target: each line whose marker holds there (evaluated for
    the target, not this machine: a cross-build's pip would evaluate it here), without the marker,
    and the target's own torch pin in place of the file's. What its wheelhouse is downloaded by
    and its build installs by."""
    env = _environment(tgt)
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


# --- wheelhouse -------------------------------------------------------------------------------


def build_project_wheel(dest: Path) -> Path:
    """edgetrain's own wheel, rebuilt from the source tree every time (it is cheap).

    Byte-for-byte reproducible (fixed SOURCE_DATE_EPOCH, the build tools already installed rather
    than fetched): an unchanged tree rebuilds to the same image ID, which `distribute` then skips.
    """
    shutil.rmtree(dest, ignore_errors=True)
    dest.mkdir(parents=True)
    _run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dest), str(project_root())],
        "building the edgetrain wheel",
        env={**os.environ, "SOURCE_DATE_EPOCH": "315532800"},
    )
    return next(dest.glob("edgetrain-*.whl"))


def _environment(tgt: Target) -> dict[str, str]:
    """The marker environment of the target's Python."""
    env = default_environment()
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


def wheel_requirements(wheel: Path, extra: str, tgt: Target) -> list[Requirement]:
    """The wheel's dependencies plus those of ``extra``, as they apply on the target platform."""
    with zipfile.ZipFile(wheel) as zf:
        meta_name = next(n for n in zf.namelist() if n.endswith(".dist-info/METADATA"))
        meta = Parser().parsestr(zf.read(meta_name).decode())
    env = _environment(tgt)
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
            (wheels / name).is_file() and _sha256(wheels / name) == sha for name, sha in files.items()
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
        _run(
            [*pip, "--only-binary=:all:", *platform_args, "--python-version", tgt.python, "--implementation", "cp", *group],
            f"pip download for {tgt.platform}",
            fix,
        )
    _run([*pip, "--no-deps", "--no-binary=:all:", *source], "pip download of Horovod's source", fix)
    files = {p.name: _sha256(p) for p in sorted(wheels.iterdir())}
    manifest_path.write_text(json.dumps({"key": key, "files": files}, indent=1))
    log(f"wheelhouse {wheels}: {len(files)} files")
    return Wheelhouse(root, wheels, project_wheel, reused=False)


# --- this machine's engine, through the Docker SDK ----------------------------------------------

_ENGINES: dict[tuple[str | None, ...], docker.DockerClient] = {}
ENGINE_FIX = "start the Docker engine (systemctl start docker) or point DOCKER_HOST at one"


def engine() -> docker.DockerClient:
    """A client of this machine's engine, as the docker CLI would pick it (DOCKER_HOST, TLS vars)."""
    key = tuple(os.environ.get(name) for name in ("DOCKER_HOST", "DOCKER_TLS_VERIFY", "DOCKER_CERT_PATH"))
    client = _ENGINES.get(key)
    if client is None:
        where = os.environ.get("DOCKER_HOST") or "the default socket"
        try:
            client = docker.from_env(timeout=600)
        except docker.errors.DockerException as e:
            raise EdgetrainError(f"cannot reach this machine's Docker engine ({where}): {e}", ENGINE_FIX) from None
        _ENGINES[key] = client
    return client


def _inspect(ref: str) -> dict | None:
    """``docker image inspect`` of this machine's engine; None when it has no such image."""
    try:
        return engine().api.inspect_image(ref)
    except docker.errors.ImageNotFound:
        return None
    except docker.errors.APIError as e:
        raise EdgetrainError(f"inspecting {ref} in this machine's Docker engine failed: {e.explanation or e}", ENGINE_FIX) from None
    except docker.errors.DockerException as e:  # engine gone, socket refused
        raise EdgetrainError(f"cannot reach this machine's Docker engine: {e}", ENGINE_FIX) from None


def image_labels(ref: str) -> dict[str, str] | None:
    """The labels of an image in this machine's engine (empty when it has none); None without it."""
    found = _inspect(ref)
    return None if found is None else dict((found.get("Config") or {}).get("Labels") or {})


def packages(labels: dict[str, str]) -> dict[str, str]:
    """Package -> version for each package an image's labels say it holds (an empty label: built without it)."""
    return {name: version for name in LABELLED_PACKAGES if (version := labels.get(PACKAGE_LABEL.format(name)))}


def local_image_id(ref: str) -> str | None:
    """The image ID this machine's engine holds for ``ref``; None without the image or the engine."""
    try:
        found = _inspect(ref)
    except EdgetrainError:
        return None
    return found["Id"] if found else None


def _tar_stream(context: Path) -> Iterator[bytes]:
    """The build context as a tar stream, written by a thread as the engine reads it (the wheelhouse
    is gigabytes: no temporary archive)."""
    read_fd, write_fd = os.pipe()
    failed: list[BaseException] = []

    def write() -> None:
        try:
            with os.fdopen(write_fd, "wb") as pipe, tarfile.open(fileobj=pipe, mode="w|", format=tarfile.PAX_FORMAT) as tar:
                for path in sorted(context.rglob("*")):
                    tar.add(path, arcname=path.relative_to(context).as_posix(), recursive=False)
        except BaseException as e:  # noqa: BLE001 - handed to the reading side
            failed.append(e)

    writer = threading.Thread(target=write, name="build-context", daemon=True)
    writer.start()
    with os.fdopen(read_fd, "rb") as pipe:
        while chunk := pipe.read(1 << 20):
            yield chunk
    writer.join()
    if failed and not isinstance(failed[0], BrokenPipeError):
        raise EdgetrainError(f"packing the build context {context} failed: {failed[0]}")


def _elapsed(seconds: float) -> str:
    return f"{int(seconds // 60)}m{int(seconds % 60):02d}s"


def _verbatim(log: Log | None) -> Log | None:
    """``log`` for text that is not markup: a Dockerfile line like ``CMD [/bin/sh]`` must print as
    written through a rich console (the CLI's), and not wrap mid-line."""
    console = getattr(log, "__self__", None)
    if log is not None and type(console).__module__.split(".")[0] == "rich":
        return lambda text: console.print(text, markup=False, highlight=False, soft_wrap=True)
    return log


def engine_build(
    context: Path,
    *,
    tag: str,
    platform: str,
    dockerfile: str = "Dockerfile",
    buildargs: dict[str, str] | None = None,
    labels: dict[str, str] | None = None,
    network_mode: str | None = None,
    log: Log | None = print,
    output: IO[str] | None = None,
) -> str:
    """Build ``context`` in this machine's engine; the image ID.

    The engine's log goes to ``output`` (default: standard output) as it comes, line by line, and
    every ``Step N/M`` is also reported through ``log`` with the time so far: the progress of a
    build that runs for many minutes. A failed step raises EdgetrainError with the engine's message.
    """
    start = time.monotonic()
    log = _verbatim(log)
    sink = output if output is not None else sys.stdout
    tail: deque[str] = deque(maxlen=5)
    image_id = None
    pending = ""

    def line_out(line: str) -> None:
        if line.startswith("Step ") and log is not None:
            log(f"{tag} {_elapsed(time.monotonic() - start)} {line}")
            if output is None:
                return
        sink.write(line + "\n")
        sink.flush()
        if line.strip():
            tail.append(line.strip())

    try:
        stream = engine().api.build(
            fileobj=_tar_stream(context), custom_context=True, dockerfile=dockerfile, tag=tag, platform=platform,
            buildargs=buildargs or {}, labels=labels, network_mode=network_mode, rm=True, forcerm=True,
            decode=True, timeout=None,
        )
        for chunk in stream:
            if "error" in chunk:
                if pending:
                    line_out(pending)
                error = (chunk.get("errorDetail") or {}).get("message") or chunk["error"]
                raise EdgetrainError(f"docker build of {tag} failed: {error.strip()}", "see the build log above")
            if "stream" in chunk:
                pending += chunk["stream"]
                *lines, pending = pending.split("\n")
                for line in lines:
                    line_out(line)
            elif "status" in chunk:  # pulls: "id: status progress"
                line_out(" ".join(str(chunk[k]) for k in ("id", "status", "progress") if chunk.get(k)))
            elif "ID" in (chunk.get("aux") or {}):
                image_id = chunk["aux"]["ID"]
        if pending:
            line_out(pending)
    except docker.errors.APIError as e:
        raise EdgetrainError(f"docker build of {tag} failed: {e.explanation or e}", ENGINE_FIX) from None
    except docker.errors.DockerException as e:
        raise EdgetrainError(f"cannot reach this machine's Docker engine: {e}", ENGINE_FIX) from None
    found = _inspect(tag)
    if found is None or (image_id and found["Id"] != image_id):
        raise EdgetrainError(f"docker build of {tag} ended without the image ({' | '.join(tail) or 'no output'})", "see the build log above")
    return found["Id"]


# --- base image ---------------------------------------------------------------------------------


def base_tag(tgt: Target, suite: str = DEBIAN_SUITE) -> str:
    return f"{IMAGE_REPOSITORY}-base:{suite}-{tgt.docker_arch}"


def _require_emulation(tgt: Target) -> None:
    if tgt.machine == os.uname().machine:
        return
    if not Path(f"/proc/sys/fs/binfmt_misc/qemu-{tgt.machine}").exists():
        raise EdgetrainError(
            f"building {tgt.platform} on {os.uname().machine} needs qemu-{tgt.machine} registered with binfmt_misc",
            f"apt-get install qemu-user-static binfmt-support && update-binfmts --enable qemu-{tgt.machine}",
        )


def make_base(tgt: Target, cache_dir: Path, mirror: str = DEFAULT_DEBIAN_MIRROR, suite: str = DEBIAN_SUITE, log: Log = print) -> str:
    """A minimal Debian base image from debootstrap, imported into the engine, for sites with no registry.

    The root file system tarball is cached with its sha256; the engine's image is reused while its
    label still names that sha256.
    """
    if not tgt.debootstrap_base:
        raise EdgetrainError(f"the {tgt.name} image builds on an NVIDIA CUDA base, not on Debian", "load the CUDA base image into the engine (docker load) and pass --base-image")
    engine()
    tag = base_tag(tgt, suite)
    tarball = cache_dir / "base" / f"{suite}-{tgt.docker_arch}.tar"
    sha_file = tarball.with_suffix(".tar.sha256")
    sha = sha_file.read_text().strip() if sha_file.exists() and tarball.exists() else None
    if sha and _sha256(tarball) != sha:
        log(f"base {tarball}: sha256 mismatch, rebuilding")
        sha = None
    if sha is None:
        _require_emulation(tgt)
        _need("debootstrap", "debootstrap")
        tarball.parent.mkdir(parents=True, exist_ok=True)
        log(f"base: debootstrap {suite} {tgt.docker_arch} from {mirror}")
        with tempfile.TemporaryDirectory(dir=tarball.parent) as tmp:
            rootfs = Path(tmp) / "rootfs"
            _run(
                ["debootstrap", "--variant=minbase", f"--arch={tgt.docker_arch}", suite, str(rootfs), mirror],
                "debootstrap",
                "check the mirror (--mirror) and that this runs as root",
            )
            for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
                for p in (rootfs / junk).glob("*"):
                    if p.is_file():
                        p.unlink()
            partial = tarball.with_suffix(".tar.partial")
            _run(["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(partial), "."], "packing the base root file system")
            partial.rename(tarball)
        sha = _sha256(tarball)
        sha_file.write_text(sha + "\n")
    if (image_labels(tag) or {}).get(BASE_SHA_LABEL) == sha:
        log(f"base {tag}: present, rootfs sha256 {sha[:12]} matches")
        return tag
    # A build FROM scratch rather than `docker import`: engines before 23 ignore import's
    # --platform and would record an arm64 root file system as amd64.
    with tempfile.TemporaryDirectory(dir=tarball.parent) as tmp:
        context = Path(tmp)
        os.link(tarball, context / "rootfs.tar")
        (context / "Dockerfile").write_text('FROM scratch\nADD rootfs.tar /\nCMD ["/bin/bash"]\n')
        with open(os.devnull, "w") as quiet:
            engine_build(context, tag=tag, platform=tgt.platform, labels={BASE_SHA_LABEL: sha}, log=None, output=quiet)
    log(f"base {tag}: imported from {tarball.name} (sha256 {sha[:12]})")
    return tag


# --- build --------------------------------------------------------------------------------------


def git_revision() -> str:
    root = project_root()
    head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True)
    if head.returncode != 0:
        return "unknown"
    dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True)
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
    _require_emulation(tgt)
    tag = tag or tgt.tag
    if base_image is None and tgt.debootstrap_base and _inspect(base_tag(tgt)):
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
        "APT_PROXY": apt_proxy,
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
    size = _inspect(tag)["Size"]
    return BuildResult(tag, image_id, int(size), seconds, base_image)


# --- nodes: list and distribute -----------------------------------------------------------------


def image_for(host: Host) -> str:
    return host.image or target_for(host).tag


def node_docker(host: Host, args: list[str]) -> list[str]:
    """The command that runs ``docker ARGS`` against a node's own engine."""
    if host.is_local:
        return ["docker", *args]
    return [*ssh_command(host), shlex.join(["docker", *args])]


def _node_image_id(host: Host, ref: str) -> str | None:
    proc = subprocess.run(node_docker(host, ["image", "inspect", "--format", "{{.Id}}", ref]), capture_output=True, text=True)
    if proc.returncode == 0:
        return proc.stdout.strip()
    if proc.returncode == 255 and not host.is_local:
        raise EdgetrainError(f"cannot reach {host.name} over ssh: {proc.stderr.strip()}", "check the address, user and key in the inventory")
    if "No such image" in proc.stderr or "No such object" in proc.stderr:
        return None
    raise EdgetrainError(f"docker on {host.name} failed: {proc.stderr.strip()}", "check the node's Docker engine (docker info)")


def docker_hosts(inventory: Inventory) -> list[Host]:
    hosts = [h for h in inventory.hosts if h.runtime == "docker"]
    if any(h.is_local for h in hosts):
        _need("docker", "docker.io")
    if any(not h.is_local for h in hosts):
        _need("ssh", "openssh-client")
    return hosts


@dataclass(frozen=True)
class NodeImage:
    host: str
    tag: str
    image_id: str
    arch: str
    created: str


def list_images(inventory: Inventory) -> list[NodeImage]:
    """edgetrain images present on every docker-runtime node."""
    rows = []
    for host in docker_hosts(inventory):
        repository = image_for(host).rsplit(":", 1)[0]
        tags = _run(
            node_docker(host, ["image", "ls", "--format", "{{.Repository}}:{{.Tag}}", repository]),
            f"listing images on {host.name}",
            "check ssh to the node and its Docker engine",
        ).stdout.split()
        if not tags:
            continue
        out = _run(
            node_docker(host, ["image", "inspect", "--format", "{{.Id}} {{.Architecture}} {{.Created}}", *tags]),
            f"inspecting images on {host.name}",
        ).stdout.splitlines()
        for tag, line in zip(tags, out):
            image_id, arch, created = line.split(" ", 2)
            rows.append(NodeImage(host.name, tag, image_id, arch, created))
    return rows


@dataclass(frozen=True)
class Shipment:
    host: str
    tag: str
    image_id: str
    loaded: bool  # False: the node already had this image ID


def _local_image(tag: str, for_hosts: Iterable[Host]) -> tuple[str, str]:
    found = _inspect(tag)
    if found is None:
        names = ", ".join(h.name for h in for_hosts)
        arch = tag.rsplit("-", 1)[-1]
        fix = f"edgetrain images build --arch {arch}" if arch in TARGETS else f"build or pull {tag} on this machine"
        raise EdgetrainError(f"image {tag} (for {names}) is not in this machine's Docker engine", fix)
    return found["Id"], found["Architecture"]


def _node_layers(host: Host) -> list[list[str]]:
    """The layers (diff IDs, base first) of every image the node holds."""
    ids = sorted(set(_run(node_docker(host, ["image", "ls", "-q", "--no-trunc"]), f"listing images on {host.name}",
                          "check ssh to the node and its Docker engine").stdout.split()))
    if not ids:
        return []
    out = _run(node_docker(host, ["image", "inspect", "--format", "{{json .RootFS.Layers}}", *ids]), f"inspecting images on {host.name}").stdout
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def layers_held(layers: list[str], on_node: list[list[str]]) -> int:
    """How many of an image's layers (base first) a node holds: the longest prefix it shares with an
    image there. A layer is the whole chain below it, so a diff ID found elsewhere is not the same layer."""
    return max((len(os.path.commonprefix([layers, other])) for other in on_node), default=0)


class _Chunks(io.RawIOBase):
    """An iterator of byte chunks read as a file (``docker save``'s stream, for tarfile)."""

    def __init__(self, chunks: Iterable[bytes]):
        self._chunks = iter(chunks)
        self._left = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while not self._left:
            self._left = next(self._chunks, None)
            if self._left is None:
                self._left = b""
                return 0
        n = min(len(buffer), len(self._left))
        buffer[:n] = self._left[:n]
        self._left = self._left[n:]
        return n


def copy_without(saved: IO[bytes], out: IO[bytes], held: set[str]) -> int:
    """Copy a ``docker save`` archive to ``out`` without the files whose content is a layer in ``held``
    (by diff ID: the sha256 of the uncompressed layer); the bytes of file content written. ``docker
    load`` opens a layer's file only when its engine lacks that layer, so the node still gets the
    whole image. Each file is hashed before it is written, so it is spooled first (in memory while small)."""
    written = 0
    with tarfile.open(fileobj=saved, mode="r|") as src, tarfile.open(fileobj=out, mode="w|", format=tarfile.PAX_FORMAT) as dst:
        for member in src:
            if not member.isfile():
                dst.addfile(member)
                continue
            data = src.extractfile(member)
            with tempfile.SpooledTemporaryFile(max_size=1 << 20) as spool:
                digest = hashlib.sha256()
                for block in iter(lambda: data.read(1 << 20), b""):
                    digest.update(block)
                    spool.write(block)
                if f"sha256:{digest.hexdigest()}" in held:
                    continue
                spool.seek(0)
                dst.addfile(member, spool)
                written += member.size
    return written


def _send(tag: str, host: Host, held: set[str]) -> int:
    """``docker save TAG`` from this machine's engine (SDK) into ``docker load`` on the node (ssh + CLI),
    without the layers in ``held``; the bytes sent."""
    with tempfile.TemporaryFile() as said:
        load = subprocess.Popen(node_docker(host, ["load"]), stdin=subprocess.PIPE, stdout=said, stderr=said)
        assert load.stdin is not None
        problem, sent = None, None
        try:
            saved = engine().api.get_image(tag)
            if held:
                sent = copy_without(io.BufferedReader(_Chunks(saved), 1 << 20), load.stdin, held)
            else:  # nothing to leave out: the archive as it comes, with no file spooled
                sent = 0
                for chunk in saved:
                    load.stdin.write(chunk)
                    sent += len(chunk)
        except BrokenPipeError:
            problem = "the node's docker load ended early"
        except docker.errors.DockerException as e:
            problem = f"docker save failed: {e}"
        except tarfile.TarError as e:
            problem = f"docker save's archive could not be read: {e}"
        finally:
            try:
                load.stdin.close()
            except BrokenPipeError:
                pass
            code = load.wait()
        said.seek(0)
        output = said.read().decode(errors="replace").strip()
    if problem or code != 0 or sent is None:
        raise EdgetrainError(f"sending {tag} to {host.name} failed: {output or problem}", "check disk space and the Docker engine on the node")
    return sent


def distribute(inventory: Inventory, log: Log = print) -> list[Shipment]:
    """Ship each docker-runtime node the image of its arch, skipping nodes that already hold it.

    Every node is checked before anything is sent, then all are sent to at once: a Pi's ``docker
    load`` is bound by its SD card more than by the controller's link, so the nodes' loads overlap
    rather than queue. One node's failure leaves the others' sends to finish."""
    hosts = docker_hosts(inventory)
    if not hosts:
        raise EdgetrainError(f"no host in {inventory.source} uses the docker runtime", "set edgetrain_runtime: docker on the nodes that run containers")
    for host in hosts:
        _, arch = _local_image(image_for(host), [host])
        if arch != target_for(host).docker_arch:
            raise EdgetrainError(f"image {image_for(host)} is {arch} but {host.name} is {host.arch}", "set edgetrain_image for the node to an image of its arch")
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(hosts)) as pool:
        sending = [pool.submit(_ship, host, log) for host in hosts]
    # The first node's failure, in inventory order, once every node's send has ended.
    return [future.result() for future in sending]


def _ship(host: Host, log: Log) -> Shipment:
    tag = image_for(host)
    image_id, _ = _local_image(tag, [host])
    if _node_image_id(host, tag) == image_id:
        log(f"{host.name}: {tag} {image_id[7:19]} already present")
        return Shipment(host.name, tag, image_id, loaded=False)
    layers = _inspect(tag)["RootFS"]["Layers"]
    held = layers_held(layers, _node_layers(host))
    log(f"{host.name}: sending {tag} {image_id[7:19]}" + (f" ({held} of its {len(layers)} layers already there)" if held else ""))
    # A layer's content can recur above the shared prefix (an empty one, say): that one is sent.
    sent = _send(tag, host, set(layers[:held]) - set(layers[held:]))
    have = _node_image_id(host, tag)
    if have != image_id:
        raise EdgetrainError(f"{host.name} holds {tag} as {have}, expected {image_id}", "re-run edgetrain images distribute")
    log(f"{host.name}: {tag} loaded ({sent / 1e6:,.0f} MB sent), image ID verified")
    return Shipment(host.name, tag, image_id, loaded=True)
