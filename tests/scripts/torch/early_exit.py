"""Rank 1 leaves after the first allreduce while rank 0 keeps going (test fixture)."""

import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
for step in range(1000):
    dist.all_reduce(torch.ones(1))
    if dist.get_rank() == 1:
        sys.exit(0)
