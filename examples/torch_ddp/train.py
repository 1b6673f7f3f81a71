"""LeNet on MNIST with torch's DistributedDataParallel, written the way torch's DDP tutorial and
torchrun's examples teach it: the process group from the environment torchrun sets, a
DistributedSampler giving each rank its shard, one GPU per local rank where there are GPUs, and
rank 0 saving the weights. It runs unchanged under

    torchrun --nproc_per_node 2 train.py --epochs 1
    edgetrain run examples/torch_ddp/train.py --np 2 --strategy torch -- --epochs 1

MNIST offline: edgetrain stages it and says where ($EDGETRAIN_DATA/mnist/, Keras' mnist.npz or
the classic mnist.pkl.gz); elsewhere pass --data DIR holding either file.
"""

import argparse
import gzip
import os
import pickle
import time
from pathlib import Path

import numpy as np
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def load_mnist(folder: Path):
    """((x, y), (x_test, y_test)), images as float32 in [0, 1]."""
    if (folder / "mnist.npz").is_file():
        with np.load(folder / "mnist.npz") as f:
            return ((f["x_train"] / 255.0).astype(np.float32), f["y_train"]), ((f["x_test"] / 255.0).astype(np.float32), f["y_test"])
    with gzip.open(folder / "mnist.pkl.gz") as f:
        (x, y), (xv, yv), (xt, yt) = pickle.load(f, encoding="latin1")
    return (np.concatenate([x, xv]), np.concatenate([y, yv])), (xt, yt)


class LeNet(nn.Module):
    """The seed's network: Conv32-Pool-Conv64-Pool-Dense512-Dense10."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 32, 3)
        self.conv2 = nn.Conv2d(32, 64, 3)
        self.fc1 = nn.Linear(64 * 5 * 5, 512)
        self.fc2 = nn.Linear(512, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


def tensors(x, y):
    return TensorDataset(torch.from_numpy(np.asarray(x, np.float32).reshape(-1, 1, 28, 28)), torch.from_numpy(np.asarray(y, np.int64)))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.001)
    p.add_argument("--steps-per-epoch", type=int, default=None, help="at most this many steps an epoch (a quick run)")
    p.add_argument("--log-interval", type=int, default=100, help="rank 0 prints the loss every this many steps (the first among them)")
    p.add_argument("--data", type=Path, default=Path(os.environ.get("EDGETRAIN_DATA", "data")) / "mnist")
    args = p.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local_rank)  # one GPU per local rank, as Horovod pins them
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    torch.manual_seed(42)

    (x, y), (xt, yt) = load_mnist(args.data)
    train = tensors(x, y)
    sampler = DistributedSampler(train, shuffle=True, seed=42)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler)
    model = DDP(LeNet().to(device), device_ids=[local_rank] if cuda else None)
    # The learning rate scaled with the ranks, as Horovod's examples scale it.
    opt = torch.optim.Adam(model.parameters(), lr=args.lr * world)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        start, seen, total = time.monotonic(), 0, 0.0
        steps = min(len(loader), args.steps_per_epoch or len(loader))
        for step, (xb, yb) in enumerate(loader):
            if args.steps_per_epoch and step >= args.steps_per_epoch:
                break
            xb, yb = xb.to(device), yb.to(device)
            opt.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            seen, total = seen + len(xb), total + loss.item()
            if rank == 0 and step % args.log_interval == 0:
                print(f"epoch {epoch + 1}/{args.epochs} step {step + 1}/{steps}: loss {loss.item():.4f}", flush=True)
        rate = seen * world / (time.monotonic() - start)
        if rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs}: loss {total / steps:.4f}, {rate:,.0f} img/s on {world} ranks", flush=True)

    # Each rank scores its share of the test set; the counts are summed over the ranks.
    model.eval()
    test = tensors(xt, yt)
    right = torch.zeros(2, device=device)
    with torch.no_grad():
        for xb, yb in DataLoader(test, batch_size=512, sampler=DistributedSampler(test, shuffle=False)):
            right += torch.tensor([(model(xb.to(device)).argmax(1) == yb.to(device)).sum().item(), len(yb)], device=device)
    dist.all_reduce(right)
    if rank == 0:
        print(f"test accuracy {right[0].item() / right[1].item():.4f}", flush=True)
        torch.save(model.module.state_dict(), "lenet.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
