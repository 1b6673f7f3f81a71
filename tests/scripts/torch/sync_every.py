"""A DDP script talking every --every steps through edgetrain.ddp.SyncEvery (test fixture). After
each step every rank prints its parameters' digest, how many bucket allreduces DDP has run (a comm
hook counts them) and how many torch.distributed.all_reduce calls were made (the hook's among them), so a test sees when
the ranks agree and what went over the wire. Each rank trains on data of its own."""

import argparse
import hashlib

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel

import edgetrain.ddp as et
from edgetrain.shared.sync import Sync

p = argparse.ArgumentParser()
p.add_argument("--every", type=int, default=4)
p.add_argument("--mode", default="grads")
p.add_argument("--outer-lr", type=float, default=1.0)
p.add_argument("--outer-momentum", type=float, default=0.0)
p.add_argument("--steps", type=int, default=12)
p.add_argument("--epochs", type=int, default=1)
args = p.parse_args()

dist.init_process_group("gloo")
counted = {"hooks": 0, "calls": 0}
all_reduce = dist.all_reduce


def counting_all_reduce(*a, **kw):
    counted["calls"] += 1
    return all_reduce(*a, **kw)


def counting_hook(state, bucket):
    counted["hooks"] += 1
    return default_hooks.allreduce_hook(None, bucket)


dist.all_reduce = counting_all_reduce
torch.manual_seed(dist.get_rank())  # different initial weights: the sync starts every rank from rank 0's
model = DistributedDataParallel(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)))
model.register_comm_hook(None, counting_hook)
opt = torch.optim.SGD(model.parameters(), lr=0.05)
sync = et.SyncEvery(model, opt, Sync(args.every, args.mode, args.outer_lr, args.outer_momentum))
start = et.restore(model, opt, sync)
data = torch.Generator().manual_seed(100 + dist.get_rank())


def digest() -> str:
    h = hashlib.sha256()
    for t in model.module.parameters():
        h.update(t.detach().numpy().tobytes())
    return h.hexdigest()


print(f"start {start} digest {digest()}", flush=True)
for epoch in range(start, args.epochs):
    for i in range(args.steps):
        x = torch.randn(16, 8, generator=data)
        with sync.batch():
            nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True)).backward()
        sync.step()
        print(f"step {epoch * args.steps + i + 1} digest {digest()} hooks {counted['hooks']} calls {counted['calls']}", flush=True)
    et.save(model, opt, epoch + 1, {"epoch": epoch + 1}, sync)
print(f"end digest {digest()}", flush=True)
dist.destroy_process_group()
