"""torch.distributed's allreduce between the ranks of one launch, as DDP does it: `edgetrain bench`'s
probe for ``--strategy torch``, the counterpart of ``edgetrain.rank.allreduce`` (Horovod's).

``... edgetrain.rank.worker --strategy torch --module edgetrain.rank.torch_allreduce -- --bytes 3374632``:
the process group from the environment the strategy set (Gloo on CPU nodes, NCCL where there are
GPUs), every rank allreduces a float32 tensor of that size (and an 8-byte one, for latency), and
rank 0 reports an ``allreduce`` event with the same figures as Horovod's probe: wall seconds per
operation (the slowest rank's), CPU seconds per operation (the busiest rank's, all threads) and
per second between operations. DDP has no cycle to wait for: a bucket's allreduce starts as soon
as backprop has filled it.
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from edgetrain.rank import allreduce_probe
from edgetrain.shared.progress import rank0_events


def _time(tensor: torch.Tensor, iters: int) -> tuple[float, float]:
    """(wall, CPU) seconds per allreduce of ``tensor`` in place (zeros: the sum stays what it was):
    the slowest rank's wall time and the busiest rank's CPU."""
    for _ in range(2):  # connection setup, buffers
        dist.all_reduce(tensor)
    dist.barrier()
    wall, cpu = time.perf_counter(), allreduce_probe.cpu_seconds()
    for _ in range(iters):
        dist.all_reduce(tensor)
    wall, cpu = (time.perf_counter() - wall) / iters, (allreduce_probe.cpu_seconds() - cpu) / iters
    worst = torch.tensor([wall, cpu], dtype=torch.float64, device=tensor.device)
    dist.all_reduce(worst, op=dist.ReduceOp.MAX)
    return float(worst[0]), float(worst[1])


def main(argv: list[str] | None = None) -> None:
    args = allreduce_probe.parse("edgetrain.rank.torch_allreduce", argv, "float16 on the wire, as DDP's fp16_compress_hook sends it")
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0"))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    wire = torch.float16 if args.fp16 else torch.float32
    wall, cpu = _time(torch.zeros(max(1, args.bytes // 4), dtype=wire, device=device), args.iters)
    small_wall, _ = _time(torch.zeros(2, device=device), 50)
    idle = torch.tensor(allreduce_probe.idle_cpu_per_second(dist.barrier), dtype=torch.float64)
    dist.all_reduce(idle, op=dist.ReduceOp.MAX)
    check = torch.ones(4, device=device)
    dist.all_reduce(check)
    size = dist.get_world_size()
    if not bool((check == size).all()):
        raise SystemExit(f"allreduce returned {check.tolist()}, expected {size} everywhere")
    rank0_events(dist.get_rank()).emit(
        "allreduce", ranks=size, bytes=args.bytes, fp16=args.fp16, iters=args.iters, seconds=wall, cpu_seconds=cpu,
        latency_seconds=small_wall, transport=dist.get_backend(), cycle_seconds=0.0,
        idle_cpu_per_second=float(idle))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
