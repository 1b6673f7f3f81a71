"""The data-parallel recipe every job shares; one process of it runs per MPI rank.

``mpirun ... python -m edgetrain.rank.worker --module edgetrain.rank.training -- --job lenet ...``: the
worker around it handles the rank's log, its end and its failure record, as for any user script.

The contract: the learning rate is scaled by the images each update averages (ranks and accumulated
batches, or with --sync-mode weights the rank's own batch, against the job's batch;
edgetrain.shared.learning_rate) and warmed up; the ranks talk every --sync-every batches
(edgetrain.shared.sync); rank 0's initial
state is broadcast; each rank reads only its own shard, at its own batch - equal, or by its node's
speed (edgetrain.shared.batches: the global batch, the steps and the learning rate unchanged, each
rank's loss weighted so an update is the global batch's mean); steps per epoch shrink with the
number of ranks; metrics are averaged over ranks; rank 0 alone writes checkpoints (atomically, with a
manifest) and metrics, through the public callbacks API (``edgetrain.callbacks``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path

# Before TensorFlow loads: its INFO lines would otherwise reach the console ahead of the rank log.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")

import horovod
import horovod.tensorflow as hvd_tf
import horovod.tensorflow.keras as hvd
import numpy as np
import tensorflow as tf

from edgetrain import callbacks as et
from edgetrain.shared import datasets, job_options, learning_rate, runs
from edgetrain.shared.batches import Batches
from edgetrain import gpu, tracing
from edgetrain.shared.jobs import get as get_job
from edgetrain.shared.sync import Sync, SyncMode

EVAL_BATCH = 512


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="edgetrain.rank.training")
    p.add_argument("--job", required=True)
    p.add_argument("--options", type=json.loads, default={})
    job_options.add_arguments(p)
    args = p.parse_args(argv)
    spec = get_job(args.job)
    args.epochs, args.batch_size = args.epochs or spec.epochs, args.batch_size or spec.batch_size
    return args


def weights_digest(model) -> str:
    h = hashlib.sha256()
    for w in model.get_weights():
        h.update(w.tobytes())
    return h.hexdigest()


def train(args: argparse.Namespace) -> dict:
    rank, size = _set_up_rank(args)
    spec = get_job(args.job)
    job = spec.load()
    data = _shards(spec, rank, size, args)
    net = _model(job, {**spec.options, **args.options}, data.train)
    sync = job_options.sync_of(vars(args))
    # Linearly by default: for LeNet's Adam the square root, the rule often given for Adam, needed
    # as many or more images to reach its target accuracy (docs/scaling-history.md).
    peak = learning_rate.scale(size, args.batch_size, spec.batch_size, args.lr_scaling, sync)
    lr = job.BASE_LR * peak
    opt = _compiled(net, job.optimizer(lr), data, args, sync)
    sync_weights = et.SyncWeights(net, sync) if sync.sync_mode is SyncMode.WEIGHTS else None
    outer = {"sync": sync_weights.state} if sync_weights is not None and sync_weights.state is not None else {}
    state = tf.train.Checkpoint(model=net, optimizer=opt, **outer)

    initial_epoch = et.restore(state)
    if initial_epoch and rank == 0:
        print(f"resumed from {os.environ['EDGETRAIN_RESUME_FROM']} (epoch {initial_epoch}), weights sha256 {weights_digest(net)}", flush=True)
    hvd_tf.broadcast_variables(net.variables, root_rank=0)
    hvd_tf.broadcast_variables(opt.variables(), root_rank=0)

    train_ds, val_ds = _datasets(job, data, args, rank)
    progress, callbacks = _callbacks(job, state, data, val_ds, args, lr, peak, rank, sync_weights)
    net.fit(
        train_ds,
        steps_per_epoch=data.steps,
        epochs=args.epochs,
        initial_epoch=initial_epoch,
        validation_data=val_ds,
        callbacks=callbacks,
        verbose=0,
    )
    if data.test is not None:
        # The last validation averaged BatchNorm's statistics: every rank scores rank 0's model.
        test_ds = tf.data.Dataset.from_tensor_slices((data.test.x, data.test.y)).batch(EVAL_BATCH)
        progress.tested(*et.Scorer(net)(test_ds))
    digest = weights_digest(net)
    print(f"final weights sha256 {digest}", flush=True)
    return {"weights_sha256": digest, "stopped_early": progress.reached_target, "last": progress.last}


def _set_up_rank(args: argparse.Namespace) -> tuple[int, int]:
    hvd.init()
    # One GPU per rank, before TensorFlow creates anything (no-op without GPUs).
    pinned = gpu.pin_gpu(tf, hvd.local_rank())
    # Ranks sharing a machine share its cores; TensorFlow would otherwise give each all of them.
    threads = args.tf_threads or max(1, (os.cpu_count() or 1) // hvd.local_size())
    tf.config.threading.set_intra_op_parallelism_threads(threads)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.keras.utils.set_random_seed(args.seed)
    # TensorFlow's own reading, so the log shows what it will use, not what was asked.
    print(f"{tf.config.threading.get_intra_op_parallelism_threads()} TF threads, TF {tf.__version__}, Horovod {horovod.__version__}"
          + (f", {pinned}" if pinned else ""), flush=True)
    return hvd.rank(), hvd.size()


@dataclass
class _Data:
    """This rank's shards, the steps every rank takes an epoch, the validation examples it scores at
    each evaluation, and - with --holdout, when validation is held out of the training set - the
    test examples it scores once, after training."""

    train: datasets.Split
    validation: datasets.Split
    steps: int
    evaluated: int
    batches: Batches
    test: datasets.Split | None = None


def _shards(spec, rank: int, size: int, args: argparse.Namespace) -> _Data:
    # The worker points EDGETRAIN_DATA at the node's datasets (a container's mount, or the run's links).
    files = datasets.locate(spec.dataset, Path(os.environ["EDGETRAIN_DATA"]) if "EDGETRAIN_DATA" in os.environ else None)
    train_all, test_all = datasets.load(files)
    held = None
    if args.holdout:
        train_all, held = datasets.hold_out(train_all, args.holdout, args.holdout_split)
    batches = Batches.planned(args.batch_size, rank, size)
    # The training shards in proportion to the batches (equal batches: x[rank::size]); validation
    # is scored in equal shards, whose accuracies the ranks average equally.
    train_split = datasets.Split(*batches.shard(train_all.x, train_all.y))
    val_split = datasets.shard(held if held is not None else test_all, rank, size)
    # Every rank must take the same number of steps, or the allreduce of the shorter one would wait forever.
    steps = int(hvd_tf.allreduce(tf.constant(len(train_split.y) // batches.mine), op=hvd_tf.Min, name="steps"))
    evaluated = len(val_split.y)
    if args.eval_examples:
        # The count is for the whole set; rounding up keeps each rank's share of a small one non-empty.
        evaluated = min(evaluated, -(-args.eval_examples // size))
    if args.max_steps:
        steps, evaluated = min(steps, args.max_steps), min(evaluated, args.max_steps * args.batch_size)
    if steps < 1:
        raise ValueError(f"batch size {batches.mine} leaves no full batch in a shard of {len(train_split.y)} examples")
    return _Data(train_split, val_split, steps, evaluated, batches, datasets.shard(test_all, rank, size) if held is not None else None)


def _model(job, options: dict, train_split: datasets.Split):
    net = job.model(options)
    if getattr(job, "NORMALIZE", False):
        mean = hvd_tf.allreduce(np.mean(train_split.x, dtype=np.float64), name="mean").numpy()
        var = hvd_tf.allreduce(np.var(train_split.x, dtype=np.float64), name="var").numpy()
        net = tf.keras.Sequential([tf.keras.Input((28, 28, 1)), tf.keras.layers.Normalization(mean=mean, variance=var), net])
    return net


def _compiled(net, optimizer, data: _Data, args: argparse.Namespace, sync: Sync):
    """The model compiled with Horovod's optimizer around ``optimizer`` (or, syncing weights, with
    ``optimizer`` itself), built and traced once."""
    opt = et.distributed_optimizer(optimizer, sync, compression=hvd.Compression.fp16 if args.fp16_allreduce else hvd.Compression.none)
    if opt is not optimizer:
        tracing.allreduce_without_autograph(opt)
    # Several steps per call of the compiled function: Python's cost per step (Keras' loop, callbacks)
    # is paid once per execution, which a Pi-sized CPU feels (see docs/scaling-history.md).
    # Keras reports (and evaluations and weight syncs can happen) only between executions: they must
    # divide --eval-every, and --sync-every when weights are synced.
    per_call = args.steps_per_execution
    for every in (args.eval_every, sync.sync_every if sync.sync_mode is SyncMode.WEIGHTS else None):
        per_call = math.gcd(per_call, every) if every else per_call
    # Batches by speed: Horovod averages the ranks' gradients equally, so each rank's is weighted by its batch.
    net.compile(optimizer=opt, loss="sparse_categorical_crossentropy", metrics=["accuracy"],
                loss_weights=None if data.batches.even else [data.batches.weight], steps_per_execution=per_call)
    opt.build(net.trainable_variables)
    tracing.build_metrics(net, data.train.x, data.train.y)
    return opt


def _datasets(job, data: _Data, args: argparse.Namespace, rank: int):
    augment = getattr(job, "augment", None)
    train_ds = (
        tf.data.Dataset.from_tensor_slices((data.train.x, data.train.y))
        .shuffle(len(data.train.y), seed=args.seed + rank)
        .repeat()
        .batch(data.batches.mine, drop_remainder=True)
    )
    if augment is not None:
        layer = augment()
        train_ds = train_ds.map(lambda x, y: (layer(x, training=True), y), num_parallel_calls=tf.data.AUTOTUNE)
    # Evaluation keeps no gradients, so batches can be large: LeNet's forward pass on one core ran
    # about 1.7x faster at 256-1000 than at 64, with the same accuracy.
    val_ds = tf.data.Dataset.from_tensor_slices((data.validation.x[:data.evaluated], data.validation.y[:data.evaluated])).batch(EVAL_BATCH)
    return train_ds.prefetch(tf.data.AUTOTUNE), val_ds


def _callbacks(job, state, data: _Data, val_ds, args: argparse.Namespace, lr: float, peak: float, rank: int,
               sync_weights: et.SyncWeights | None):
    """The recipe's callbacks, in the order they must run, and the progress callback among them."""
    schedule = getattr(job, "lr_multiplier", lambda epoch, epochs: 1.0)

    def lr_multiplier(epoch: float) -> float:
        """The warmup, then the job's schedule. ``epoch`` is fractional, so both act within an
        epoch, which short runs need."""
        return learning_rate.warmup(epoch, peak, args.warmup_epochs) * schedule(epoch, args.epochs)

    average_non_trainable = AverageNonTrainable()

    def before_evaluation() -> None:
        # An evaluation scores one model: the ranks' own are averaged first (a sync point).
        if sync_weights is not None:
            sync_weights.sync()
        average_non_trainable.sync()

    callbacks = [
        # First: the epoch's validation and checkpoint see the ranks' averaged model.
        sync_weights,
        # Averages the logs in place: every callback after it sees the cluster-wide numbers.
        hvd.callbacks.MetricAverageCallback(),
        average_non_trainable,
        # Keras 2.11+ optimizers hold momentum as a float, which Horovod's momentum correction
        # cannot rescale; the rate changes gradually enough to do without it.
        hvd.callbacks.LearningRateScheduleCallback(
            initial_lr=lr, multiplier=lr_multiplier, staircase=False, steps_per_epoch=data.steps, momentum_correction=False
        ),
    ]
    validation_examples = int(hvd_tf.allreduce(tf.constant(data.evaluated), op=hvd_tf.Sum, name="validation_examples"))
    progress = et.Progress(args.batch_size, args.target_accuracy, validation_examples=validation_examples, batches=data.batches)
    callbacks += [
        progress,
        et.Evaluations(progress, val_ds, args.eval_every, before=before_evaluation) if args.eval_every else None,
        et.Checkpoints(state, progress, extra={"options": checkpoint_options(args)}),
        tf.keras.callbacks.TensorBoard(log_dir=str(runs.this_run().tensorboard), profile_batch=0) if rank == 0 else None,
    ]
    return progress, [c for c in callbacks if c is not None]


class AverageNonTrainable(tf.keras.callbacks.Callback):
    """Averages non-trainable state (BatchNorm's moving statistics) over ranks before each
    validation and evaluation: gradients keep the trainable weights identical, but each rank's statistics come
    from its own shard. Afterwards every rank holds the same model as rank 0's checkpoint."""

    def on_test_begin(self, logs=None):
        self.sync()

    def sync(self) -> None:
        if hvd.size() == 1:
            return  # nothing to average, and each allreduce would wait for Horovod's (long) cycle
        for v in self.model.non_trainable_variables:
            v.assign(hvd_tf.allreduce(v, op=hvd_tf.Average, name=f"sync.{v.name}"))


def checkpoint_options(args: argparse.Namespace) -> dict:
    """What a resume must repeat, as the checkpoint's manifest records it."""
    return job_options.recorded(vars(args), args.options)


def main(argv: list[str] | None = None) -> None:
    train(parse_args(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()
