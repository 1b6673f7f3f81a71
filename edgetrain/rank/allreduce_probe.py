"""What `edgetrain bench`'s two allreduce probes share - Horovod's (``edgetrain.rank.allreduce``) and
torch.distributed's (``edgetrain.rank.torch_allreduce``): their command line and the CPU clock
they read. Neither framework is imported here."""

from __future__ import annotations

import argparse
import resource


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
