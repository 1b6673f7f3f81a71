"""Shared fixtures: the real CLI in a subprocess, isolated run and cache directories, and a Docker
engine with the amd64 image built once per session (for the image tests and the cluster's containers).

Caches (wheelhouse, base root file system) live in edgetrain's cache directory and are reused
across sessions when their sha256 still matches. Set EDGETRAIN_DEBIAN_MIRROR to debootstrap from
another mirror, EDGETRAIN_APT_MIRROR / EDGETRAIN_APT_PROXY to route apt inside the build, and
EDGETRAIN_TEST_DOCKER_ROOT to keep the private engine's data (and so its build cache) between runs.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from edgetrain.controller import images
from tests import docker_engine

ROOT = Path(__file__).resolve().parent.parent

# Opt-in, not skipped: far longer than the rest of the suite, or a measurement to report rather
# than a check. Each runs only when its marker is named in -m.
OPT_IN = {
    "arm64": "builds and checks the arm64 image under qemu (opt-in: -m arm64)",
    "cuda": "builds and checks the CUDA image offline, without a GPU (opt-in: -m cuda)",
    "bench": "a measurement on the testbed, reported, not asserted (opt-in: -m bench)",
}


def pytest_configure(config) -> None:
    for name, text in OPT_IN.items():
        config.addinivalue_line("markers", f"{name}: {text}")


def pytest_collection_modifyitems(config, items) -> None:
    asked = config.option.markexpr or ""
    unasked = [name for name in OPT_IN if name not in asked]
    kept = [item for item in items if not any(item.get_closest_marker(name) for name in unasked)]
    if len(kept) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = kept


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """Run and cache directories of the test's own, for in-process calls and the CLI alike."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("EDGETRAIN_DATA", raising=False)
    monkeypatch.setenv("EDGETRAIN_RUNS", str(tmp_path / "runs"))
    return tmp_path


def edgetrain(*args: str, env: dict | None = None, timeout: float = 600, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The CLI as a user runs it, in its own process."""
    return subprocess.run(
        [sys.executable, "-m", "edgetrain", *args],
        capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}, cwd=cwd or ROOT,
    )


def sigint_default() -> None:
    """``preexec_fn`` of a process a test will Ctrl-C: a suite started in the background (``nohup
    ... &``) ignores SIGINT and hands that down, where a terminal or a container would not."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def project_script(tmp_path: Path, source: str) -> Path:
    """A user's script, ``train.py`` alone in a project folder of its own (what a run ships)."""
    script = tmp_path / "proj" / "train.py"
    script.parent.mkdir()
    script.write_text(source)
    return script


def descendants(pid: int) -> list[int]:
    """A process's children, theirs and so on: only processes the test itself started. Any of them
    may end while it is read (ssh's short-lived helpers do), and is then left out."""
    found = []
    try:
        tasks = list(Path(f"/proc/{pid}/task").iterdir())
    except OSError:
        return found
    for task in tasks:
        try:
            kids = [int(k) for k in (task / "children").read_text().split()]
        except OSError:
            continue
        for k in kids:
            found += [k, *descendants(k)]
    return found


def snapshot(root: Path) -> dict[str, str]:
    """Every file under root with its sha256: to prove a failed command changed nothing."""
    if not root.exists():
        return {}
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*")) if p.is_file()
    }


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
    if keep:
        # A kept root is a layer cache, pruned so it does not grow run after run: the edgetrain
        # images this session's builds replaced go now. The builder and torch stages' last images
        # are untagged too, and the next build's cache: they go only once two weeks old (a stage
        # whose inputs changed leaves its old chain behind).
        started.docker("image", "prune", "--force", "--filter", "label=org.opencontainers.image.title=edgetrain", check=False)
        started.docker("image", "prune", "--force", "--filter", "until=336h", check=False)
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
def amd64_build(engine, cache_dir) -> Iterator[Future]:
    """The amd64 image's build, in a thread of its own: a fixture with other work to do (the
    testbed's converge) starts it early, and whatever needs the image waits for it."""
    with ThreadPoolExecutor(1, thread_name_prefix="build-amd64") as pool:
        yield pool.submit(build_target, "amd64", engine, cache_dir)


@pytest.fixture(scope="session")
def amd64_image(amd64_build) -> images.BuildResult:
    return amd64_build.result()


def pytest_terminal_summary(terminalreporter) -> None:
    for b in BUILDS:
        terminalreporter.write_line(
            f"image {b.tag}: {b.image_id[7:19]}, {b.size_bytes / 1e9:.2f} GB, built in {b.seconds:.0f} s from {b.base_image}"
        )
