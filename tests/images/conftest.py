"""Image tests run on each image: amd64 always; arm64 (emulated, slow) with ``-m arm64``; cuda (a
gigabyte-scale offline build, no GPU needed) with ``-m cuda``."""

from __future__ import annotations

import pytest

from edgetrain.controller import images
from tests.conftest import build_target


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
