"""A DDP script with edgetrain's torch extras: restore, progress, metrics and checkpoints (test fixture)."""

import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

import edgetrain.ddp as et

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=2)
args = p.parse_args()
dist.init_process_group("gloo")
torch.manual_seed(0)
model = nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
start = et.restore(model, opt)
print(f"rank {dist.get_rank()} starts at epoch {start} with bias {model.bias.item():.6f}", flush=True)
model = DistributedDataParallel(model)
x, y = torch.randn(64, 8), torch.randn(64, 1)
progress = et.Progress(batch_size=16, steps=4, epochs=args.epochs, start=start)
for epoch in range(start, args.epochs):
    for i in range(4):
        opt.zero_grad()
        loss = nn.functional.mse_loss(model(x[i * 16:(i + 1) * 16]), y[i * 16:(i + 1) * 16])
        loss.backward()
        opt.step()
        progress.step(loss.item())
    with torch.no_grad():  # within 1 of the target, on the whole set
        right = torch.tensor([(model(x) - y).abs().lt(1).float().mean().item()])
    dist.all_reduce(right)
    progress.epoch(loss=loss.item(), val_accuracy=right.item() / dist.get_world_size())
    et.save(model, opt, epoch + 1, progress.last)
print(f"rank {dist.get_rank()} ends with bias {model.module.bias.item():.6f}", flush=True)
dist.destroy_process_group()
