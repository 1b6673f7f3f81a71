"""Temp directories named with the pid of the process that made them.

A process ended outright (SIGKILL: a fault, a killed controller) cannot remove its own, so each new
one is made after removing those of this user's processes that are gone. A directory whose pid
now names another process, or that carries no pid, is left alone.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

OWNED = re.compile(r"edgetrain-[a-z0-9]+-pid(\d+)-")


def prefix(kind: str, pid: int) -> str:
    """The start of the name of a directory ``kind`` made by process ``pid``."""
    return f"edgetrain-{kind}-pid{pid}-"


def make(kind: str) -> str:
    """A new ``edgetrain-<kind>-pid<pid>-*`` directory in the temp directory; abandoned ones go first."""
    for old in Path(tempfile.gettempdir()).glob("edgetrain-*-pid*-*"):
        found = OWNED.match(old.name)
        try:
            if found and old.is_dir() and old.stat().st_uid == os.getuid():
                os.kill(int(found.group(1)), 0)
        except ProcessLookupError:
            shutil.rmtree(old, ignore_errors=True)
        except OSError:
            pass  # alive under another user (EPERM), or gone meanwhile
    return tempfile.mkdtemp(prefix=prefix(kind, os.getpid()))
