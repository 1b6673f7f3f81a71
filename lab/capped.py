"""A slower machine of the same kind, on this one: ``python -m lab.capped [--cpu 0.6] -- ARGS...``
runs ``python ARGS...`` (``-m pytest ...``, say) in a cpu group capped at that share of this machine's
cores, and every group the tests make goes below it (cpugroup.own_group): the testbed's nodes, the
calibration, the tests' Docker engines' containers. Prints the wall time and exits with the
command's status; whatever the command left in the group is ended and the group removed.
"""

from __future__ import annotations

import argparse
import os
import secrets
import signal
import subprocess
import sys
import time

from .cpugroup import CpuGroup

PERIOD_US = 100_000


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.capped", description=__doc__.split("\n\n")[0])
    p.add_argument("--cpu", type=float, default=0.6, help="the share of this machine's cores the command gets (default 0.6)")
    p.add_argument("args", nargs=argparse.REMAINDER, help="after --: the arguments to python")
    args = p.parse_args(argv)
    command = args.args[1:] if args.args[:1] == ["--"] else args.args
    if not command or not 0 < args.cpu <= 1:
        p.error("give a share in (0, 1] and a command after --")
    cores = len(os.sched_getaffinity(0))
    group = CpuGroup.mine(f"edgetrain-capped-{secrets.token_hex(3)}")
    group.create()
    try:
        group.limit(round(args.cpu * cores * PERIOD_US), PERIOD_US)
        start = time.monotonic()
        proc = subprocess.Popen(group.command([sys.executable, *command]))
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda s, _: proc.send_signal(s))
        code = proc.wait()
        print(f"capped at {args.cpu:g} of {cores} cores ({group.name}): exit {code} after {time.monotonic() - start:.0f} s",
              file=sys.stderr)
        return code
    finally:
        group.kill()
        group.remove()


if __name__ == "__main__":
    sys.exit(main())
