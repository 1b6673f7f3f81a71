"""The debootstrap base: a minimal Debian root file system made on this machine and imported into
its engine, for sites with no registry to pull a base image from."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from edgetrain.shared.datasets import sha256_file
from edgetrain.shared.errors import EdgetrainError
from edgetrain.controller.images.local_engine import engine, engine_build, image_labels
from edgetrain.controller.images.targets import IMAGE_REPOSITORY, Target
from edgetrain.controller.images.tools import Log, need_tool, run_tool

DEFAULT_DEBIAN_MIRROR = "http://deb.debian.org/debian"
DEBIAN_SUITE = "bookworm"
BASE_SHA_LABEL = "org.edgetrain.base.rootfs-sha256"


def base_tag(tgt: Target, suite: str = DEBIAN_SUITE) -> str:
    return f"{IMAGE_REPOSITORY}-base:{suite}-{tgt.docker_arch}"


def require_emulation(tgt: Target) -> None:
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
    if sha and sha256_file(tarball) != sha:
        log(f"base {tarball}: sha256 mismatch, rebuilding")
        sha = None
    if sha is None:
        require_emulation(tgt)
        need_tool("debootstrap", "debootstrap")
        tarball.parent.mkdir(parents=True, exist_ok=True)
        log(f"base: debootstrap {suite} {tgt.docker_arch} from {mirror}")
        with tempfile.TemporaryDirectory(dir=tarball.parent) as tmp:
            rootfs = Path(tmp) / "rootfs"
            run_tool(
                ["debootstrap", "--variant=minbase", f"--arch={tgt.docker_arch}", suite, str(rootfs), mirror],
                "debootstrap",
                "check the mirror (--mirror) and that this runs as root",
            )
            for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
                for p in (rootfs / junk).glob("*"):
                    if p.is_file():
                        p.unlink()
            partial = tarball.with_suffix(".tar.partial")
            run_tool(["tar", "--numeric-owner", "-C", str(rootfs), "-cf", str(partial), "."], "packing the base root file system")
            partial.rename(tarball)
        sha = sha256_file(tarball)
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
