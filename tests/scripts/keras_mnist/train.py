"""MNIST through Keras' own load_data(), as users' scripts load it, then a few Horovod steps: the
bare call of the Pi-cluster article's LeNet script, or (--file-per-rank) Horovod's examples'
``load_data(path='mnist-%d.npz' % hvd.rank())``. Each rank prints what it got, for the test."""

import argparse
import hashlib
import json

import tensorflow as tf
from tensorflow import keras

import horovod.tensorflow.keras as hvd

parser = argparse.ArgumentParser()
parser.add_argument("--file-per-rank", action="store_true")
args = parser.parse_args()

hvd.init()
if args.file_per_rank:
    (x_train, y_train), (x_test, y_test) = tf.keras.datasets.mnist.load_data(path='mnist-%d.npz' % hvd.rank())
else:
    mnist = keras.datasets.mnist
    (x_train, y_train), (x_test, y_test) = mnist.load_data()

got = {name: [list(a.shape), str(a.dtype), hashlib.sha256(a.tobytes()).hexdigest()]
       for name, a in (("x_train", x_train), ("y_train", y_train), ("x_test", x_test), ("y_test", y_test))}
print("MNIST " + json.dumps({"rank": hvd.rank(), "arrays": got}), flush=True)

model = keras.Sequential([keras.layers.Flatten(input_shape=(28, 28)), keras.layers.Dense(64, activation="relu"),
                          keras.layers.Dense(10, activation="softmax")])
model.compile(optimizer=hvd.DistributedOptimizer(keras.optimizers.Adam(0.001 * hvd.size())),
              loss="sparse_categorical_crossentropy", metrics=["accuracy"])
model.fit(x_train[hvd.rank()::hvd.size()] / 255.0, y_train[hvd.rank()::hvd.size()], batch_size=64, steps_per_epoch=20,
          epochs=1, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)], verbose=2 if hvd.rank() == 0 else 0)
