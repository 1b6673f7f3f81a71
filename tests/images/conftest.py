"""Fixtures for image tests: a Docker engine, a debootstrap base, and the amd64 image built once per session.

Caches (wheelhouse, base root file system) live in edgetrain's cache directory and are reused
across sessions when their sha256 still matches. Set EDGETRAIN_DEBIAN_MIRROR to debootstrap from
another mirror, EDGETRAIN_APT_MIRROR / EDGETRAIN_APT_PROXY to route apt inside the build, and
EDGETRAIN_TEST_DOCKER_ROOT to keep the private engine's data (and so its build cache) between runs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from edgetrain import images
from tests import docker_engine

BUILDS: list[images.BuildResult] = []


@pytest.fixture(scope="session")
def engine() -> Iterator[docker_engine.DockerEngine]:
    """The Docker engine DOCKER_HOST names if one answers, else a private one stopped at the end."""
    if docker_engine.reachable():
        yield docker_engine.DockerEngine(root=Path("/"), host=os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock"), process=None)
        return
    reason = docker_engine.why_unavailable()
    if reason:
        pytest.skip(f"no Docker engine: {reason}")
    keep = os.environ.get("EDGETRAIN_TEST_DOCKER_ROOT")
    started = docker_engine.start(Path(keep) if keep else None)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("DOCKER_HOST", started.host)
        yield started
    started.stop()


@pytest.fixture(scope="session")
def cache_dir() -> Path:
    return images.default_cache_dir()


def build_target(name: str, engine: docker_engine.DockerEngine, cache_dir: Path) -> images.BuildResult:
    tgt = images.TARGETS[name]
    mirror = os.environ.get("EDGETRAIN_DEBIAN_MIRROR", images.DEFAULT_DEBIAN_MIRROR)
    base = images.make_base(tgt, cache_dir, mirror=mirror)
    result = images.build(
        tgt,
        cache_dir,
        base_image=base,
        apt_mirror=os.environ.get("EDGETRAIN_APT_MIRROR"),
        apt_proxy=os.environ.get("EDGETRAIN_APT_PROXY"),
    )
    BUILDS.append(result)
    return result


@pytest.fixture(scope="session")
def amd64_image(engine, cache_dir) -> images.BuildResult:
    return build_target("amd64", engine, cache_dir)


@pytest.fixture(scope="session", params=["amd64", pytest.param("arm64", marks=pytest.mark.arm64)])
def image(request, engine, cache_dir) -> images.BuildResult:
    """Each CPU image; arm64 (built under qemu, slow) only when asked for with ``-m arm64``."""
    if request.param == "amd64":
        return request.getfixturevalue("amd64_image")
    return build_target(request.param, engine, cache_dir)


def pytest_collection_modifyitems(config, items) -> None:
    # Opt-in, not skipped: the emulated build takes far longer than the rest of the suite.
    if "arm64" in (config.option.markexpr or ""):
        return
    kept = [item for item in items if item.get_closest_marker("arm64") is None]
    if len(kept) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = kept


def pytest_terminal_summary(terminalreporter) -> None:
    for b in BUILDS:
        terminalreporter.write_line(
            f"image {b.tag}: {b.image_id[7:19]}, {b.size_bytes / 1e9:.2f} GB, built in {b.seconds:.0f} s from {b.base_image}"
        )
