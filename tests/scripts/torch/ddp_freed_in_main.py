"""A DDP model made in main() and freed as main() returns, the tutorial's `destroy_process_group()`
called before, and an allreduce in flight whose tensor Python no longer holds. In torch 1.13 the
model's reducer then holds the Gloo process group's last reference and destroys it with the GIL
held, joining the Gloo thread that must take the GIL to free that tensor: without edgetrain
keeping the group alive, this script hangs after its last line, every time (torch 2.13 ends it)."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("gloo")
    model = DDP(torch.nn.Linear(4, 4))
    big = torch.ones(20_000_000)  # 80 MB: still being summed when main() returns
    dist.all_reduce(big, async_op=True)
    del big
    dist.destroy_process_group()
    print(f"rank {dist.get_rank() if dist.is_initialized() else '?'} returns with {type(model).__name__}", flush=True)


if __name__ == "__main__":
    main()
