"""Horovod's Keras recipe with Keras' own progress bar on rank 0 and edgetrain's Progress after
MetricAverageCallback, on random data (test fixture). Like Keras redrawing its bar, a callback
leaves a line unended when each epoch ends ("saved", then time for rank 0's output to reach the
console), so every epoch event is written onto a line the program started."""

import argparse
import time

import numpy as np
import tensorflow as tf

import horovod.tensorflow.keras as hvd
from edgetrain.callbacks import Progress

parser = argparse.ArgumentParser()
parser.add_argument("--epochs", type=int, default=4)
parser.add_argument("--batch-size", type=int, default=32)
args = parser.parse_args()


def unended_line(epoch, logs):
    if hvd.rank() == 0:
        print(f"saved epoch {epoch + 1}", end="", flush=True)
        time.sleep(0.2)


hvd.init()
rng = np.random.default_rng(hvd.rank())
x, y = rng.random((4096, 32), dtype=np.float32), rng.integers(0, 10, 4096)
model = tf.keras.Sequential([tf.keras.layers.Dense(256, activation="relu", input_shape=(32,)),
                             tf.keras.layers.Dense(10, activation="softmax")])
model.compile(loss="sparse_categorical_crossentropy", optimizer=hvd.DistributedOptimizer(tf.keras.optimizers.Adam(0.001)),
              metrics=["accuracy"])
callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback(),
             tf.keras.callbacks.LambdaCallback(on_epoch_end=unended_line), Progress(batch_size=args.batch_size)]
model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs, steps_per_epoch=60, callbacks=callbacks,
          verbose=1 if hvd.rank() == 0 else 0)
