"""Raises on one rank (--rank, default 1) once the process group is up (test fixture)."""

import argparse
import time

import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--rank", type=int, default=1)
args = parser.parse_args()
dist.init_process_group("gloo")
if dist.get_rank() == args.rank:
    raise ValueError(f"bad batch on rank {args.rank}")
time.sleep(60)
