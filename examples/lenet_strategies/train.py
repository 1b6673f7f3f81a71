"""LeNet on Fashion-MNIST, trained with Horovod or with TensorFlow's MultiWorkerMirroredStrategy:
the same model, data and per-worker batch both ways, so the two can be compared.

    edgetrain run examples/lenet_strategies/train.py --np 4 -i INVENTORY -- --epochs 2
    edgetrain run examples/lenet_strategies/train.py --np 4 -i INVENTORY --strategy tf-multiworker -- --epochs 2

It also opts into edgetrain's callbacks (progress on the console, metrics.jsonl with images/s,
TensorBoard files); without edgetrain they write into the current directory.
"""

import argparse
import json
import os

import tensorflow as tf

import edgetrain.callbacks as et

parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
parser.add_argument("--epochs", type=int, default=1)
parser.add_argument("--steps-per-epoch", type=int, default=None, help="default: 60,000 / batch / workers")
parser.add_argument("--batch-size", type=int, default=64, help="per worker")
parser.add_argument("--lr", type=float, default=0.001, help="per worker; scaled by the number of workers")
args = parser.parse_args()

# TF_CONFIG is there when edgetrain runs --strategy tf-multiworker; otherwise this is a Horovod job.
multiworker = "TF_CONFIG" in os.environ
if multiworker:
    strategy = tf.distribute.MultiWorkerMirroredStrategy(
        communication_options=tf.distribute.experimental.CommunicationOptions(
            implementation=tf.distribute.experimental.CommunicationImplementation.RING))
    rank = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    size = strategy.num_replicas_in_sync
else:
    import horovod.tensorflow.keras as hvd

    hvd.init()
    rank, size = hvd.rank(), hvd.size()

(x, y), (x_test, y_test) = tf.keras.datasets.fashion_mnist.load_data()
x = (x[..., None] / 255.0).astype("float32")
x_test = (x_test[..., None] / 255.0).astype("float32")
steps = args.steps_per_epoch or len(x) // (args.batch_size * size)


def lenet() -> tf.keras.Model:
    layers = tf.keras.layers
    return tf.keras.Sequential([
        tf.keras.Input((28, 28, 1)),
        layers.Conv2D(32, 3, padding="same", activation="relu"),
        layers.MaxPooling2D(2),
        layers.Conv2D(64, 3, padding="same", activation="relu"),
        layers.MaxPooling2D(2),
        layers.Flatten(),
        layers.Dense(512, activation="relu"),
        layers.Dense(10, activation="softmax"),
    ])


if multiworker:
    # One global batch of batch x workers; each worker reads its own part of it.
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    train = (tf.data.Dataset.from_tensor_slices((x, y)).shuffle(len(x), seed=1).repeat()
             .batch(args.batch_size * size).with_options(options))
    test = tf.data.Dataset.from_tensor_slices((x_test, y_test)).batch(args.batch_size * size).with_options(options)
    with strategy.scope():
        model = lenet()
        model.compile(tf.keras.optimizers.Adam(args.lr * size), "sparse_categorical_crossentropy", metrics=["accuracy"])
    callbacks = et.callbacks(batch_size=args.batch_size)
else:
    train = tf.data.Dataset.from_tensor_slices((x[rank::size], y[rank::size])).shuffle(len(x), seed=rank).repeat().batch(args.batch_size)
    test = tf.data.Dataset.from_tensor_slices((x_test[rank::size], y_test[rank::size])).batch(args.batch_size)
    model = lenet()
    model.compile(hvd.DistributedOptimizer(tf.keras.optimizers.Adam(args.lr * size)), "sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0), hvd.callbacks.MetricAverageCallback(),
                 *et.callbacks(batch_size=args.batch_size)]

model.fit(train, steps_per_epoch=steps, epochs=args.epochs, validation_data=test, callbacks=callbacks,
          verbose=2 if rank == 0 else 0)
