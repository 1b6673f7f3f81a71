"""Two torch DDP ranks (Gloo) train a model without batch statistics by speed (batches from
EDGETRAIN_RANK_SPEEDS) through edgetrain.ddp's plan and sampler, as a torch script would; rank 0 then
trains the same start on one process, on the union of the ranks' batches at each step, and prints
how far apart the weights are - with the loss weight, and without it (which must not match).
Under edgetrain run --strategy torch, or plain mpirun (whose PMI_RANK and PMI_SIZE then give each
process its rank)."""

import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, TensorDataset

import edgetrain.ddp as et
from edgetrain.shared.batches import Batches

# Steps, and the per-rank batch (2 unless given: a global batch of 4 on 2 ranks).
STEPS, PER_RANK = int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 2
for name, value in {"RANK": os.environ.get("PMI_RANK"), "WORLD_SIZE": os.environ.get("PMI_SIZE"), "MASTER_ADDR": "127.0.0.1"}.items():
    os.environ.setdefault(name, value)
torch.set_num_threads(1)
dist.init_process_group("gloo")
g = torch.Generator().manual_seed(0)
data = TensorDataset(torch.randn(64, 6, generator=g), torch.randint(0, 3, (64,), generator=g))


def model() -> torch.nn.Module:
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def train(net, loader, steps: int, weight: float) -> list[torch.Tensor]:
    opt = torch.optim.Adam(net.parameters(), lr=0.05)
    for _, (x, y) in zip(range(steps), loader):
        opt.zero_grad()
        (torch.nn.functional.cross_entropy(net(x), y) * weight).backward()
        opt.step()
    return [p.detach().clone() for p in getattr(net, "module", net).parameters()]


def distributed(plan: Batches, weighted: bool) -> list[torch.Tensor]:
    sampler = et.ShardSampler(data, plan, shuffle=False)
    loader = DataLoader(data, batch_size=plan.mine, sampler=sampler, drop_last=True)
    assert len(loader) == plan.steps(len(data)), (len(loader), plan)
    return train(DistributedDataParallel(model()), loader, STEPS, plan.weight if weighted else 1.0)


def union(plan: Batches) -> list[torch.Tensor]:
    """One process, one optimizer, each step's batch the ranks' batches of that step together."""
    shards = [Batches(plan.sizes, r).indices(len(data)) for r in range(len(plan.sizes))]
    order = [i for k in range(STEPS) for r, b in enumerate(plan.sizes) for i in shards[r][k * b:(k + 1) * b]]
    loader = DataLoader(torch.utils.data.Subset(data, order), batch_size=plan.total, shuffle=False)
    return train(model(), loader, STEPS, 1.0)


plan = et.batches(PER_RANK)
et.Progress(batch_size=PER_RANK, steps=STEPS)  # its start event names the batches
weighted, unweighted = distributed(plan, True), distributed(plan, False)
if plan.rank == 0:
    reference = union(plan)
    far = lambda ws: max(float((a - b).abs().max()) for a, b in zip(ws, reference))  # noqa: E731
    print(f"batches {plan.describe()} weighted {far(weighted):.3g} unweighted {far(unweighted):.3g}", flush=True)
dist.destroy_process_group()
