"""Opt-in extras for a torch.distributed script that edgetrain runs (``--strategy torch``), as
``edgetrain.callbacks`` is for Keras: progress on the console, a line per epoch in
``metrics.jsonl``, TensorBoard event files from rank 0, a checkpoint per epoch with a sha256
manifest (written by rank 0, atomically), and ``restore()`` for ``edgetrain run ... --resume RUN``.

    import edgetrain.ddp as et

    start = et.restore(model, optimizer)          # before DistributedDataParallel: the epoch to start from
    model = DistributedDataParallel(model)
    progress = et.Progress(batch_size=64, steps=len(loader), epochs=args.epochs, start=start)
    for epoch in range(start, args.epochs):
        for x, y in loader:
            ...
            progress.step(loss.item())
        progress.epoch(val_accuracy=accuracy)     # the console's epoch line, metrics.jsonl, TensorBoard
        et.save(model, optimizer, epoch + 1, progress.last)   # rank 0 writes; every rank may call it

Outside edgetrain (no ``EDGETRAIN_RUN_DIR``) the same script still runs: files go to ``./``.

Batches by speed (``edgetrain run --batch-by speed``; with equal batches the same calls change nothing):

    plan = et.batches(args.batch_size)            # once the process group is up; the per-rank batch, as ever
    sampler = et.ShardSampler(train, plan, seed=args.seed)          # in place of DistributedSampler
    loader = DataLoader(train, batch_size=plan.mine, sampler=sampler, drop_last=True)
    for epoch in ...:
        sampler.set_epoch(epoch)
        for x, y in loader:                       # len(loader) steps, the same on every rank
            (loss_fn(model(x), y) * plan.weight).backward()       # DDP averages equally: weight the loss

Talking every K batches instead of each (``edgetrain.shared.sync``): after DistributedDataParallel,

    sync = et.SyncEvery(model, optimizer, Sync(sync_every=4, sync_mode="grads"))   # or "weights"
    start = et.restore(model, optimizer, sync)
    ...
            with sync.batch():                    # the forward and backward pass in it
                loss_fn(model(x), y).backward()
            sync.step()                           # for optimizer.step(); optimizer.zero_grad()
        sync.flush()                              # before evaluating: every rank on one model
        et.save(model, optimizer, epoch + 1, progress.last, sync)   # on every rank: it flushes too
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from edgetrain.shared import checkpoints, runs
from edgetrain.shared.batches import Batches
from edgetrain.shared.progress import REPORT_S, rank0_events
from edgetrain.shared.sync import EVERY_STEP, Sync, SyncMode

STATE = "state.pt"


def rank_and_size() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def batches(batch_size: int) -> Batches:
    """This rank's batch, shard and loss weight under the run's plan, for a script whose per-rank
    batch is ``batch_size``: equal batches, or with ``--batch-by speed`` each rank's in proportion to
    its node's speed, the global batch unchanged (edgetrain.shared.batches)."""
    rank, size = rank_and_size()
    return Batches.planned(batch_size, rank, size)


class ShardSampler(torch.utils.data.Sampler):
    """DistributedSampler for batches that may differ: this rank's shard of ``dataset`` (in
    proportion to its batch; with equal batches DistributedSampler's ``rank::size``), reshuffled each
    epoch (``set_epoch``), cut to the steps every rank takes times this rank's batch."""

    def __init__(self, dataset, plan: Batches, shuffle: bool = True, seed: int = 0) -> None:
        self.shard = torch.tensor(plan.indices(len(dataset)), dtype=torch.int64)
        self.count = plan.steps(len(dataset)) * plan.mine
        self.shuffle, self.seed, self.epoch, self.rank = shuffle, seed, 0, plan.rank

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self):
        order = self.shard
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + 1000003 * self.epoch + self.rank)
            order = order[torch.randperm(len(order), generator=g)]
        return iter(order[:self.count].tolist())

    def __len__(self) -> int:
        return self.count


def _module(model: torch.nn.Module) -> torch.nn.Module:
    """The model inside DistributedDataParallel, whose state a checkpoint holds."""
    return getattr(model, "module", model)


def restore(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None = None, sync: SyncEvery | None = None) -> int:
    """Load the checkpoint of a resumed run (rank 0 verifies its files against the manifest and
    reads it; every rank gets rank 0's state, ``sync``'s outer momentum included) and return the
    epoch to start from; 0 when the run is not a resume. Call it once the process group is up."""
    rank, size = rank_and_size()
    found: list = [None, 0]
    source = os.environ.get("EDGETRAIN_RESUME_FROM")
    if source and rank == 0:
        ckpt = checkpoints.read(Path(source))
        checkpoints.verify(ckpt)
        # Tensors and plain containers only, never code from a pickle (torch 2.6's default; 1.13 needs it said).
        found = [torch.load(Path(source) / STATE, map_location="cpu", weights_only=True), ckpt.epoch]
        print(f"resumed from {source} (epoch {ckpt.epoch})", flush=True)
    if size > 1 and dist.is_initialized():
        dist.broadcast_object_list(found, src=0)  # the other nodes do not hold rank 0's run directory
    state, epoch = found
    if state is not None:
        _module(model).load_state_dict(state["model"])
        if optimizer is not None and state.get("optimizer") is not None:
            optimizer.load_state_dict(state["optimizer"])
        if sync is not None:
            sync.load_state_dict(state.get("sync") or {})
    return epoch


def save(model: torch.nn.Module, optimizer: torch.optim.Optimizer | None, epoch: int, metrics: dict | None = None,
         sync: SyncEvery | None = None) -> None:
    """Rank 0 writes epoch ``epoch``'s checkpoint (model and optimizer state, and ``sync``'s outer
    momentum) atomically, with a sha256 manifest that ``--resume`` and ``collect`` verify; the other
    ranks do nothing. With ``sync`` every rank calls it: it syncs what is pending first, so the
    checkpoint is the ranks' one model."""
    if sync is not None:
        sync.flush()
    if rank_and_size()[0] != 0:
        return
    state = {"model": _module(model).state_dict(), "optimizer": optimizer.state_dict() if optimizer is not None else None}
    if sync is not None:
        state["sync"] = sync.state_dict()
    checkpoints.write(runs.this_run().checkpoints, epoch, runs.job_name(), metrics or {}, lambda d: torch.save(state, d / STATE))


class Progress:
    """Rank 0's progress: ``step()`` after each training step, ``epoch()`` after each epoch.
    ``batch_size`` is the per-rank batch the script was given (with batches by speed, the global
    batch over the ranks); the start event names every rank's batch where they differ."""

    def __init__(self, batch_size: int | None = None, steps: int = 0, epochs: int = 1, start: int = 0) -> None:
        self.rank, self.size = rank_and_size()
        plan = Batches.planned(batch_size, self.rank, self.size) if batch_size else None
        self.global_batch = batch_size * self.size if batch_size else None
        self.steps, self.epochs, self.current = steps, epochs, start
        self.started = time.time()
        self.events = rank0_events(self.rank)
        self.last: dict = {}
        self.done, self.last_emit, self.epoch_start = 0, 0.0, time.time()
        self.last_step_at = self.epoch_start
        # This process's CPU time (every thread: torch's and Gloo's), at the same two moments.
        self.epoch_cpu = self.last_step_cpu = time.process_time()
        self.trained, self.images = 0.0, 0  # training seconds and images so far, summed at each epoch's end
        self.cpu_trained = 0.0  # and this rank's training CPU seconds
        self.board = self._tensorboard()
        uneven = {"batches": list(plan.sizes)} if plan and not plan.even else {}
        self.events.emit("start", job=runs.job_name(), ranks=self.size, epochs=epochs, initial_epoch=start, steps=steps,
                         versions={"torch": torch.__version__}, **uneven)

    def _tensorboard(self):
        if self.rank != 0:
            return None
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:  # TensorBoard is not installed: the rest works without it
            return None
        return SummaryWriter(str(runs.this_run().tensorboard))

    def step(self, loss: float) -> None:
        self.done += 1
        now = self.last_step_at = time.time()
        self.last_step_cpu = time.process_time()
        if now - self.last_emit > REPORT_S or self.done == self.steps:
            self.last_emit = now
            ips = self.done * self.global_batch / max(now - self.epoch_start, 1e-9) if self.global_batch else None
            self.events.emit("step", epoch=self.current + 1, step=self.done, steps=self.steps, loss=float(loss),
                             images_per_sec=ips)

    def epoch(self, loss: float | None = None, **metrics: float) -> dict:
        """The epoch's figures (the same on every rank, e.g. averaged with all_reduce): recorded on
        rank 0, and the next epoch begins. With ``val_accuracy`` among them, also an evaluation
        record, from which `edgetrain bench` reads the time to its target accuracy and, summed over
        the ranks with an all_reduce, the training CPU time: call it on every rank."""
        now = time.time()
        seconds = self.last_step_at - self.epoch_start  # training steps only: not the evaluation after them
        self.trained, self.images = self.trained + seconds, self.images + self.done * (self.global_batch or 0)
        self.cpu_trained += self.last_step_cpu - self.epoch_cpu
        record = {"epoch": self.current + 1, **({"loss": float(loss)} if loss is not None else {}),
                  **{k: float(v) for k, v in metrics.items()}}
        if self.global_batch and self.done and seconds > 0:
            record["images_per_sec"] = self.done * self.global_batch / seconds
        record.update(elapsed=now - self.started, ranks=self.size)
        lines: list[dict[str, Any]] = [record]
        if "val_accuracy" in record:
            lines.append({"kind": "eval", "epoch": record["epoch"], "step": self.done, "seconds": now - self.started,
                          "train_seconds": self.trained, "images": self.images or None, "val_accuracy": record["val_accuracy"],
                          "val_loss": record.get("val_loss"), "eval_seconds": now - self.last_step_at, "ranks": self.size,
                          **self._cpu_seconds()})
        if self.rank == 0:
            runs.this_run().append_metrics(lines)
            self.events.emit("epoch", **record)
            if self.board is not None:
                for k, v in record.items():
                    if k not in ("epoch", "ranks", "elapsed"):
                        self.board.add_scalar(k, v, record["epoch"])
                self.board.flush()
        self.last, self.current, self.done = record, self.current + 1, 0
        self.epoch_start = self.last_step_at = time.time()
        self.epoch_cpu = self.last_step_cpu = time.process_time()
        return record

    def _cpu_seconds(self) -> dict:
        """Every rank's training CPU seconds so far, summed (`edgetrain bench`'s img/CPU-s): a
        collective, as ``epoch()`` is called on every rank; nothing outside a process group."""
        if not dist.is_available() or not dist.is_initialized():
            return {}
        total = torch.tensor([self.cpu_trained], dtype=torch.float64)
        if dist.get_backend() == "nccl":
            total = total.cuda()
        dist.all_reduce(total)
        return {"train_cpu_seconds": float(total.item())}


class SyncEvery:
    """``--sync-every`` for a torch.distributed script: each batch's forward and backward pass
    ``with batch():``, ``step()`` for ``optimizer.step(); optimizer.zero_grad()``, ``flush()``
    before an evaluation.

    - grads: the K-1 backward passes before an update run in DDP's ``no_sync`` (no allreduce; the
      gradients add up), the K-th allreduces their sum as DDP does every step; ``step`` divides by K
      and updates. The rate rule: the job's rate times ranks x K x batch / its batch.
    - weights: every backward pass in ``no_sync``, an update per batch on each rank; every K one
      all_reduce of all parameters, flattened, averages the models (and takes the outer step,
      ``edgetrain.shared.sync``). The rate: one rank's at its batch.

    ``model`` is the DistributedDataParallel model (or, syncing weights, the module itself);
    ``syncs`` counts the syncs."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, sync: Sync = EVERY_STEP) -> None:
        self.model, self.optimizer, self.setting = model, optimizer, sync
        self.params = [p for p in _module(model).parameters() if p.requires_grad]
        self.size = rank_and_size()[1] if dist.is_available() and dist.is_initialized() else 1
        self.momentum = [torch.zeros_like(p) for p in self.params] if sync.outer_momentum else []
        self.anchor: list[torch.Tensor] = []
        if self.size > 1:  # every rank from rank 0's model, DDP or not
            with torch.no_grad():
                flat = self._flat(self.params)
                dist.broadcast(flat, 0)
                self._unflat(flat, self.params)
        self._anchor()
        self.pending = 0  # batches since the last sync
        self.syncs = 0

    def _anchor(self) -> None:
        if not self.setting.plain_average:
            self.anchor = [p.detach().clone() for p in self.params]

    @staticmethod
    def _flat(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
        return torch.cat([t.detach().reshape(-1) for t in tensors])

    @staticmethod
    def _unflat(flat: torch.Tensor, into: Sequence[torch.Tensor]) -> None:
        at = 0
        for t in into:
            t.copy_(flat[at:at + t.numel()].view_as(t))
            at += t.numel()

    def batch(self):
        """A context for one batch's forward and backward pass: DDP's ``no_sync`` (its allreduce of
        the gradients left out: DDP decides in the forward pass) unless this batch ends an accumulation."""
        talks = self.setting.sync_mode is SyncMode.GRADS and self.pending + 1 >= self.setting.sync_every
        return self.model.no_sync() if not talks and hasattr(self.model, "no_sync") else contextlib.nullcontext()

    def step(self) -> bool:
        """After the batch: the update (grads: only every K batches), and whether the ranks synced."""
        self.pending += 1
        if self.setting.sync_mode is SyncMode.GRADS:
            if self.pending < self.setting.sync_every:
                return False
            self._update(self.pending)
            self.pending, self.syncs = 0, self.syncs + 1
            return True
        self._update(1)
        if self.pending < self.setting.sync_every:
            return False
        self._average()
        return True

    def flush(self) -> None:
        """Sync what is pending now (at an epoch's end, before an evaluation or a checkpoint), on
        every rank: accumulated gradients allreduced by hand (their backward passes were quiet) and
        applied, or the models averaged."""
        if not self.pending:
            return
        if self.setting.sync_mode is SyncMode.WEIGHTS:
            self._average()
            return
        grads = [p.grad for p in self.params if p.grad is not None]
        if self.size > 1 and grads:
            flat = self._flat(grads)
            dist.all_reduce(flat)
            self._unflat(flat / self.size, grads)
        self._update(self.pending)
        self.pending, self.syncs = 0, self.syncs + 1

    def _update(self, batches: int) -> None:
        if batches > 1:  # the average of the batches' gradients, not their sum: the rate rule's
            for p in self.params:
                if p.grad is not None:
                    p.grad.div_(batches)
        self.optimizer.step()
        self.optimizer.zero_grad()

    @torch.no_grad()
    def _average(self) -> None:
        flat = self._flat(self.params)
        if self.size > 1:
            dist.all_reduce(flat)
            flat /= self.size
        means = [torch.empty_like(p) for p in self.params]
        self._unflat(flat, means)
        if self.setting.plain_average:
            for p, mean in zip(self.params, means, strict=True):
                p.copy_(mean)
        else:
            mu, rate = self.setting.outer_momentum, self.setting.outer_lr
            for i, (p, mean, anchor) in enumerate(zip(self.params, means, self.anchor, strict=True)):
                outer = anchor - mean  # the outer gradient: the change since the last sync, reversed
                if mu:
                    self.momentum[i].mul_(mu).add_(outer)
                    outer = outer + mu * self.momentum[i]
                anchor.sub_(rate * outer)
                p.copy_(anchor)
        self.pending, self.syncs = 0, self.syncs + 1

    def state_dict(self) -> dict:
        """What a checkpoint keeps (taken at a sync, where the anchor is the model): the outer momentum."""
        return {"momentum": [m.clone() for m in self.momentum]}

    def load_state_dict(self, state: dict) -> None:
        """A checkpoint's outer momentum, and the anchor from the model just restored."""
        # None or empty: a checkpoint of no outer momentum, which leaves this one as it is.
        # A checkpoint taken with outer momentum, resumed without it: this run keeps none.
        for m, saved in zip(self.momentum, state.get("momentum") or self.momentum, strict=False):
            m.copy_(saved)
        self._anchor()
