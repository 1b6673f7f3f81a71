"""Opt-in extras for any Keras script that edgetrain runs: progress on the console, a line per
epoch in ``metrics.jsonl``, TensorBoard event files, a checkpoint per epoch with a sha256 manifest
(written by rank 0, atomically), resume, a target accuracy, and evaluations between the epochs'
own validations (``Evaluations``), each a line in ``metrics.jsonl`` that times the run to its
target. The built-in jobs use exactly this.

    import edgetrain.callbacks as et

    optimizer.build(model.trainable_variables)     # on every rank, before rank 0 restores it (below)
    state = tf.train.Checkpoint(model=model, optimizer=optimizer)
    initial_epoch = et.restore(state)              # the checkpoint `edgetrain run --resume` names, else 0
    model.fit(..., initial_epoch=initial_epoch,
              callbacks=[*horovod_callbacks, *et.callbacks(state, batch_size=64, target_accuracy=0.99)])

Outside edgetrain (no ``EDGETRAIN_RUN_DIR``) the same script still runs: files go to ``./``.

Batches by speed (``edgetrain run --batch-by speed``; with equal batches the same calls change nothing):

    plan = et.batches(args.batch_size)             # after hvd.init(); args.batch_size: the per-rank batch, as ever
    x, y = plan.shard(x_train, y_train)            # this rank's shard, in proportion to its batch
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(y)).repeat().batch(plan.mine)
    model.compile(..., loss_weights=[plan.weight]) # Horovod averages equally: weight each rank's loss
    model.fit(dataset, steps_per_epoch=plan.steps(len(x_train)), ...,
              callbacks=[..., *et.callbacks(state, batch_size=args.batch_size)])

Talking less (``edgetrain.shared.sync``, under Horovod): ``sync = Sync(sync_every=4,
sync_mode="weights")``, ``optimizer = et.distributed_optimizer(opt, sync)`` in place of
``hvd.DistributedOptimizer(opt)``, and ``sync_weights = et.SyncWeights(model, sync)`` first among
the callbacks (weights mode only; ``state`` then also holds ``sync=sync_weights.state``).

``optimizer`` is the one ``compile`` is given: under Horovod, ``hvd.DistributedOptimizer(opt)``,
not ``opt`` (Horovod's wrapper is a copy, so ``opt`` itself never trains). Build it before the
restore: a resumed run that restored Keras' legacy SGD with momentum, unbuilt, hung in Horovod's
broadcast; with Keras' SGD built first it did not.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import tensorflow as tf

from edgetrain.shared import checkpoints, mpi, runs
from edgetrain.shared.batches import Batches
from edgetrain.shared.errors import EdgetrainError
from edgetrain.shared.sync import EVERY_STEP, Sync, SyncMode
from edgetrain.shared.progress import REPORT_S, Events, rank0_events

_restored_epoch = 0


def rank_and_size() -> tuple[int, int]:
    """Horovod's rank when it is initialized, else the launcher's, else TF_CONFIG's worker index."""
    hvd = sys.modules.get("horovod.tensorflow")
    if hvd is not None and hvd.is_initialized():
        return hvd.rank(), hvd.size()
    if "EDGETRAIN_RANK" in os.environ:
        return int(os.environ["EDGETRAIN_RANK"]), mpi.rank_and_size()[1]
    config = json.loads(os.environ.get("TF_CONFIG", "{}"))
    if config:
        return int(config["task"]["index"]), len(config["cluster"]["worker"])
    return 0, 1


def _horovod():
    """Horovod's TensorFlow module, initialized: the one strategy whose exchange a script controls."""
    hvd = sys.modules.get("horovod.tensorflow")
    if hvd is None or not hvd.is_initialized():
        where = "parameter servers and MultiWorkerMirroredStrategy exchange" if "TF_CONFIG" in os.environ else "only Horovod exchanges"
        raise EdgetrainError(f"syncing every few batches needs Horovod (hvd.init() first): {where} every step inside TensorFlow",
                             "use --strategy horovod, or sync every step")
    return hvd


def distributed_optimizer(optimizer, sync: Sync = EVERY_STEP, **horovod_options):
    """What ``compile`` is given under Horovod for ``sync``: Horovod's ``DistributedOptimizer``
    around ``optimizer``, allreducing the average of ``sync_every`` batches' gradients per update
    (grads); or, for weights, ``optimizer`` itself, each rank updating its own model (SyncWeights
    averages them)."""
    if sync.sync_every > 1:
        _horovod()
    if sync.sync_mode is SyncMode.WEIGHTS:
        return optimizer
    import horovod.tensorflow.keras as hvd_keras

    # Averaged, not summed, so the accumulated update meets the rate scaled for it.
    return hvd_keras.DistributedOptimizer(optimizer, backward_passes_per_step=sync.sync_every, average_aggregated_gradients=True,
                                          **horovod_options)


class SyncWeights(tf.keras.callbacks.Callback):
    """``--sync-mode weights`` under Horovod: every ``sync_every`` local updates one grouped
    allreduce averages the ranks' trainable weights, and so before every validation and at every
    epoch's end (checkpoints, scores and a resume see one model). With an outer step the average is
    not taken as is: ``anchor - average`` (the change since the last sync) is an outer gradient, and
    ``anchor`` moves by ``outer_lr`` times it plus Nesterov momentum (DiLoCo).

    Put it first among the callbacks, before Checkpoints; ``state`` holds the outer momentum, for
    ``tf.train.Checkpoint(..., sync=this.state)`` where there is any. ``syncs`` counts the syncs."""

    def __init__(self, model: tf.keras.Model, sync: Sync) -> None:
        super().__init__()
        if sync.sync_mode is not SyncMode.WEIGHTS:
            raise ValueError(f"SyncWeights is for sync_mode weights, not {sync.sync_mode.value}")
        self.hvd = _horovod()
        self.sync_setting = sync
        self.weights = list(model.trainable_variables)
        self.anchor = [] if sync.plain_average else [tf.Variable(v, trainable=False) for v in self.weights]
        self.momentum = [tf.Variable(tf.zeros_like(v), trainable=False) for v in self.weights] if sync.outer_momentum else []
        self.state = tf.train.Checkpoint(momentum=self.momentum) if self.momentum else None
        self.pending = 0  # local updates since the last sync
        self.seen = 0  # steps of this epoch reported so far
        self.syncs = 0

    def on_train_begin(self, logs=None):
        # Every rank starts (or resumes) from rank 0's model and outer momentum, its anchor.
        self.hvd.broadcast_variables(self.weights + self.momentum, root_rank=0)
        for anchor, v in zip(self.anchor, self.weights, strict=False):  # a plain average keeps no anchor
            anchor.assign(v)

    def on_epoch_begin(self, epoch, logs=None):
        self.seen = 0

    def on_train_batch_end(self, batch, logs=None):
        # With steps_per_execution > 1 Keras reports every few steps: count the steps, not the calls.
        self.pending += batch + 1 - self.seen
        self.seen = batch + 1
        if self.pending >= self.sync_setting.sync_every:
            self.sync()

    def on_test_begin(self, logs=None):
        self.sync()

    def on_epoch_end(self, epoch, logs=None):
        self.sync()

    def sync(self) -> None:
        """Average the ranks' models (and take the outer step) if any rank has updated since the last sync.
        Every rank calls it at the same steps."""
        if not self.pending:
            return
        self.pending = 0
        self.syncs += 1
        hvd = self.hvd
        averaged = hvd.grouped_allreduce(self.weights, op=hvd.Average, name="edgetrain.sync_weights") if hvd.size() > 1 else self.weights
        if self.sync_setting.plain_average:
            for v, mean in zip(self.weights, averaged, strict=True):
                v.assign(mean)
            return
        mu, rate = self.sync_setting.outer_momentum, self.sync_setting.outer_lr
        for i, (v, mean, anchor) in enumerate(zip(self.weights, averaged, self.anchor, strict=True)):
            outer = anchor - mean
            if mu:
                self.momentum[i].assign(mu * self.momentum[i] + outer)
                outer = outer + mu * self.momentum[i]
            anchor.assign_sub(rate * outer)
            v.assign(anchor)


def batches(batch_size: int) -> Batches:
    """This rank's batch, shard and loss weight under the run's plan, for a script whose per-rank
    batch is ``batch_size``: equal batches, or with ``--batch-by speed`` each rank's in proportion to
    its node's speed, the global batch unchanged (edgetrain.shared.batches)."""
    rank, size = rank_and_size()
    return Batches.planned(batch_size, rank, size)


def events() -> Events:
    """Rank 0's progress events, on the stream the launcher reads (silent elsewhere)."""
    return rank0_events(rank_and_size()[0])


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


class _Clock:
    """Seconds of training on one clock - the wall's, or this process's CPU time (every thread of it:
    the framework's, the communication's) - leaving out the evaluations within an epoch, and the
    epoch's own validation once it begins."""

    def __init__(self, now: Callable[[], float]) -> None:
        self.now = now
        self.before = 0.0  # training in the epochs before this one
        self.start, self.evals = now(), 0.0
        self.frozen: float | None = None  # the epoch's training, once its validation began

    def epoch_begins(self) -> None:
        self.start, self.evals, self.frozen = self.now(), 0.0, None

    def evaluation(self, seconds: float) -> None:
        self.evals += seconds

    def freeze(self) -> None:
        """The epoch's training is over (its validation begins)."""
        if self.frozen is None:
            self.frozen = self.epoch()

    def epoch(self) -> float:
        return self.frozen if self.frozen is not None else self.now() - self.start - self.evals

    def total(self) -> float:
        return self.before + self.epoch()

    def epoch_ends(self) -> None:
        self.before += self.epoch()


class Progress(tf.keras.callbacks.Callback):
    """Progress events for the console (rank 0), ``metrics.jsonl``, and the accuracy target.

    Every validation - the epoch's own, and those of ``Evaluations`` - is also an ``eval`` record
    in ``metrics.jsonl``, timed from the start of the first training step of this process, so time
    to accuracy is not rounded to whole epochs and includes what the evaluations themselves cost.

    Every ``eval`` record also holds ``train_cpu_seconds``, under Horovod: the CPU time every rank's
    process spent training so far (all its threads, communication included), summed over the ranks.

    Put it after Horovod's MetricAverageCallback, which averages the logs over ranks in place, and on
    every rank: its stop at the target and its CPU sum are the ranks' together.

    ``batch_size`` is the per-rank batch the script was given (with batches by speed, the global
    batch over the ranks); the start event names every rank's batch where they differ."""

    def __init__(self, batch_size: int | None = None, target_accuracy: float | None = None, monitor: str = "val_accuracy",
                 validation_examples: int | None = None, batches: Batches | None = None) -> None:
        super().__init__()
        self.rank, self.size = rank_and_size()
        self.batches = batches or (Batches.planned(batch_size, self.rank, self.size) if batch_size else None)
        self.events = events()
        self.global_batch = batch_size * self.size if batch_size else None
        self.target, self.monitor = target_accuracy, monitor
        self.validation_examples = validation_examples
        self.started = time.time()
        self.first_step: float | None = None
        self.wall, self.cpu = _Clock(time.time), _Clock(time.process_time)
        self.reached_target = False
        self.last: dict = {}
        self.last_emit = 0.0

    def on_train_begin(self, logs=None):
        self.steps = self.params.get("steps") or 0
        uneven = {"batches": list(self.batches.sizes)} if self.batches and not self.batches.even else {}
        self.events.emit("start", job=runs.job_name(), ranks=self.size, epochs=self.params.get("epochs"),
                         initial_epoch=_restored_epoch, steps=self.steps,
                         versions=_versions(), **uneven)

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch
        self.wall.epoch_begins()
        self.cpu.epoch_begins()
        self.steps_done, self.test_start, self.evaluated_at = 0, None, None

    def on_train_batch_begin(self, batch, logs=None):
        if self.first_step is None:
            self.first_step = time.time()

    def on_train_batch_end(self, batch, logs=None):
        self.steps_done = batch + 1
        now = time.time()
        if now - self.last_emit > REPORT_S or batch + 1 == self.steps:
            self.last_emit = now
            ips = (batch + 1) * self.global_batch / max(self.wall.epoch(), 1e-9) if self.global_batch else None
            self.events.emit("step", epoch=self.epoch + 1, step=batch + 1, steps=self.steps,
                             loss=float((logs or {}).get("loss", 0.0)), images_per_sec=ips)

    def on_test_begin(self, logs=None):
        self.test_start = time.time()
        if hasattr(self, "epoch"):  # a validation in fit, not a model.evaluate() of its own
            self.wall.freeze()
            self.cpu.freeze()

    def on_test_end(self, logs=None):
        self.test_seconds = time.time() - (self.test_start or time.time())

    def train_seconds(self) -> float:
        """Seconds spent in training steps so far: no evaluation, nothing between epochs (checkpoints)."""
        return self.wall.total()

    def train_cpu_seconds(self) -> float | None:
        """CPU seconds every rank's process spent training so far, summed (all their threads, the
        communication's included), under Horovod; None elsewhere, where no collective sums them.
        Every rank must call it at the same point."""
        hvd = sys.modules.get("horovod.tensorflow")
        if hvd is None or not hvd.is_initialized():
            return None
        return float(hvd.allreduce(tf.constant(self.cpu.total(), tf.float64), op=hvd.Sum, name="edgetrain.train_cpu"))

    def on_epoch_end(self, epoch, logs=None):
        train_time = self.wall.epoch()
        metrics = {"epoch": epoch + 1, **{k: float(v) for k, v in (logs or {}).items() if _number(v)}}
        if self.global_batch and self.steps_done:
            # An epoch cut short by the target counts only the steps it took.
            metrics["images_per_sec"] = self.steps_done * self.global_batch / train_time
        metrics.update(elapsed=time.time() - self.started, ranks=self.size)
        self.last = metrics
        if self.rank == 0:
            self._append(metrics)
            self.events.emit("epoch", **metrics)
        # After a stop at the target, the epoch's validation repeats the evaluation that stopped it.
        if self.test_start is not None and "val_accuracy" in metrics and self.evaluated_at != self.steps_done:
            self.evaluated(metrics["val_accuracy"], metrics.get("val_loss"), self.test_seconds, self.validation_examples)
        self.wall.epoch_ends()
        self.cpu.epoch_ends()
        if self.monitor != "val_accuracy" and self.target is not None and runs.reaches(metrics.get(self.monitor, -1.0), self.target):
            self._stop()

    def evaluated(self, val_accuracy: float, val_loss: float | None, seconds: float, examples: int | None) -> None:
        """Record an evaluation of the model as it is after this epoch's ``steps_done`` steps (the
        same figures on every rank), and stop training once it reaches the target."""
        reached = (self.target is not None and self.monitor == "val_accuracy" and not self.reached_target
                   and runs.reaches(val_accuracy, self.target))
        record = {"kind": "eval", "epoch": self.epoch + 1, "step": self.steps_done,
                  "seconds": time.time() - (self.first_step or self.started), "train_seconds": self.train_seconds(),
                  "images": ((self.epoch * self.steps) + self.steps_done) * (self.global_batch or 0) or None,
                  "val_accuracy": float(val_accuracy), "val_loss": None if val_loss is None else float(val_loss),
                  "eval_seconds": seconds, "examples": examples, "ranks": self.size}
        cpu = self.train_cpu_seconds()
        if cpu is not None:
            record["train_cpu_seconds"] = cpu
        if _restored_epoch:
            record["resumed_after_epoch"] = _restored_epoch  # the clock restarted with the resume
        if self.target is not None:
            record.update(target_accuracy=self.target, reached=reached)
        self.evaluated_at = self.steps_done
        if self.rank == 0:
            self._append(record)
            self.events.emit("eval", **record)
        if reached:
            self._stop()

    def tested(self, accuracy: float, loss: float, examples: int) -> None:
        """Record the test set's score, taken once after training (the validation set was held out
        of the training set, and every decision was made on it)."""
        record = {"kind": "test", "test_accuracy": accuracy, "test_loss": loss, "examples": examples,
                  "after_epoch": self.epoch + 1, "step": self.steps_done}
        if self.rank == 0:
            self._append(record)
            print(f"test accuracy {accuracy:.4f} ({examples:,} test examples, scored once after training)", flush=True)

    def _stop(self) -> None:
        # Averaged metrics are the same on every rank, so all ranks stop after the same step.
        self.reached_target = True
        self.model.stop_training = True

    def _append(self, record: dict) -> None:
        runs.this_run().append_metrics([record])


class Evaluations(tf.keras.callbacks.Callback):
    """Evaluates the model on ``data`` (each rank its own shard) every ``every`` training steps of
    each epoch, and hands the rank-averaged accuracy and loss to ``progress``, which records them
    and stops at the target. The count starts again with each epoch, whose last step is left to its
    own validation (``fit(validation_data=...)``): counted across epochs, a multiple falling a few
    steps before an epoch's end was evaluated twice, there and at the end.

    For classifiers with integer labels and a probability output, as the built-in jobs are.
    ``before`` runs ahead of each evaluation on every rank (the jobs average BatchNorm's statistics)."""

    def __init__(self, progress: Progress, data: tf.data.Dataset, every: int, before=None) -> None:
        super().__init__()
        self.progress, self.data, self.every, self.before = progress, data, every, before
        self.done = 0  # steps of this epoch when last called

    def set_model(self, model):
        super().set_model(model)
        self.score = Scorer(model)

    def on_epoch_begin(self, epoch, logs=None):
        self.done = 0

    def on_train_batch_end(self, batch, logs=None):
        done = batch + 1
        # With steps_per_execution > 1 Keras reports every few steps: evaluate on passing a multiple.
        passed = done // self.every > self.done // self.every
        self.done = done
        if not passed or done == self.progress.steps:
            return
        start, cpu = time.time(), time.process_time()
        if self.before is not None:
            self.before()
        accuracy, mean_loss, total = self.score(self.data)
        took = time.time() - start
        self.progress.wall.evaluation(took)
        self.progress.cpu.evaluation(time.process_time() - cpu)
        self.progress.evaluated(accuracy, mean_loss, took, total)


class Scorer:
    """A compiled model's accuracy and mean loss on a dataset (each rank its own shard), averaged
    over the ranks, and the examples scored in all."""

    def __init__(self, model) -> None:
        loss = tf.keras.losses.get(model.loss)
        per_example = loss.call if isinstance(loss, tf.keras.losses.Loss) else loss

        # One compiled function for every batch; only the last, shorter batch traces it again.
        @tf.function(reduce_retracing=True)
        def batch_sums(x, y):
            p = model(x, training=False)
            return (tf.reduce_sum(tf.keras.metrics.sparse_categorical_accuracy(y, p)),
                    tf.reduce_sum(per_example(y, p)), tf.shape(y)[0])

        self.batch_sums = batch_sums

    def __call__(self, data: tf.data.Dataset) -> tuple[float, float, int]:
        correct = loss = 0.0
        count = 0
        for x, y in data:
            c, lsum, n = self.batch_sums(x, y)
            correct, loss, count = correct + float(c), loss + float(lsum), count + int(n)
        averages = tf.constant([correct / max(count, 1), loss / max(count, 1)], tf.float64)
        total = count
        hvd = sys.modules.get("horovod.tensorflow")
        if hvd is not None and hvd.is_initialized():
            averages = hvd.allreduce(averages, op=hvd.Average, name="edgetrain.eval")
            total = int(hvd.allreduce(tf.constant(count, tf.int64), op=hvd.Sum, name="edgetrain.eval_examples"))
        accuracy, mean_loss = (float(v) for v in averages.numpy())
        return accuracy, mean_loss, total


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
        checkpoints.write(runs.this_run().checkpoints, epoch + 1, runs.job_name(), metrics,
                          lambda d: self.state.write(str(d / "state")), extra={"rank": 0, **self.extra})


def callbacks(state: tf.train.Checkpoint | None = None, *, batch_size: int | None = None,
              target_accuracy: float | None = None, tensorboard: bool = True, extra: dict | None = None) -> list:
    """Progress and metrics; with ``state``, a checkpoint per epoch; TensorBoard files on rank 0."""
    progress = Progress(batch_size, target_accuracy)
    found: list = [progress]
    if state is not None:
        found.append(Checkpoints(state, progress, extra))
    if tensorboard and progress.rank == 0:
        found.append(tf.keras.callbacks.TensorBoard(log_dir=str(runs.this_run().tensorboard), profile_batch=0))
    return found
