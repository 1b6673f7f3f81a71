"""A DDP script as torch 2.x documents it, run by torchrun or edgetrain unchanged: the process group
from the environment with no backend named (torch picks Gloo for the CPU, NCCL for CUDA), a model
with scaled_dot_product_attention trained under bfloat16 autocast, and rank 0's weights saved and
loaded back with weights_only=True."""

import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class Attention(nn.Module):
    def __init__(self, dim: int = 32, heads: int = 4):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.out = nn.Linear(dim, dim)
        self.head = nn.Linear(dim, 1)

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in self.qkv(x).chunk(3, dim=-1))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.head(self.out(y.transpose(1, 2).reshape(b, t, d)).mean(1))


def main():
    dist.init_process_group()
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    torch.manual_seed(0)
    model = DDP(Attention().to(device), device_ids=[local_rank] if device.type == "cuda" else None)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(rank)
    x = torch.randn(64, 8, 32, generator=gen).to(device)
    y = x.sum(dim=(1, 2)).unsqueeze(1).div(16)
    losses = []
    for _ in range(20):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = F.mse_loss(model(x).float(), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    print(f"rank {rank}/{world}: loss {losses[0]:.4f} -> {losses[-1]:.4f}", flush=True)
    if rank == 0:
        torch.save(model.module.state_dict(), "attention.pt")
        state = torch.load("attention.pt", weights_only=True, map_location=device)
        same = all(torch.equal(state[k], v) for k, v in model.module.state_dict().items())
        print(f"rank 0 loaded {len(state)} tensors back with weights_only, {'the same' if same else 'DIFFERENT'}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
