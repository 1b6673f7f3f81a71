"""Image tests run on each CPU image: amd64 always, arm64 (emulated, slow) with ``-m arm64``."""

from __future__ import annotations

import pytest

from edgetrain import images
from tests.conftest import build_target


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
