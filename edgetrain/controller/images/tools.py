"""What the image modules share: the progress log they report through, and this machine's
commands, each failing as one EdgetrainError that names the step and the fix."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Callable

from edgetrain.shared.errors import EdgetrainError

Log = Callable[[str], None]


def run_tool(cmd: list[str], what: str, fix: str | None = None, **kwargs) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, text=True, capture_output=True, check=False, **kwargs)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or proc.stdout.strip().splitlines() or ["(no output)"])[-1]
        raise EdgetrainError(f"{what} failed: {last}", fix)
    return proc


def need_tool(tool: str, package: str) -> None:
    if shutil.which(tool) is None:
        raise EdgetrainError(f"{tool} is not installed on this machine", f"install it (Debian: apt-get install {package})")
