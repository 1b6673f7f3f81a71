"""Shared fixtures: the real CLI in a subprocess, isolated run and cache directories."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


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


def snapshot(root: Path) -> dict[str, str]:
    """Every file under root with its sha256: to prove a failed command changed nothing."""
    if not root.exists():
        return {}
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*")) if p.is_file()
    }
