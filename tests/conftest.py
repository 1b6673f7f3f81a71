"""Shared fixtures: the real CLI in a subprocess, isolated run and cache directories, and a Docker
engine with the amd64 image built once per session (for the image tests and the cluster's containers).

Caches (wheelhouse, base root file system) live in edgetrain's cache directory and are reused
across sessions when their sha256 still matches. Set EDGETRAIN_DEBIAN_MIRROR to debootstrap from
another mirror, EDGETRAIN_APT_MIRROR / EDGETRAIN_APT_PROXY to route apt inside the build, and
EDGETRAIN_TEST_DOCKER_ROOT to keep the private engine's data (and so its build cache) between runs.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from edgetrain.controller import images
from lab import docker_engine

ROOT = Path(__file__).resolve().parent.parent

# Opt-in, not skipped: far longer than the rest of the suite, or a measurement to report rather
# than a check. Each runs only when its marker is named in -m.
OPT_IN = {
    "arm64": "builds and checks the arm64 image under qemu (opt-in: -m arm64)",
    "cuda": "builds and checks the CUDA image offline, without a GPU (opt-in: -m cuda)",
    "bench": "a measurement on the testbed, reported, not asserted (opt-in: -m bench)",
}


# `make test` runs the suite in two lanes (pytest-xdist, -n 2): the tests under TESTBED_DIRS in
# one, where the testbed and the tests' Docker engine are made once, the rest in the other. One lane
# left a third of the 2 cores idle over the suite: leases running out, ssh, ansible and
# single-threaded steps. A test whose figure the other lane's load would skew (the Pi emulation's
# calibration, a bench) has the machine to itself: the other lane waits between tests.
TESTBED_DIRS = ("tests/cluster/", "tests/images/")
TESTBED_FIXTURES = {"testbed", "engine"}


def needs_the_machine_alone(item: pytest.Item) -> bool:
    # "board": an emulated board's calibration (tests/cluster/conftest.py's pi4 and mixed use it).
    return "board" in item.fixturenames or item.get_closest_marker("bench") is not None


class Lanes:
    """A lock the lanes share (flock on two files named by the run): a test holds it shared, or
    alone where it needs the machine. The gate stops new shared holders while one waits to be alone."""

    def __init__(self, run: str):
        self.paths = [Path(tempfile.gettempdir()) / f"edgetrain-lanes-{run}.{part}" for part in ("gate", "lock")]
        self.gate, self.lock = (open(path, "a") for path in self.paths)

    @contextlib.contextmanager
    def held(self, alone: bool):
        fcntl.flock(self.gate, fcntl.LOCK_EX)
        try:
            fcntl.flock(self.lock, fcntl.LOCK_EX if alone else fcntl.LOCK_SH)
        finally:
            if not alone:
                fcntl.flock(self.gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(self.lock, fcntl.LOCK_UN)
            if alone:
                fcntl.flock(self.gate, fcntl.LOCK_UN)

    def close(self) -> None:
        for f, path in zip((self.gate, self.lock), self.paths):
            f.close()
            path.unlink(missing_ok=True)  # the other lane keeps its own descriptors, if it still runs


LANES = pytest.StashKey[Lanes]()


def interrupt_on_sigterm(signum, frame) -> None:
    """SIGTERM (``timeout``, a CI job's limit, ``kill``) ends the session as Ctrl-C does: pytest
    then tears its fixtures down. Killed outright, it would leave the testbed's namespaces, sshds
    and engines and the tests' Docker engine behind. A second SIGTERM is ignored, so as not to
    break that teardown half-way."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise KeyboardInterrupt(f"signal {signum}")


def pytest_configure(config) -> None:
    signal.signal(signal.SIGTERM, interrupt_on_sigterm)
    for name, text in OPT_IN.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    workerinput = getattr(config, "workerinput", None)  # a lane of pytest-xdist
    if workerinput is not None:
        config.stash[LANES] = Lanes(workerinput["testrunuid"])


def pytest_unconfigure(config) -> None:
    lanes = config.stash.get(LANES, None)
    if lanes is not None:
        lanes.close()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    lanes = item.config.stash.get(LANES, None)
    if lanes is None:
        return (yield)
    with lanes.held(alone=needs_the_machine_alone(item)):
        return (yield)


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's
def pytest_xdist_make_scheduler(config, log):
    """Tests share out one by one, those under TESTBED_DIRS as one unit. (pytest-xdist's own
    --dist loadgroup would group them by a mark, but with pytest 9.2 it silently stopped: the
    group it writes into a test's node id no longer takes, pytest-xdist#1386.)"""
    from xdist.scheduler import LoadScopeScheduling

    class LaneScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return TESTBED_DIRS[0] if nodeid.startswith(TESTBED_DIRS) else nodeid

    return LaneScheduling(config, log)


def pytest_collection_modifyitems(config, items) -> None:
    asked = config.option.markexpr or ""
    unasked = [name for name in OPT_IN if name not in asked]
    kept = [item for item in items if not any(item.get_closest_marker(name) for name in unasked)]
    if len(kept) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = kept
    for item in items:
        if TESTBED_FIXTURES & set(item.fixturenames) and not item.nodeid.startswith(TESTBED_DIRS):
            raise pytest.UsageError(f"{item.nodeid} uses the testbed or the tests' Docker engine: it belongs under "
                                    f"{' or '.join(TESTBED_DIRS)}, whose tests run in one lane (a second would make them again)")


# What the session measured and built (the testbed's figures, the images), printed at its end.
# A lane hands its lines to the process that prints the summary.
SUMMARY: dict[str, list[str]] = {}


def summarize(section: str, line: str) -> None:
    SUMMARY.setdefault(section, []).append(line)


def pytest_sessionfinish(session) -> None:
    workeroutput = getattr(session.config, "workeroutput", None)
    if workeroutput is not None:
        workeroutput["edgetrain_summary"] = SUMMARY


@pytest.hookimpl(optionalhook=True)  # pytest-xdist's: a lane has ended
def pytest_testnodedown(node, error) -> None:
    for section, lines in getattr(node, "workeroutput", {}).get("edgetrain_summary", {}).items():
        SUMMARY.setdefault(section, []).extend(lines)


def pytest_terminal_summary(terminalreporter) -> None:
    for section, lines in SUMMARY.items():
        terminalreporter.write_sep("-", section)
        for line in lines:
            terminalreporter.write_line(line)


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """Run and cache directories of the test's own, for in-process calls and the CLI alike."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("EDGETRAIN_DATA", raising=False)
    monkeypatch.setenv("EDGETRAIN_RUNS", str(tmp_path / "runs"))
    return tmp_path


def edgetrain(*args: str, env: dict | None = None, timeout: float = 600, cwd: Path | None = None,
              module: str = "edgetrain") -> subprocess.CompletedProcess:
    """The CLI as a user runs it, in its own process (``module``: the lab's command instead)."""
    return subprocess.run(
        [sys.executable, "-m", module, *args],
        capture_output=True, text=True, timeout=timeout, env={**os.environ, **(env or {})}, cwd=cwd or ROOT,
    )


def lab_bench(*args: str, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    """`edgetrain bench` as the lab runs it on emulated nodes (lab/emulated_bench.py)."""
    return edgetrain(*args, env=env, timeout=timeout, module="lab.emulated_bench")


def loopback_pair(where: Path, speeds: tuple[int, int] | None = None) -> Path:
    """An inventory of this machine twice, by two names Hydra starts locally (localhost and
    127.0.0.1), written into ``where``; with ``speeds``, each host's ``edgetrain_speed``."""
    head, other = (f"\n          edgetrain_speed: {s}" for s in speeds) if speeds else ("", "")
    inv = where / "hosts.yml"
    inv.parent.mkdir(parents=True, exist_ok=True)
    inv.write_text(f"""\
cluster:
  vars:
    edgetrain_runtime: host
    edgetrain_iface: lo
    edgetrain_slots: 1
    ansible_connection: local
    ansible_python_interpreter: "{{{{ ansible_playbook_python }}}}"
  children:
    head:
      hosts:
        localhost:
          ansible_host: localhost{head}
    rpi:
      hosts:
        loopback:
          ansible_host: 127.0.0.1{other}
""")
    return inv


def assert_one_line_error(result, *fragments: str, code: int = 1) -> str:
    """The one line a failed command leaves on stderr, holding every fragment; no traceback."""
    assert result.returncode == code, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("edgetrain: error: "), result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


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
    summarize("images built", f"image {result.tag}: {result.image_id[7:19]}, {result.size_bytes / 1e9:.2f} GB, "
                               f"built in {result.seconds:.0f} s from {result.base_image}")
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
