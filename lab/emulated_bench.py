"""``edgetrain bench`` for emulated nodes: ``python -m lab.emulated_bench [--reference alone|concurrent] JOB ARGS...``.

Emulated nodes share this machine, so one node's run alone has every core to itself and E(N)
would divide by a rate no node keeps beside the others. By default (``--reference concurrent``)
E(N)'s one node at each N is N one-node runs at once, one on each of the first N nodes; their
trials are bench.json's ``beside`` ones, which ``run --batch-by speed`` takes as each node's rate
(so the product's (t) step, each node timed alone, is skipped). ``--reference alone`` is the
product's bench. Every other argument is ``edgetrain bench``'s.
"""

from __future__ import annotations

import sys

from edgetrain.controller import cli
from edgetrain.controller.bench.runner import Reference

COMMAND = ("python", "-m", "lab.emulated_bench")


def split(argv: list[str]) -> tuple[Reference, list[str]]:
    """The ``--reference`` (or ``--reference=``) before any ``--``, and bench's own arguments."""
    end = argv.index("--") if "--" in argv else len(argv)
    for i, word in enumerate(argv[:end]):
        name, eq, value = word.partition("=")
        if name != "--reference":
            continue
        taken = 1 if eq else 2
        if not eq:
            if i + 1 >= end:
                raise SystemExit("--reference needs a value: alone or concurrent")
            value = argv[i + 1]
        try:
            return Reference(value), argv[:i] + argv[i + taken:]
        except ValueError:
            raise SystemExit(f"--reference {value!r}: give alone or concurrent") from None
    return Reference.CONCURRENT, list(argv)


def main(argv: list[str]) -> None:
    reference, args = split(argv)
    cli.main(["bench", *args], cli.BenchCall(reference, (*COMMAND, *argv)))


if __name__ == "__main__":
    main(sys.argv[1:])
