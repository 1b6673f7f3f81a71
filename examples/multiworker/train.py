"""TensorFlow's MultiWorkerMirroredStrategy with Keras on Fashion-MNIST.

The shape of TensorFlow's "Multi-worker training with Keras" tutorial: every worker reads its
role from TF_CONFIG (edgetrain writes one per worker), the strategy is created first, the model
is built and compiled inside strategy.scope(), model.fit() runs on a dataset with a global batch
of per-worker batch x workers, and every worker saves the model - the chief (worker 0) into the
working directory, the others into a temporary directory they then delete.

    edgetrain run examples/multiworker/train.py --np 2 -- --epochs 1
    TF_CONFIG='{"cluster":{"worker":["localhost:23456","localhost:23457"]},"task":{"type":"worker","index":0}}' \
        python train.py --epochs 1 --steps-per-epoch 20      # and index 1 in a second shell
"""
import argparse
import json
import os

import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser(description='MultiWorkerMirroredStrategy Fashion-MNIST example',
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument('--epochs', type=int, default=1,
                    help='number of epochs to train')
parser.add_argument('--steps-per-epoch', type=int, default=None,
                    help='steps per epoch (default: one pass over the data with the global batch)')
parser.add_argument('--batch-size', type=int, default=64,
                    help='input batch size per worker')
parser.add_argument('--model-path', default='./keras-model',
                    help='where the chief saves the trained model')
args = parser.parse_args()

# TF_CONFIG names every worker of the cluster and this process's place in it.
tf_config = json.loads(os.environ.get('TF_CONFIG') or '{}')
num_workers = len(tf_config.get('cluster', {}).get('worker', [])) or 1

# The strategy must be created at the start of the program, before any other TensorFlow op.
communication_options = tf.distribute.experimental.CommunicationOptions(
    implementation=tf.distribute.experimental.CommunicationImplementation.RING)
strategy = tf.distribute.MultiWorkerMirroredStrategy(communication_options=communication_options)


def fashion_mnist_dataset(batch_size):
    (x_train, y_train), _ = tf.keras.datasets.fashion_mnist.load_data()
    # The `x` arrays are in uint8 and have values in the [0, 255] range.
    # You need to convert them to float32 with values in the [0, 1] range.
    x_train = x_train / np.float32(255)
    y_train = y_train.astype(np.int64)
    train_dataset = tf.data.Dataset.from_tensor_slices(
        (x_train, y_train)).shuffle(60000).repeat().batch(batch_size)
    # An in-memory dataset has no files to shard: each worker keeps its share of every global
    # batch (DATA, what AUTO falls back to with a warning).
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.DATA
    return train_dataset.with_options(options), len(x_train)


def build_and_compile_cnn_model():
    model = tf.keras.Sequential([
        tf.keras.layers.InputLayer(input_shape=(28, 28)),
        tf.keras.layers.Reshape(target_shape=(28, 28, 1)),
        tf.keras.layers.Conv2D(32, 3, activation='relu'),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(128, activation='relu'),
        tf.keras.layers.Dense(10)
    ])
    model.compile(
        loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=tf.keras.optimizers.SGD(learning_rate=0.001),
        metrics=['accuracy'])
    return model


global_batch_size = args.batch_size * num_workers
multi_worker_dataset, num_examples = fashion_mnist_dataset(global_batch_size)
steps_per_epoch = args.steps_per_epoch or num_examples // global_batch_size

with strategy.scope():
    # Model building/compiling need to be within `strategy.scope()`.
    multi_worker_model = build_and_compile_cnn_model()

multi_worker_model.fit(multi_worker_dataset, epochs=args.epochs, steps_per_epoch=steps_per_epoch)


# Saving: every worker must call save() (it is a collective), but only the chief's copy is kept.
def _is_chief(task_type, task_id):
    # Note: there are two possible `TF_CONFIG` configurations.
    #   1) In addition to `worker` tasks, a `chief` task type is use;
    #      in this case, this function should be modified to
    #      `return task_type == 'chief'`.
    #   2) Only `worker` task type is used; in this case, worker 0 is
    #      regarded as the chief. The implementation demonstrated here
    #      is for this case.
    # For the purpose of this example, the `task_type is None` case
    # is added because it is effectively run with only a single worker.
    return (task_type == 'worker' and task_id == 0) or task_type is None


def _get_temp_dir(dirpath, task_id):
    base_dirpath = 'workertemp_' + str(task_id)
    temp_dir = os.path.join(dirpath, base_dirpath)
    tf.io.gfile.makedirs(temp_dir)
    return temp_dir


def write_filepath(filepath, task_type, task_id):
    dirpath = os.path.dirname(filepath)
    base = os.path.basename(filepath)
    if not _is_chief(task_type, task_id):
        dirpath = _get_temp_dir(dirpath, task_id)
    return os.path.join(dirpath, base)


task_type, task_id = (strategy.cluster_resolver.task_type,
                      strategy.cluster_resolver.task_id)
write_model_path = write_filepath(args.model_path, task_type, task_id)

multi_worker_model.save(write_model_path)

if not _is_chief(task_type, task_id):
    tf.io.gfile.rmtree(os.path.dirname(write_model_path))
else:
    print('Saved model to', write_model_path)
