"""Horovod's Keras recipe talking every --every steps through edgetrain.callbacks (test fixture):
every rank prints its weights' digest after each step, so a test sees when the ranks agree and
when the weights move. Each rank trains on data of its own, from the same initial weights."""

import argparse
import hashlib

import numpy as np
import tensorflow as tf

import horovod.tensorflow.keras as hvd
import edgetrain.callbacks as et
from edgetrain.shared.sync import Sync, SyncMode

parser = argparse.ArgumentParser()
parser.add_argument("--every", type=int, default=4)
parser.add_argument("--mode", default="weights")
parser.add_argument("--outer-lr", type=float, default=1.0)
parser.add_argument("--outer-momentum", type=float, default=0.0)
parser.add_argument("--steps", type=int, default=12)
args = parser.parse_args()

hvd.init()
tf.keras.utils.set_random_seed(0)  # the same initial weights on every rank
rng = np.random.default_rng(hvd.rank())
x, y = rng.random((4096, 32), dtype=np.float32), rng.integers(0, 10, 4096)
model = tf.keras.Sequential([tf.keras.layers.Dense(64, activation="relu", input_shape=(32,)),
                             tf.keras.layers.Dense(10, activation="softmax")])
sync = Sync(args.every, args.mode, args.outer_lr, args.outer_momentum)
model.compile(loss="sparse_categorical_crossentropy", optimizer=et.distributed_optimizer(tf.keras.optimizers.SGD(0.05), sync))


def digest(batch, logs=None):
    h = hashlib.sha256()
    for w in model.get_weights():
        h.update(w.tobytes())
    print(f"step {batch + 1} digest {h.hexdigest()}", flush=True)


callbacks = [et.SyncWeights(model, sync)] if sync.sync_mode is SyncMode.WEIGHTS else []
model.fit(x, y, batch_size=32, epochs=1, steps_per_epoch=args.steps, verbose=0,
          callbacks=[*callbacks, tf.keras.callbacks.LambdaCallback(on_train_batch_end=digest)])
