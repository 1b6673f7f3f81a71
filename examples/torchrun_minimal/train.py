"""The smallest torchrun-style script: the process group from the environment torchrun gives each
worker, one allreduce. Unchanged under `torchrun --nproc_per_node 2 train.py` and
`edgetrain run examples/torchrun_minimal/train.py --np 2 --strategy torch`."""

import os

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(4) * dist.get_rank()
dist.all_reduce(t)
seen = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK",
                                       "GROUP_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")}
print(f"rank {dist.get_rank()}/{dist.get_world_size()}: allreduce {t.tolist()}, {torch.get_num_threads()} threads, env {seen}",
      flush=True)
dist.destroy_process_group()
