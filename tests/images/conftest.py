"""Image tests run on each image: amd64 always; arm64 (emulated, slow) with ``-m arm64``; cuda (a
gigabyte-scale offline build, no GPU needed) with ``-m cuda``."""

from __future__ import annotations

import pytest

from edgetrain import images
from tests.conftest import build_target

# Opt-in, not skipped: each of these builds takes far longer than the rest of the suite.
OPT_IN = {
    "arm64": "builds and checks the arm64 image under qemu (opt-in: -m arm64)",
    "cuda": "builds and checks the CUDA image offline, without a GPU (opt-in: -m cuda)",
}


def pytest_configure(config) -> None:
    for name, text in OPT_IN.items():
        config.addinivalue_line("markers", f"{name}: {text}")


@pytest.fixture(scope="session")
def cuda_built(engine, cache_dir) -> images.BuildResult:
    return build_target("cuda", engine, cache_dir)


@pytest.fixture(
    scope="session",
    params=["amd64", pytest.param("arm64", marks=pytest.mark.arm64), pytest.param("cuda", marks=pytest.mark.cuda)],
)
def image(request, engine, cache_dir) -> images.BuildResult:
    """Each image; arm64 and cuda only when asked for with ``-m arm64`` / ``-m cuda``."""
    if request.param == "amd64":
        return request.getfixturevalue("amd64_image")
    if request.param == "cuda":
        return request.getfixturevalue("cuda_built")
    return build_target(request.param, engine, cache_dir)


def pytest_collection_modifyitems(config, items) -> None:
    asked = config.option.markexpr or ""
    skipped = [name for name in OPT_IN if name not in asked]
    kept = [item for item in items if not any(item.get_closest_marker(name) for name in skipped)]
    if len(kept) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = kept
