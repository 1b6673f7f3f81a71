"""A session ended by SIGTERM (``timeout``, a CI job's limit) still tears its fixtures down: the
testbed's and the Docker engine's teardown are session fixtures (tests/conftest.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.conftest import ROOT

INNER = '''
import pathlib, time, pytest

HERE = pathlib.Path(__file__).parent

@pytest.fixture(scope="session")
def held():
    yield
    (HERE / "torn-down").write_text("yes")

def test_waits(held):
    (HERE / "started").write_text("yes")
    time.sleep(120)
'''


def test_sigterm_ends_the_session_as_an_interrupt_and_its_fixtures_are_torn_down(tmp_path: Path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_inner.py").write_text(INNER)
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:cacheprovider",
                             "-c", str(tmp_path / "pytest.ini"), "--rootdir", str(tmp_path), str(tmp_path / "test_inner.py")],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 60
        while not (tmp_path / "started").exists():
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0] if proc.poll() is not None else "no start"
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        out = proc.communicate(timeout=60)[0]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert (tmp_path / "torn-down").exists(), out
    assert proc.returncode == 2, out  # pytest's "interrupted"
