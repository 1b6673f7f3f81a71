"""TensorFlow's ParameterServerStrategy with Keras model.fit on Fashion-MNIST.

The shape of TensorFlow's "Parameter server training with ParameterServerStrategy" tutorial, as
the coordinator (the chief) runs it: the cluster comes from TF_CONFIG through
TFConfigClusterResolver, the strategy shards large variables over the parameter servers, the
model is built and compiled inside strategy.scope(), and model.fit() takes a DatasetCreator whose
dataset_fn each worker runs for itself. Workers and parameter servers only run a TensorFlow
server: under edgetrain they are its own (the script runs on the chief alone), by hand they are
the tutorial's `tf.distribute.Server(...).join()`.

    edgetrain run examples/parameter_server/train.py --strategy tf-ps --np 4 --ps 1 --dataset fashion-mnist -- --epochs 1
"""
import argparse

import numpy as np
import tensorflow as tf

parser = argparse.ArgumentParser(description='ParameterServerStrategy Fashion-MNIST example',
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument('--epochs', type=int, default=1, help='number of epochs to train')
parser.add_argument('--steps-per-epoch', type=int, default=50, help='steps per epoch (model.fit needs it under this strategy)')
parser.add_argument('--batch-size', type=int, default=64, help='global batch, split over the workers')
parser.add_argument('--examples', type=int, default=6000, help='training examples the dataset function carries to the workers')
parser.add_argument('--model-path', default='./keras-model', help='where the chief saves the trained model')
args = parser.parse_args()

cluster_resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
num_ps = len(cluster_resolver.cluster_spec().as_dict().get('ps', []))
variable_partitioner = tf.distribute.experimental.partitioners.MinSizePartitioner(
    min_shard_bytes=(256 << 10), max_shards=num_ps)
strategy = tf.distribute.ParameterServerStrategy(cluster_resolver, variable_partitioner=variable_partitioner)

(x_train, y_train), (x_test, y_test) = tf.keras.datasets.fashion_mnist.load_data()
x_train = (x_train[:args.examples] / 255.0).astype(np.float32)
y_train = y_train[:args.examples].astype(np.int64)


def dataset_fn(input_context):
    """Run by each worker: its shard of the examples, batched by its share of the global batch."""
    batch = input_context.get_per_replica_batch_size(args.batch_size)
    dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(len(x_train)).repeat()
    dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    return dataset.batch(batch).prefetch(2)


def build_model():
    return tf.keras.Sequential([
        tf.keras.layers.Flatten(input_shape=(28, 28)),
        tf.keras.layers.Dense(128, activation='relu'),
        tf.keras.layers.Dense(10),
    ])


with strategy.scope():
    model = build_model()
    model.compile(optimizer=tf.keras.optimizers.legacy.SGD(0.1),
                  loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=['accuracy'], steps_per_execution=10)

model.fit(tf.keras.utils.experimental.DatasetCreator(dataset_fn), epochs=args.epochs, steps_per_epoch=args.steps_per_epoch)
# Evaluation runs on the workers too: a dataset of test batches, and how many of them.
test = tf.data.Dataset.from_tensor_slices(((x_test / 255.0).astype(np.float32), y_test.astype(np.int64))).batch(250)
loss, accuracy = model.evaluate(test, steps=len(x_test) // 250, verbose=0)
print(f'test accuracy {accuracy:.4f}')
# The variables live on the parameter servers, whose files are on their own nodes: the chief
# fetches their values and saves a model of its own (the tutorial saves to a shared file system).
saved = build_model()
saved.set_weights(model.get_weights())
saved.save(args.model_path)
