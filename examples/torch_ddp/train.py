"""LeNet on MNIST with torch's DistributedDataParallel, written the way torch's DDP tutorial and
torchrun's examples teach it: the process group from the environment torchrun sets, a
DistributedSampler giving each rank its shard, one GPU per local rank where there are GPUs, and
rank 0 saving the weights. It runs unchanged under

    torchrun --nproc_per_node 2 train.py --epochs 1
    edgetrain run examples/torch_ddp/train.py --np 2 --strategy torch -- --epochs 1

MNIST offline: edgetrain stages it and says where ($EDGETRAIN_DATA/mnist/, Keras' mnist.npz or
the classic mnist.pkl.gz); elsewhere pass --data DIR holding either file.

With --holdout N the script keeps N training images out (a fixed draw, the same at every seed),
scores them every --eval-every steps and at each epoch's end, and with --target-accuracy stops
once they reach it: time to accuracy, MLPerf's way, with the test set scored once at the end.

DDP's own knobs for slow nodes and links: --bucket-cap-mb (how much gradient each allreduce
carries; smaller buckets start sooner behind the backward pass, at more calls) and --comm-hook
(fp16: half the bytes; powersgd: a rank-1 approximation of each gradient matrix, far fewer bytes
for more arithmetic).
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
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
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


def hold_out(x, y, n: int):
    """((the rest), (n images held out)), drawn by a permutation fixed across seeds, so that every
    try stops on the same images."""
    order = np.random.default_rng(0).permutation(len(y))
    rest, held = np.sort(order[n:]), np.sort(order[:n])
    return (x[rest], y[rest]), (x[held], y[held])


def accuracy(model, data, device) -> float:
    """Each rank scores its share of ``data``; the counts are summed over the ranks."""
    model.eval()
    right = torch.zeros(2, device=device)
    with torch.no_grad():
        for xb, yb in DataLoader(data, batch_size=512, sampler=DistributedSampler(data, shuffle=False)):
            right += torch.tensor([(model(xb.to(device)).argmax(1) == yb.to(device)).sum().item(), len(yb)], device=device)
    dist.all_reduce(right)
    model.train()
    return right[0].item() / right[1].item()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.001)
    p.add_argument("--steps-per-epoch", type=int, default=None, help="at most this many steps an epoch (a quick run)")
    p.add_argument("--log-interval", type=int, default=100, help="rank 0 prints the loss every this many steps (the first among them)")
    p.add_argument("--data", type=Path, default=Path(os.environ.get("EDGETRAIN_DATA", "data")) / "mnist")
    p.add_argument("--seed", type=int, default=42, help="the weights' and the shuffle's seed")
    p.add_argument("--holdout", type=int, default=0, help="keep this many training images out and score them as training goes")
    p.add_argument("--eval-every", type=int, default=None, help="score the held-out images every this many steps, besides each epoch's end")
    p.add_argument("--target-accuracy", type=float, default=None, help="stop once the held-out images score this")
    p.add_argument("--bucket-cap-mb", type=float, default=25, help="DDP's gradient bucket size (its default: 25)")
    p.add_argument("--comm-hook", choices=["none", "fp16", "powersgd"], default="none", help="compress the gradients DDP sends")
    args = p.parse_args()
    if args.target_accuracy is not None and not args.holdout:
        p.error("--target-accuracy is judged on held-out images: give --holdout")

    cuda = torch.cuda.is_available()
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local_rank)  # one GPU per local rank, as Horovod pins them
    dist.init_process_group()  # torch 2's default: Gloo for CPU tensors, NCCL for CUDA ones
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    torch.manual_seed(args.seed)

    (x, y), (xt, yt) = load_mnist(args.data)
    if args.holdout:
        (x, y), held = hold_out(x, y, args.holdout)
        held = tensors(*held)
    train = tensors(x, y)
    sampler = DistributedSampler(train, shuffle=True, seed=args.seed)
    loader = DataLoader(train, batch_size=args.batch_size, sampler=sampler)
    model = DDP(LeNet().to(device), device_ids=[local_rank] if cuda else None, bucket_cap_mb=args.bucket_cap_mb)
    if args.comm_hook == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif args.comm_hook == "powersgd":
        # torch's default sends plain allreduces for the first 1,000 steps, longer than a short run
        # on a few Pis lasts: compress from the 10th.
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=10)
        model.register_comm_hook(state, powerSGD_hook.powerSGD_hook)
    # The learning rate scaled with the ranks, as Horovod's examples scale it.
    opt = torch.optim.Adam(model.parameters(), lr=args.lr * world)

    trained = 0  # images, over all ranks

    def reached(epoch: int) -> bool:
        """Score the held-out images; whether they reached the target."""
        acc = accuracy(model, held, device)
        if rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs}: held-out accuracy {acc:.4f} after {trained:,} images", flush=True)
        return args.target_accuracy is not None and acc >= args.target_accuracy

    done = False
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        model.train()
        steps = min(len(loader), args.steps_per_epoch or len(loader))
        start, seen, taken, total = time.monotonic(), 0, 0, 0.0
        for xb, yb in loader:
            xb, yb = xb.to(device), yb.to(device)
            opt.zero_grad()
            loss = F.cross_entropy(model(xb), yb)
            loss.backward()
            opt.step()
            seen, taken, total, trained = seen + len(xb), taken + 1, total + loss.item(), trained + len(xb) * world
            if rank == 0 and (taken - 1) % args.log_interval == 0:
                print(f"epoch {epoch + 1}/{args.epochs} step {taken}/{steps}: loss {loss.item():.4f}", flush=True)
            if taken == steps:
                break
            if args.holdout and args.eval_every and taken % args.eval_every == 0:
                scoring = time.monotonic()
                done = reached(epoch)
                start += time.monotonic() - scoring  # the epoch's img/s is training's alone
                if done:
                    break
        if rank == 0:
            print(f"epoch {epoch + 1}/{args.epochs}: loss {total / taken:.4f}, {seen * world / (time.monotonic() - start):,.0f} img/s on {world} ranks", flush=True)
        if done or (args.holdout and reached(epoch)):
            if rank == 0:
                print(f"reached held-out accuracy {args.target_accuracy} after {trained:,} images", flush=True)
            break
    else:
        if args.target_accuracy is not None and rank == 0:
            print(f"held-out accuracy {args.target_accuracy} not reached in {args.epochs} epochs", flush=True)

    test = accuracy(model, tensors(xt, yt), device)
    if rank == 0:
        print(f"test accuracy {test:.4f}", flush=True)
        torch.save(model.module.state_dict(), "lenet.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
