"""One model trained two ways for tests/cluster/test_ps_bench.py: synchronously under Horovod, or
asynchronously under TensorFlow's ParameterServerStrategy where TF_CONFIG names parameter servers.

The model is the built-in fashion job's network, at depth 1 and width 16 by default (about LeNet's
compute an image, with a twentieth of its parameters, so a parameter server's link is not the first
limit), on Fashion-MNIST, SGD with momentum. Both ways take steps of ``--batch`` images on each
worker at the same learning rate per image: Horovod averages ``size`` workers' gradients, so its
rate is ``--lr`` times ``size`` (as Horovod's examples scale it); a parameter server applies each
worker's gradient as it comes, at ``--lr``. An epoch is ``--images`` images, however many workers
share them. After each, the chief (rank 0) scores the test set and prints ``{"event": "epoch", ...}``
with the test accuracy, the epoch's img/s and the seconds since the first step; at ``--target`` the
run stops.
"""

from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from edgetrain.rank.jobs import fashion  # noqa: E402

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=4)
p.add_argument("--depth", type=int, default=1)
p.add_argument("--width", type=int, default=16)
p.add_argument("--images", type=int, default=15000, help="images an epoch, over all workers")
p.add_argument("--batch", type=int, default=32, help="images a step on each worker")
p.add_argument("--lr", type=float, default=fashion.BASE_LR, help="at --batch images a step")
p.add_argument("--target", type=float, default=None, help="stop once the test accuracy reaches it")
args = p.parse_args()

(x, y), (xt, yt) = tf.keras.datasets.fashion_mnist.load_data()
mean, std = x.mean(), x.std()
x, xt = (((a[..., None] - mean) / std).astype(np.float32) for a in (x, xt))
y, yt = y.astype(np.int64), yt.astype(np.int64)
test = tf.data.Dataset.from_tensor_slices((xt, yt)).batch(500)
ps_tasks = json.loads(os.environ.get("TF_CONFIG", "{}")).get("cluster", {}).get("ps")


def build() -> tf.keras.Model:
    return fashion.model({"depth": args.depth, "width": args.width})


def sgd(lr: float):
    return tf.keras.optimizers.legacy.SGD(lr, momentum=0.9)


if ps_tasks:
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    workers = len(resolver.cluster_spec().as_dict()["worker"])
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    with strategy.scope():
        model = build()
        model.compile(optimizer=sgd(args.lr), loss="sparse_categorical_crossentropy", metrics=["accuracy"], steps_per_execution=10)

    def dataset_fn(context):
        data = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x)).repeat()
        return data.shard(context.num_input_pipelines, context.input_pipeline_id).batch(args.batch).prefetch(2)

    train = tf.keras.utils.experimental.DatasetCreator(dataset_fn)
    steps = args.images // args.batch  # each a batch on whichever worker takes it
    rank, fit_kw, eval_kw, initial_epoch = 0, {}, {"steps": len(xt) // 500}, 0
else:
    import horovod.tensorflow as hvd_tf
    import horovod.tensorflow.keras as hvd

    import edgetrain.callbacks as et
    from edgetrain import tracing

    hvd.init()
    workers, rank = hvd.size(), hvd.rank()
    model = build()
    # Keras' SGD, not the legacy one tf-ps needs (same update): built before rank 0 restores it,
    # every rank holds the same variables for Horovod's broadcast. The legacy optimizer makes its
    # variables lazily, and a resumed run hung in that broadcast (the ranks' variables differed).
    optimizer = tf.keras.optimizers.SGD(args.lr * workers, momentum=0.9)
    # Horovod's wrapper is a copy: it is the optimizer that trains, so it is the one checkpointed
    # and broadcast, as in the built-in job (edgetrain.rank.training).
    opt = hvd.DistributedOptimizer(optimizer)
    tracing.allreduce_without_autograph(opt)
    model.compile(optimizer=opt, loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    train = tf.data.Dataset.from_tensor_slices((x, y)).shard(workers, rank).shuffle(len(x) // workers).repeat().batch(args.batch).prefetch(2)
    steps = args.images // (args.batch * workers)  # each a batch on every worker
    # A checkpoint an epoch (edgetrain's, rank 0's), so that --max-restarts can resume the run on
    # the nodes left after one is lost; the broadcast gives every rank rank 0's restored state,
    # momentum included, before the first step.
    opt.build(model.trainable_variables)
    state = tf.train.Checkpoint(model=model, optimizer=opt)
    initial_epoch = et.restore(state)
    hvd_tf.broadcast_variables(model.variables, root_rank=0)
    hvd_tf.broadcast_variables(opt.variables(), root_rank=0)
    fit_kw, eval_kw = {"callbacks": [et.Checkpoints(state)]}, {}

first = None
for epoch in range(initial_epoch + 1, args.epochs + 1):
    start = time.monotonic()
    first = first or start
    model.fit(train, epochs=epoch, initial_epoch=epoch - 1, steps_per_epoch=steps, verbose=0, **fit_kw)
    trained = time.monotonic() - start
    _, accuracy = model.evaluate(test, verbose=0, **eval_kw)
    if rank == 0:
        print(json.dumps({"event": "epoch", "epoch": epoch, "workers": workers, "images_per_sec": steps * args.batch * (1 if ps_tasks else workers) / trained,
                          "test_accuracy": accuracy, "seconds_from_first_step": time.monotonic() - first}), flush=True)
    reached = args.target is not None and accuracy >= args.target
    if not ps_tasks:  # rank 0's verdict on every rank, so that all stop after the same epoch
        reached = bool(hvd_tf.broadcast(tf.constant(reached), 0, name="reached").numpy())
    if reached:
        break
