"""edgetrain/ and lab/ pass ruff and mypy with the settings in pyproject.toml, and mypy there
catches a wrong field type on one of the frozen records. Both tools come with the dev extra
(scripts/setup); their versions are pinned in constraints.txt."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _tool(*argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    # The venv's own copies (python -m): the pinned versions, and mypy sees the venv's packages.
    return subprocess.run([sys.executable, "-m", *argv], cwd=cwd, capture_output=True, text=True, timeout=600, check=False)


def test_ruff():
    r = _tool("ruff", "check", "--no-cache", "--output-format", "concise", "edgetrain", "lab")
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy():
    r = _tool("mypy", "--config-file", str(ROOT / "pyproject.toml"))
    assert r.returncode == 0, r.stdout + r.stderr


def test_mypy_catches_a_wrong_field_type_on_a_frozen_record(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("from edgetrain.shared.job_options import JobOptions\n"
                     "JobOptions(seed=7)\n"
                     "JobOptions(seed='7')\n")
    r = _tool("mypy", "--config-file", str(ROOT / "pyproject.toml"), "--cache-dir", str(tmp_path / "cache"), str(probe))
    assert r.returncode == 1, r.stdout + r.stderr
    assert f'{probe}:3: error: Argument "seed" to "JobOptions" has incompatible type "str"; expected "int"  [arg-type]' in r.stdout, r.stdout
    assert "Found 1 error in 1 file" in r.stdout, r.stdout
