"""What `edgetrain bench`'s two allreduce probes share - Horovod's (``edgetrain.rank.allreduce``) and
torch.distributed's (``edgetrain.rank.torch_allreduce``): their command line and the CPU clock
they read. Neither framework is imported here."""

from __future__ import annotations

import argparse
import resource
import time
from collections.abc import Callable

# Long enough for a hundred turns of Horovod's cycle at its default, short beside a probe's start.
IDLE_SECONDS = 1.0


def parse(prog: str, argv: list[str] | None, fp16: str) -> argparse.Namespace:
    """``--bytes`` (the gradient's size, float32), ``--iters``, ``--fp16`` (``fp16`` says how it goes on the wire)."""
    p = argparse.ArgumentParser(prog=prog)
    p.add_argument("--bytes", type=int, required=True, help="the gradient's size in bytes (float32)")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--fp16", action="store_true", help=fp16)
    return p.parse_args(argv)


def cpu_seconds() -> float:
    """This process's CPU time, every thread's (the communication's polling included)."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def idle_cpu_per_second(barrier: Callable[[], object], seconds: float = IDLE_SECONDS) -> float:
    """This process's CPU seconds per second with nothing to communicate, after ``barrier`` has
    lined the ranks up: what the communication's threads cost while the training computes
    (Horovod's cycle coordinates with every rank at each turn, sent or not)."""
    barrier()
    wall, cpu = time.perf_counter(), cpu_seconds()
    time.sleep(seconds)
    return (cpu_seconds() - cpu) / (time.perf_counter() - wall)
