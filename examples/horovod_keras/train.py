"""Horovod + Keras on Fashion-MNIST.

The shape of Horovod's examples/tensorflow2/tensorflow2_keras_mnist.py and of its Fashion-MNIST
lab: hvd.init(), one GPU per local rank, the learning rate scaled by hvd.size() and wrapped in
hvd.DistributedOptimizer, rank 0's weights broadcast to every rank, metrics averaged over ranks,
a learning-rate warmup, and checkpoints written by rank 0 only.

    edgetrain run examples/horovod_keras/train.py --np 2 -- --epochs 1
    mpirun -n 2 python train.py --epochs 1 --steps-per-epoch 20
"""
import argparse

import tensorflow as tf

import horovod.tensorflow.keras as hvd

parser = argparse.ArgumentParser(description='Horovod Keras Fashion-MNIST example',
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument('--epochs', type=int, default=1,
                    help='number of epochs to train')
parser.add_argument('--batch-size', type=int, default=64,
                    help='input batch size per rank')
parser.add_argument('--steps-per-epoch', type=int, default=None,
                    help='steps per epoch on each rank (default: one pass over the data / number of ranks)')
parser.add_argument('--base-lr', type=float, default=0.001,
                    help='learning rate for a single rank')
parser.add_argument('--warmup-epochs', type=float, default=1,
                    help='number of warmup epochs')
parser.add_argument('--checkpoint-format', default='./checkpoint-{epoch}.h5',
                    help='checkpoint file format')
args = parser.parse_args()

# Horovod: initialize Horovod.
hvd.init()

# Horovod: pin GPU to be used to process local rank (one GPU per process)
gpus = tf.config.experimental.list_physical_devices('GPU')
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], 'GPU')

# Horovod: print logs on the first worker.
verbose = 1 if hvd.rank() == 0 else 0

(x_train, y_train), (x_test, y_test) = tf.keras.datasets.fashion_mnist.load_data()

dataset = tf.data.Dataset.from_tensor_slices(
    (tf.cast(x_train[..., tf.newaxis] / 255.0, tf.float32),
     tf.cast(y_train, tf.int64))
)
dataset = dataset.repeat().shuffle(10000).batch(args.batch_size)

test_dataset = tf.data.Dataset.from_tensor_slices(
    (tf.cast(x_test[..., tf.newaxis] / 255.0, tf.float32),
     tf.cast(y_test, tf.int64))
).batch(args.batch_size)

model = tf.keras.Sequential([
    tf.keras.layers.Conv2D(32, [3, 3], activation='relu', input_shape=(28, 28, 1)),
    tf.keras.layers.Conv2D(64, [3, 3], activation='relu'),
    tf.keras.layers.MaxPooling2D(pool_size=(2, 2)),
    tf.keras.layers.Dropout(0.25),
    tf.keras.layers.Flatten(),
    tf.keras.layers.Dense(128, activation='relu'),
    tf.keras.layers.Dropout(0.5),
    tf.keras.layers.Dense(10, activation='softmax')
])

# Horovod: adjust learning rate based on number of workers.
scaled_lr = args.base_lr * hvd.size()
opt = tf.keras.optimizers.Adam(scaled_lr)

# Horovod: add Horovod DistributedOptimizer.
opt = hvd.DistributedOptimizer(opt)

# Horovod: Specify `experimental_run_tf_function=False` to ensure TensorFlow
# uses hvd.DistributedOptimizer() to compute gradients.
model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(),
              optimizer=opt,
              metrics=['accuracy'],
              experimental_run_tf_function=False)

callbacks = [
    # Horovod: broadcast initial variable states from rank 0 to all other processes.
    # This is necessary to ensure consistent initialization of all workers when
    # training is started with random weights or restored from a checkpoint.
    hvd.callbacks.BroadcastGlobalVariablesCallback(0),

    # Horovod: average metrics among workers at the end of every epoch.
    #
    # Note: This callback must be in the list before the ReduceLROnPlateau,
    # TensorBoard or other metrics-based callbacks.
    hvd.callbacks.MetricAverageCallback(),

    # Horovod: using `lr = 1.0 * hvd.size()` from the very beginning leads to worse final
    # accuracy. Scale the learning rate `lr = 1.0` ---> `lr = 1.0 * hvd.size()` during
    # the first epochs. See https://arxiv.org/abs/1706.02677 for details.
    hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=args.warmup_epochs,
                                             verbose=verbose),
]

# Horovod: save checkpoints only on worker 0 to prevent other workers from corrupting them.
if hvd.rank() == 0:
    callbacks.append(tf.keras.callbacks.ModelCheckpoint(args.checkpoint_format))

# Horovod: adjust number of steps based on number of workers.
steps_per_epoch = args.steps_per_epoch or len(x_train) // args.batch_size // hvd.size()

model.fit(dataset,
          steps_per_epoch=steps_per_epoch,
          callbacks=callbacks,
          epochs=args.epochs,
          verbose=verbose)

# Evaluate on the test set (every rank evaluates it; rank 0 reports).
score = model.evaluate(test_dataset, verbose=0)
if verbose:
    print('Test loss:', score[0])
    print('Test accuracy:', score[1])
