"""The data-parallel recipe every job shares; one process of it runs per MPI rank.

``mpirun ... python -m edgetrain.training --job lenet --run-dir DIR ...``

The contract: the learning rate is scaled by the number of ranks and warmed up; rank 0's initial
state is broadcast; each rank reads only its own shard; steps per epoch shrink with the number
of ranks; metrics are averaged over ranks; rank 0 alone writes checkpoints (atomically, with a
manifest) and metrics. Each rank's output goes to ``rank.N.log``; rank 0 also reports progress
as ``@edgetrain {json}`` lines on the stdout that mpirun forwards to the controller.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import socket
import sys
import tempfile
import time
import traceback
from pathlib import Path

# Before TensorFlow loads: its INFO lines would otherwise reach the console ahead of the rank log.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import horovod  # noqa: E402
import horovod.tensorflow as hvd_tf  # noqa: E402
import horovod.tensorflow.keras as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from . import checkpoints, datasets  # noqa: E402
from .jobs import get as get_job  # noqa: E402
from .progress import Events  # noqa: E402


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="edgetrain.training")
    p.add_argument("--job", required=True)
    p.add_argument("--run-dir", type=Path, required=True)
    p.add_argument("--data-format", required=True)
    p.add_argument("--data-files", type=Path, nargs="+", required=True)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--target-accuracy", type=float, default=None)
    p.add_argument("--warmup-epochs", type=float, default=0.25)
    p.add_argument("--resume-from", type=Path, default=None, help="checkpoint directory (read by rank 0)")
    p.add_argument("--options", type=json.loads, default={})
    return p.parse_args(argv)


def redirect_output(log: Path):
    """Send this process's stdout/stderr (TensorFlow's C++ logging included) to its rank log and
    return a stream on the original stdout."""
    log.parent.mkdir(parents=True, exist_ok=True)
    original = os.fdopen(os.dup(1), "w", buffering=1)
    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    return original


def weights_digest(model) -> str:
    h = hashlib.sha256()
    for w in model.get_weights():
        h.update(w.tobytes())
    return h.hexdigest()


def train(args: argparse.Namespace, events: Events) -> dict:
    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    # Ranks sharing a machine share its cores; TensorFlow would otherwise give each all of them.
    threads = max(1, (os.cpu_count() or 1) // hvd.local_size())
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.keras.utils.set_random_seed(args.seed)
    print(f"rank {rank}/{size} on {socket.gethostname()} (pid {os.getpid()}): {threads} TF threads, "
          f"TF {tf.__version__}, Horovod {horovod.__version__}", flush=True)

    spec = get_job(args.job)
    job = spec.load()
    options = {**spec.options, **args.options}

    files = datasets.DatasetFiles(spec.dataset, args.data_format, tuple(args.data_files), "command line")
    train_all, test_all = datasets.load(files)
    train_split = datasets.shard(train_all, rank, size)
    test_split = datasets.shard(test_all, rank, size)
    del train_all, test_all

    steps = len(train_split.y) // args.batch_size
    # Shards differ by at most one example: every rank must take the same number of steps, or
    # the allreduce of the shorter one would wait forever.
    steps = int(hvd_tf.allreduce(tf.constant(steps), op=hvd_tf.Min, name="steps"))
    val_steps = -(-len(test_split.y) // args.batch_size)
    if args.max_steps:
        steps, val_steps = min(steps, args.max_steps), min(val_steps, args.max_steps)
    if steps < 1:
        raise ValueError(f"batch size {args.batch_size} leaves no full batch in a shard of {len(train_split.y)} examples")

    net = job.model(options)
    if getattr(job, "NORMALIZE", False):
        mean = hvd_tf.allreduce(np.mean(train_split.x, dtype=np.float64), name="mean").numpy()
        var = hvd_tf.allreduce(np.var(train_split.x, dtype=np.float64), name="var").numpy()
        net = tf.keras.Sequential([tf.keras.Input((28, 28, 1)), tf.keras.layers.Normalization(mean=mean, variance=var), net])

    lr = job.BASE_LR * size
    opt = hvd.DistributedOptimizer(job.optimizer(lr))
    net.compile(optimizer=opt, loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    opt.build(net.trainable_variables)
    state = tf.train.Checkpoint(model=net, optimizer=opt)

    initial_epoch = 0
    if args.resume_from is not None and rank == 0:
        ckpt = checkpoints.read(args.resume_from)
        checkpoints.verify(ckpt)
        state.read(str(args.resume_from / "state")).assert_existing_objects_matched()
        initial_epoch = ckpt.epoch
        print(f"resumed from {args.resume_from} (epoch {ckpt.epoch}), weights sha256 {weights_digest(net)}", flush=True)
    initial_epoch = int(hvd_tf.broadcast(tf.constant(initial_epoch), 0, name="initial_epoch"))
    hvd_tf.broadcast_variables(net.variables, root_rank=0)
    hvd_tf.broadcast_variables(opt.variables(), root_rank=0)

    augment = getattr(job, "augment", None)
    train_ds = (
        tf.data.Dataset.from_tensor_slices((train_split.x, train_split.y))
        .shuffle(len(train_split.y), seed=args.seed + rank)
        .repeat()
        .batch(args.batch_size, drop_remainder=True)
    )
    if augment is not None:
        layer = augment()
        train_ds = train_ds.map(lambda x, y: (layer(x, training=True), y), num_parallel_calls=tf.data.AUTOTUNE)
    train_ds = train_ds.prefetch(tf.data.AUTOTUNE)
    test_ds = tf.data.Dataset.from_tensor_slices((test_split.x, test_split.y)).batch(args.batch_size)

    schedule = getattr(job, "lr_multiplier", lambda epoch, epochs: 1.0)

    def lr_multiplier(epoch: float) -> float:
        """Linear warmup from the single-rank rate to the scaled one, then the job's schedule.
        ``epoch`` is fractional, so both act within an epoch, which short runs need."""
        warm = 1.0 if epoch >= args.warmup_epochs else (1 + epoch * (size - 1) / args.warmup_epochs) / size
        return warm * schedule(epoch, args.epochs)

    callbacks = [
        # Averages the logs in place: every callback after it sees the cluster-wide numbers.
        hvd.callbacks.MetricAverageCallback(),
        AverageNonTrainable(),
        # Keras 2.11+ optimizers hold momentum as a float, which Horovod's momentum correction
        # cannot rescale; the rate changes gradually enough to do without it.
        hvd.callbacks.LearningRateScheduleCallback(
            initial_lr=lr, multiplier=lr_multiplier, staircase=False, steps_per_epoch=steps, momentum_correction=False
        ),
    ]
    recorder = Recorder(args, events, steps, state, spec.name)
    callbacks.append(recorder)

    events.emit("start", job=spec.name, ranks=size, epochs=args.epochs, initial_epoch=initial_epoch, steps=steps,
                versions={"tensorflow": tf.__version__, "horovod": horovod.__version__})
    net.fit(
        train_ds,
        steps_per_epoch=steps,
        epochs=args.epochs,
        initial_epoch=initial_epoch,
        validation_data=test_ds,
        validation_steps=val_steps,
        callbacks=callbacks,
        verbose=0,
    )
    digest = weights_digest(net)
    print(f"final weights sha256 {digest}", flush=True)
    result = {"weights_sha256": digest, "stopped_early": recorder.reached_target, "last": recorder.last}
    events.emit("done", **result)
    return result


class AverageNonTrainable(tf.keras.callbacks.Callback):
    """Averages non-trainable state (BatchNorm's moving statistics) over ranks before each
    validation: gradients keep the trainable weights identical, but each rank's statistics come
    from its own shard. Afterwards every rank holds the same model as rank 0's checkpoint."""

    def on_test_begin(self, logs=None):
        for v in self.model.non_trainable_variables:
            v.assign(hvd_tf.allreduce(v, op=hvd_tf.Average, name=f"sync.{v.name}"))


class Recorder(tf.keras.callbacks.Callback):
    """Per-epoch bookkeeping: progress, metrics.jsonl, checkpoints, the accuracy target."""

    def __init__(self, args: argparse.Namespace, events: Events, steps: int, state: tf.train.Checkpoint, job: str) -> None:
        super().__init__()
        self.args, self.events, self.steps, self.state, self.job = args, events, steps, state, job
        self.started = time.time()
        self.reached_target = False
        self.last: dict = {}
        self.last_emit = 0.0
        self.epoch = 0

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
        self.epoch_start = time.time()
        self.train_time = None

    def on_train_batch_end(self, batch, logs=None):
        now = time.time()
        if now - self.last_emit > 0.5 or batch + 1 == self.steps:
            self.last_emit = now
            done = (batch + 1) * self.args.batch_size * hvd.size()
            self.events.emit("step", epoch=self.epoch + 1, step=batch + 1, steps=self.steps,
                             loss=float(logs.get("loss", 0.0)), images_per_sec=done / max(now - self.epoch_start, 1e-9))

    def on_test_begin(self, logs=None):
        if self.train_time is None:
            self.train_time = time.time() - self.epoch_start

    def on_epoch_end(self, epoch, logs=None):
        train_time = self.train_time or (time.time() - self.epoch_start)
        metrics = {
            "epoch": epoch + 1,
            "loss": float(logs["loss"]),
            "accuracy": float(logs["accuracy"]),
            "val_loss": float(logs["val_loss"]),
            "val_accuracy": float(logs["val_accuracy"]),
            "images_per_sec": self.steps * self.args.batch_size * hvd.size() / train_time,
            "elapsed": time.time() - self.started,
            "lr": float(logs.get("lr", 0.0)),
            "ranks": hvd.size(),
        }
        self.last = metrics
        if hvd.rank() == 0:
            checkpoints.write(
                self.args.run_dir / "checkpoints", epoch + 1, self.job, metrics,
                lambda d: self.state.write(str(d / "state")),
                extra={"rank": 0, "options": {"batch_size": self.args.batch_size, **self.args.options}},
            )
            with open(self.args.run_dir / "metrics.jsonl", "a") as f:
                f.write(json.dumps(metrics) + "\n")
            self.events.emit("epoch", **metrics)
        if self.args.target_accuracy is not None and metrics["val_accuracy"] >= self.args.target_accuracy:
            # Every rank sees the same averaged value, so all stop after the same epoch.
            self.reached_target = True
            self.model.stop_training = True


def main(argv: list[str] | None = None) -> None:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    rank = int(os.environ.get("PMI_RANK", os.environ.get("OMPI_COMM_WORLD_RANK", "0")))
    events = Events(redirect_output(args.run_dir / f"rank.{rank}.log"), enabled=rank == 0)
    # TensorFlow's autograph writes the functions it converts to temp files that only an atexit
    # hook removes, and os._exit below skips those hooks: they go in a directory of this rank's own.
    scratch = tempfile.tempdir = tempfile.mkdtemp(prefix=f"edgetrain-rank{rank}-")
    try:
        train(args, events)
        # Every rank is done once this completes (an allreduce is a barrier): the run is complete,
        # whatever Hydra makes of the ranks' ends below.
        hvd_tf.allreduce(tf.constant(0), name="finished")
        events.emit("finished")
    except BaseException as exc:  # noqa: BLE001 - any failure must end this rank loudly
        traceback.print_exc()
        print(f"edgetrain: rank {rank} on {socket.gethostname()} failed: {type(exc).__name__}: {exc}", flush=True)
        events.emit("failed", rank=rank, host=socket.gethostname(), error=f"{type(exc).__name__}: {exc}")
        # Without MPI_Finalize, Hydra sees an abnormal exit and ends the other ranks at once.
        _exit(1, scratch)
    # Nothing is left to send or write, so the ranks end without MPI_Finalize: MPICH 4.0.2's
    # ch4:ucx can hang in it for good when two ranks of a node and ranks of other nodes talk
    # over TCP (seen on the testbed; one rank per node finalizes fine). Hydra mostly takes a rank
    # that ends with status 0 as a clean end, but now and then reports a node's second rank as
    # ended badly when the first one is gone: the launcher goes by the "finished" event instead.
    _exit(0, scratch)


def _exit(code: int, scratch: str) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    shutil.rmtree(scratch, ignore_errors=True)
    os._exit(code)


if __name__ == "__main__":
    main()
