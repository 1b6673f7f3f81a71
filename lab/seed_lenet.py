"""The seed-style Pi-cluster LeNet recipe, nothing tuned: the reference edgetrain is measured against.

``hvd.init()``; LeNet; ``Adam(0.001 * hvd.size())`` in ``hvd.DistributedOptimizer``;
``BroadcastGlobalVariablesCallback(0)``; ``model.fit`` on the full arrays with batch 64 and the
steps per epoch divided by the size; started by a plain ``mpirun``. The only additions are
measurements printed by rank 0 as JSON lines (they do not change what is trained):
``{"event": "epoch", ...}`` with the epoch's img/s and the validation accuracy (each rank
evaluates the whole test set, as the recipe does) and the seconds since the first step.

``--batch 32 --rank-steps 500 --holdout 6000``: the seed's own script (Keras' default batch,
``steps_per_epoch=500`` on every rank whatever the size, no validation) trained on the training set
less a held-out split, which it never looks at: every rank judges its weights on that split off the
clock, every ``--judge-every`` steps and at each epoch's end (``{"event": "judged", ...}``), and the
judging's seconds are taken out of every figure, so the clock holds the seed's training alone and
the judgements show when a once-an-epoch check could first have seen the target, and when a finer
one could.

``--calibrate``: the same ``fit`` in one process, epoch after epoch of ``--steps-per-epoch`` steps
with no validation: after the first (warm-up) epoch it prints ``ready``, and after each later one
its img/s, each time waiting for a ``measure`` line on stdin; the testbed changes the process's
CPU quota in between (see emulation.py).

``--stand-in``: the same ``fit`` in one process, for ever, printing nothing: what an emulated node
runs while it has no training of its own (see standin.py).
"""

from __future__ import annotations

import argparse
import atexit
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from edgetrain.shared import tempdirs

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# TensorFlow's autograph writes files to the temp directory that only an atexit hook removes, and
# the testbed ends stand-ins and calibrations with SIGKILL: they go in a directory of this process's
# own (of the kind standin.SCRATCH names), which whoever kills it removes (standin.stop).
tempfile.tempdir = tempdirs.make("seed")
atexit.register(shutil.rmtree, tempfile.tempdir, True)

import horovod.tensorflow.keras as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from edgetrain.shared import datasets  # noqa: E402
from edgetrain.rank.jobs.lenet import model as lenet  # noqa: E402 - the same network as the built-in job

BATCH = 64  # the recipe's; the seed's own script left Keras' default of 32 (--batch)


def compiled() -> tf.keras.Model:
    model = lenet({})
    opt = hvd.DistributedOptimizer(tf.keras.optimizers.Adam(0.001 * hvd.size()))
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


class Measure(tf.keras.callbacks.Callback):
    """img/s of each epoch's training steps (validation and judging excluded), and the seconds of
    training since the first step."""

    def __init__(self, steps: int, batch: int = BATCH, stop_at: float | None = None, judge: Judge | None = None):
        super().__init__()
        self.steps, self.batch, self.stop_at, self.judge = steps, batch, stop_at, judge
        self.first: float | None = None
        self.epoch_start = 0.0
        self.train_end: float | None = None
        self.off = self.epoch_off = 0.0  # seconds spent judging, in all and in this epoch
        self.done = 0  # this rank's steps so far

    def on_train_batch_begin(self, batch, logs=None):
        if self.first is None:
            self.first = time.monotonic()

    def on_train_batch_end(self, batch, logs=None):
        self.done += 1
        if self.judge and self.done % self.judge.every == 0 and batch + 1 < self.steps:
            self._judge(False)

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch_start = time.monotonic()
        self.train_end = None
        self.epoch_off = 0.0

    def on_test_begin(self, logs=None):
        self.train_end = time.monotonic()

    def seconds(self) -> float:
        now = time.monotonic()
        return now - (self.first if self.first is not None else now) - self.off

    def images_per_sec(self) -> float:
        end = self.train_end or time.monotonic()
        return self.steps * self.batch * hvd.size() / (end - self.epoch_start - self.epoch_off)

    def _judge(self, epoch_end: bool) -> float:
        start, seconds = time.monotonic(), self.seconds()
        assert self.judge is not None  # called only where one judges
        accuracy = self.judge.accuracy(self.model)
        if hvd.rank() == 0:
            print(json.dumps({"event": "judged", "images": self.done * self.batch * hvd.size(), "epoch_end": epoch_end,
                              "held_out_accuracy": accuracy, "seconds_from_first_step": seconds}), flush=True)
        spent = time.monotonic() - start
        self.off += spent
        self.epoch_off += spent
        return accuracy

    def on_epoch_end(self, epoch, logs=None):
        if self.train_end is None:  # no validation: the epoch's training ends here
            self.train_end = time.monotonic()
        if hvd.rank() == 0:
            print(json.dumps({
                "event": "epoch", "epoch": epoch + 1, "size": hvd.size(), "images_per_sec": self.images_per_sec(),
                "val_accuracy": logs.get("val_accuracy"), "seconds_from_first_step": self.seconds(),
            }), flush=True)
        # Every rank scores the same weights on the same images, so all stop after the same epoch.
        accuracy = self._judge(True) if self.judge else logs.get("val_accuracy", 0)
        if self.stop_at is not None and accuracy >= self.stop_at:
            self.model.stop_training = True


class Judge:
    """The held-out split's accuracy of the model's weights, every ``every`` steps of a rank."""

    def __init__(self, x: np.ndarray, y: np.ndarray, every: int):
        self.x, self.y, self.every = x, y, every

    def accuracy(self, model: tf.keras.Model) -> float:
        right = sum(int(np.sum(np.argmax(model(self.x[i:i + 1000], training=False).numpy(), axis=1) == self.y[i:i + 1000]))
                    for i in range(0, len(self.y), 1000))
        return right / len(self.y)


class Calibrate(Measure):
    """Between epochs, waits for the next ``measure`` line on stdin (the quota changes meanwhile)."""

    def on_epoch_end(self, epoch, logs=None):
        event = {"event": "measured", "images_per_sec": self.images_per_sec()} if epoch else {"event": "ready", "pid": os.getpid()}
        print(json.dumps(event), flush=True)
        if not sys.stdin.readline().startswith("measure"):
            self.model.stop_training = True


def train(args: argparse.Namespace) -> None:
    hvd.init()
    (x, y), (xt, yt) = load(args.data)
    model = compiled()
    steps = args.rank_steps or (args.steps_per_epoch or len(x) // args.batch) // hvd.size()
    judge = validation = None
    if args.holdout:
        rest, held = datasets.hold_out(datasets.Split(x, y), args.holdout, args.holdout_split)
        (x, y), judge = (rest.x, rest.y), Judge(held.x, held.y, args.judge_every or steps)
    else:
        validation = (xt[:args.validation_images], yt[:args.validation_images])
    model.fit(x, y, batch_size=args.batch, epochs=args.epochs, steps_per_epoch=steps, validation_data=validation,
              callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), Measure(steps, args.batch, args.stop_at_accuracy, judge)],
              verbose=0)


def calibrate(args: argparse.Namespace) -> None:
    """The same ``fit`` as training, one epoch of ``--steps-per-epoch`` steps per measurement."""
    hvd.init()
    (x, y), _ = load(args.data)
    model = compiled()
    steps = args.steps_per_epoch or 40
    model.fit(x, y, batch_size=BATCH, epochs=10_000, steps_per_epoch=steps, callbacks=[Calibrate(steps)], verbose=0)


def stand_in(args: argparse.Namespace) -> None:
    hvd.init()
    (x, y), _ = load(args.data)
    compiled().fit(x, y, batch_size=BATCH, epochs=10**9, steps_per_epoch=100, verbose=0)


def load(data: Path | None):
    train_split, test_split = datasets.load(datasets.locate("mnist", data))
    return (train_split.x, train_split.y), (test_split.x, test_split.y)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", type=Path, default=None, help="a folder holding mnist/ (default: this machine's)")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--steps-per-epoch", type=int, default=None, help="global steps an epoch (default: the whole set)")
    p.add_argument("--rank-steps", type=int, default=None, help="steps an epoch on every rank, whatever the size "
                   "(the seed's own steps_per_epoch=500)")
    p.add_argument("--batch", type=int, default=BATCH, help=f"per rank (default: {BATCH}, the recipe's)")
    p.add_argument("--holdout", type=int, default=None, help="train on the rest of the training set and judge these "
                   "examples off the clock instead of validating on the test set")
    p.add_argument("--holdout-split", type=int, default=datasets.HOLDOUT_SPLIT, help="which examples --holdout keeps "
                   f"apart (edgetrain run's --holdout-split; {datasets.TUNED_SPLIT}: the split the schedule was tuned on)")
    p.add_argument("--judge-every", type=int, default=None, help="with --holdout: steps of a rank between judgements "
                   "(default: each epoch's end only; the epoch's end is always judged)")
    p.add_argument("--validation-images", type=int, default=None,
                   help="the first N test images validate each epoch (default: all, as the recipe does)")
    p.add_argument("--stop-at-accuracy", type=float, default=None,
                   help="end after the epoch whose validation (or judgement) reaches this (what timing it to a target needs)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--calibrate", action="store_true")
    mode.add_argument("--stand-in", action="store_true")
    args = p.parse_args()
    np.random.seed(42)
    (calibrate if args.calibrate else stand_in if args.stand_in else train)(args)


if __name__ == "__main__":
    main()
