"""The emulated nodes' daemon: ``python -m lab.emulator [--comm] [--stand-ins] GROUP...``.

Every half second, until SIGTERM: moves new communication threads to their node's Pi core
(``--comm``, comm_core.py) and keeps every idle node training a stand-in (``--stand-ins``,
standin.py). The testbed starts it when it emulates Pis and stops it when it stops; the stand-ins
end with it, however it ends.
"""

from __future__ import annotations

import argparse
import signal
import sys
import threading

from .comm_core import SCAN_SECONDS, Mover
from .cpugroup import CpuGroup
from .standin import StandIns


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lab.emulator", description=__doc__.split("\n\n")[0])
    p.add_argument("--comm", action="store_true", help="move communication threads to GROUP-comm")
    p.add_argument("--stand-ins", action="store_true", help="keep idle nodes training")
    p.add_argument("groups", nargs="+", help="the emulated nodes' cpu groups")
    args = p.parse_args(argv)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    groups = [CpuGroup(g) for g in args.groups]
    mover = Mover(groups) if args.comm else None
    stand_ins = StandIns(groups) if args.stand_ins else None
    try:
        while not stop.is_set():
            if mover is not None:
                mover.scan()
            if stand_ins is not None:
                stand_ins.scan()
            stop.wait(SCAN_SECONDS)
    finally:
        if stand_ins is not None:
            stand_ins.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
