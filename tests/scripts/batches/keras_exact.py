"""Two Horovod ranks train a model without batch statistics by speed (batches from
EDGETRAIN_RANK_SPEEDS) through edgetrain.callbacks' plan, as a Keras script would; rank 0 then trains
the same start on one process, on the union of the ranks' batches at each step, and prints how far
apart the weights are - with the loss weight, and without it (which must not match)."""

import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import horovod.tensorflow.keras as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import edgetrain.callbacks as et  # noqa: E402
from edgetrain.shared.batches import Batches  # noqa: E402

# Steps, and the per-rank batch (2 unless given: a global batch of 4 on 2 ranks).
STEPS, PER_RANK = int(sys.argv[1]), int(sys.argv[2]) if len(sys.argv) > 2 else 2
hvd.init()
tf.config.threading.set_intra_op_parallelism_threads(1)
rng = np.random.default_rng(0)
x = rng.normal(size=(64, 6)).astype("float32")
y = rng.integers(0, 3, size=64)


def model() -> tf.keras.Model:
    tf.keras.utils.set_random_seed(1)
    return tf.keras.Sequential([tf.keras.Input((6,)), tf.keras.layers.Dense(5, activation="tanh"), tf.keras.layers.Dense(3, activation="softmax")])


def distributed(plan: Batches, weighted: bool) -> list[np.ndarray]:
    net = model()
    xs, ys = plan.shard(x, y)
    data = tf.data.Dataset.from_tensor_slices((xs, ys)).repeat().batch(plan.mine)
    net.compile(optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.Adam(0.05)), loss="sparse_categorical_crossentropy",
                loss_weights=[plan.weight] if weighted else None)
    net.fit(data, steps_per_epoch=STEPS, epochs=1, verbose=0,
            callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0), *et.callbacks(batch_size=PER_RANK, tensorboard=False)])
    return net.get_weights()


def union(plan: Batches) -> list[np.ndarray]:
    """One process, one optimizer, each step's batch the ranks' batches of that step together."""
    shards = [Batches(plan.sizes, r).indices(len(y)) for r in range(len(plan.sizes))]
    order = [i for k in range(STEPS) for r, b in enumerate(plan.sizes) for i in shards[r][k * b:(k + 1) * b]]
    net = model()
    net.compile(optimizer=tf.keras.optimizers.Adam(0.05), loss="sparse_categorical_crossentropy")
    net.fit(x[order], y[order], batch_size=plan.total, epochs=1, shuffle=False, verbose=0)
    return net.get_weights()


plan = et.batches(PER_RANK)
weighted, unweighted = distributed(plan, True), distributed(plan, False)
if hvd.rank() == 0:
    reference = union(plan)
    far = lambda ws: max(float(np.max(np.abs(a - b))) for a, b in zip(ws, reference))  # noqa: E731
    print(f"batches {plan.describe()} weighted {far(weighted):.3g} unweighted {far(unweighted):.3g}", flush=True)
