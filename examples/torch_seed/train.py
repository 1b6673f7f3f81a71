"""A script in the style of the PyTorch seed ("pytorch distributed, a first look"): it takes its
rank, the world size and rank 0's address as arguments, and was started by hand on every node:

    python train.py --dist-url tcp://10.0.0.1:2222 --dist-rank 0 --world-size 2   # node 1
    python train.py --dist-url tcp://10.0.0.1:2222 --dist-rank 1 --world-size 2   # node 2

Under edgetrain one command starts it everywhere, each rank given its own values:

    edgetrain run examples/torch_seed/train.py --np 2 --strategy torch -- \\
        --dist-url {master_url} --dist-rank {rank} --world-size {world_size}
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dist-url", required=True)
    p.add_argument("--dist-rank", type=int, required=True)
    p.add_argument("--world-size", type=int, required=True)
    p.add_argument("--dist-backend", default="gloo")
    p.add_argument("--epochs", type=int, default=2)
    args = p.parse_args()
    dist.init_process_group(backend=args.dist_backend, init_method=args.dist_url, world_size=args.world_size,
                            rank=args.dist_rank)
    torch.manual_seed(0)
    x = torch.randn(1024, 20)
    y = (x.sum(1, keepdim=True) > 0).float()
    data = TensorDataset(x, y)
    sampler = DistributedSampler(data)
    model = DistributedDataParallel(nn.Sequential(nn.Linear(20, 32), nn.ReLU(), nn.Linear(32, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        for xb, yb in DataLoader(data, batch_size=32, sampler=sampler):
            opt.zero_grad()
            loss = nn.functional.binary_cross_entropy_with_logits(model(xb), yb)
            loss.backward()
            opt.step()
        print(f"rank {args.dist_rank}/{args.world_size} epoch {epoch + 1}: loss {loss.item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
