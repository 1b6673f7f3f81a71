"""A container's lease: ``python -m edgetrain.rank.lease FILE SECONDS``, started in every container.

The controller touches FILE (in the node's run directory) every few seconds while it runs. When
nobody has for SECONDS - the controller was killed, lost power, or lost the link to this node -
this ends the container's sshd (its PID 1), and with it the container and every rank in it
(containers run with --rm, so nothing is left). The node needs nobody to come back and clean up.
"""

from __future__ import annotations

import os
import signal
import sys
import time


def age(path: str) -> float:
    try:
        return time.time() - os.stat(path).st_mtime
    except FileNotFoundError:
        return float("inf")


def main(argv: list[str] | None = None) -> None:
    path, timeout = (argv or sys.argv[1:])[:2]
    limit = float(timeout)
    while age(path) <= limit:
        time.sleep(min(5.0, limit / 4))
    print(f"edgetrain: lease {path} not renewed for {limit:.0f} s: the controller is gone; stopping this container",
          file=sys.stderr, flush=True)
    os.kill(1, signal.SIGTERM)


if __name__ == "__main__":
    main()
