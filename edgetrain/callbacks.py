"""Opt-in extras for any Keras script that edgetrain runs: progress on the console, a line per
epoch in ``metrics.jsonl``, TensorBoard event files, a checkpoint per epoch with a sha256 manifest
(written by rank 0, atomically), resume, and a target accuracy. The built-in jobs use exactly this.

    import edgetrain.callbacks as et

    state = tf.train.Checkpoint(model=model, optimizer=optimizer)
    initial_epoch = et.restore(state)              # the checkpoint `edgetrain run --resume` names, else 0
    model.fit(..., initial_epoch=initial_epoch,
              callbacks=[*horovod_callbacks, *et.callbacks(state, batch_size=64, target_accuracy=0.99)])

Outside edgetrain (no ``EDGETRAIN_RUN_DIR``) the same script still runs: files go to ``./``.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import tensorflow as tf

from . import checkpoints
from .progress import Events

_restored_epoch = 0


def run_dir() -> Path:
    return Path(os.environ.get("EDGETRAIN_RUN_DIR", "."))


def rank_and_size() -> tuple[int, int]:
    """Horovod's rank when it is initialized, else the launcher's, else TF_CONFIG's worker index."""
    hvd = sys.modules.get("horovod.tensorflow")
    if hvd is not None and hvd.is_initialized():
        return hvd.rank(), hvd.size()
    if "EDGETRAIN_RANK" in os.environ:
        return int(os.environ["EDGETRAIN_RANK"]), int(os.environ.get("PMI_SIZE", "1"))
    config = json.loads(os.environ.get("TF_CONFIG", "{}"))
    if config:
        return int(config["task"]["index"]), len(config["cluster"]["worker"])
    return 0, 1


def events() -> Events:
    """Rank 0's progress events, on the stream the launcher reads (silent elsewhere)."""
    rank, _ = rank_and_size()
    fd = os.environ.get("EDGETRAIN_EVENTS_FD")
    if rank != 0 or fd is None:
        return Events(sys.stdout, enabled=False)
    return Events(os.fdopen(int(fd), "w", buffering=1, closefd=False), enabled=True)


def job_name() -> str:
    return os.environ.get("EDGETRAIN_JOB") or Path(sys.argv[0]).stem


def restore(state: tf.train.Checkpoint) -> int:
    """Load the checkpoint of a resumed run into ``state`` on rank 0 (its files verified against
    the manifest first) and return the epoch to start from, the same on every rank. Horovod's
    broadcast callback (or the caller) then gives every rank rank 0's state."""
    global _restored_epoch
    rank, _ = rank_and_size()
    epoch = 0
    source = os.environ.get("EDGETRAIN_RESUME_FROM")
    if source and rank == 0:
        ckpt = checkpoints.read(Path(source))
        checkpoints.verify(ckpt)
        state.read(str(Path(source) / "state")).assert_existing_objects_matched()
        epoch = ckpt.epoch
        print(f"resumed from {source} (epoch {epoch})", flush=True)
    hvd = sys.modules.get("horovod.tensorflow")
    if hvd is not None and hvd.is_initialized():
        epoch = int(hvd.broadcast(tf.constant(epoch), 0, name="edgetrain.initial_epoch"))
    _restored_epoch = epoch
    return epoch


class Progress(tf.keras.callbacks.Callback):
    """Progress events for the console (rank 0), ``metrics.jsonl``, and the accuracy target.

    Put it after Horovod's MetricAverageCallback, which averages the logs over ranks in place."""

    def __init__(self, batch_size: int | None = None, target_accuracy: float | None = None, monitor: str = "val_accuracy") -> None:
        super().__init__()
        self.rank, self.size = rank_and_size()
        self.events = events()
        self.global_batch = batch_size * self.size if batch_size else None
        self.target, self.monitor = target_accuracy, monitor
        self.started = time.time()
        self.reached_target = False
        self.last: dict = {}
        self.last_emit = 0.0

    def on_train_begin(self, logs=None):
        self.steps = self.params.get("steps") or 0
        self.events.emit("start", job=job_name(), ranks=self.size, epochs=self.params.get("epochs"),
                         initial_epoch=_restored_epoch, steps=self.steps,
                         versions=_versions())

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch, self.epoch_start, self.train_time = epoch, time.time(), None

    def on_train_batch_end(self, batch, logs=None):
        now = time.time()
        if now - self.last_emit > 0.5 or batch + 1 == self.steps:
            self.last_emit = now
            ips = (batch + 1) * self.global_batch / max(now - self.epoch_start, 1e-9) if self.global_batch else None
            self.events.emit("step", epoch=self.epoch + 1, step=batch + 1, steps=self.steps,
                             loss=float((logs or {}).get("loss", 0.0)), images_per_sec=ips)

    def on_test_begin(self, logs=None):
        if getattr(self, "train_time", 0) is None:
            self.train_time = time.time() - self.epoch_start

    def on_epoch_end(self, epoch, logs=None):
        train_time = self.train_time or (time.time() - self.epoch_start)
        metrics = {"epoch": epoch + 1, **{k: float(v) for k, v in (logs or {}).items() if _number(v)}}
        if self.global_batch and self.steps:
            metrics["images_per_sec"] = self.steps * self.global_batch / train_time
        metrics.update(elapsed=time.time() - self.started, ranks=self.size)
        self.last = metrics
        if self.rank == 0:
            with open(run_dir() / "metrics.jsonl", "a") as f:
                f.write(json.dumps(metrics) + "\n")
            self.events.emit("epoch", **metrics)
        if self.target is not None and metrics.get(self.monitor, -1.0) >= self.target:
            # Averaged metrics are the same on every rank, so all ranks stop after the same epoch.
            self.reached_target = True
            self.model.stop_training = True


def _versions() -> dict:
    found = {"tensorflow": tf.__version__}
    if "horovod" in sys.modules:
        found["horovod"] = sys.modules["horovod"].__version__
    return found


def _number(v) -> bool:
    try:
        float(v)
        return True
    except (TypeError, ValueError):
        return False


class Checkpoints(tf.keras.callbacks.Callback):
    """After every epoch, rank 0 writes ``checkpoints/epoch-NNNN/`` (the ``tf.train.Checkpoint``'s
    files and a manifest with their sha256), assembled under a temporary name and renamed into place."""

    def __init__(self, state: tf.train.Checkpoint, progress: Progress | None = None, extra: dict | None = None) -> None:
        super().__init__()
        self.state, self.progress, self.extra = state, progress, extra or {}
        self.rank, _ = rank_and_size()

    def on_epoch_end(self, epoch, logs=None):
        if self.rank != 0:
            return
        metrics = self.progress.last if self.progress else {"epoch": epoch + 1}
        checkpoints.write(run_dir() / "checkpoints", epoch + 1, job_name(), metrics,
                          lambda d: self.state.write(str(d / "state")), extra={"rank": 0, **self.extra})


def callbacks(state: tf.train.Checkpoint | None = None, *, batch_size: int | None = None,
              target_accuracy: float | None = None, tensorboard: bool = True, extra: dict | None = None) -> list:
    """Progress and metrics; with ``state``, a checkpoint per epoch; TensorBoard files on rank 0."""
    progress = Progress(batch_size, target_accuracy)
    found: list = [progress]
    if state is not None:
        found.append(Checkpoints(state, progress, extra))
    if tensorboard and progress.rank == 0:
        found.append(tf.keras.callbacks.TensorBoard(log_dir=str(run_dir() / "tensorboard"), profile_batch=0))
    return found
