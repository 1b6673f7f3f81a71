"""Asks for NCCL on a host without a GPU (test fixture)."""

import torch.distributed as dist

dist.init_process_group("nccl")
