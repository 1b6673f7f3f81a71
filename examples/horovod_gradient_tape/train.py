"""Horovod with a custom training loop (tf.GradientTape) on Fashion-MNIST.

The shape of Horovod's examples/tensorflow2/tensorflow2_mnist.py: hvd.init(), one GPU per local
rank, the learning rate scaled by hvd.size(), the tape wrapped in hvd.DistributedGradientTape so
gradients are averaged over ranks, rank 0's variables broadcast after the first step (so the
optimizer's slots exist), and a tf.train.Checkpoint written by rank 0 only, into ./checkpoints/.

    edgetrain run examples/horovod_gradient_tape/train.py --np 2 -- --steps 200
    mpirun -n 2 python train.py --epochs 1 --steps 20     # --steps-per-epoch is the same option
"""
import argparse
import os

import tensorflow as tf

import horovod.tensorflow as hvd

parser = argparse.ArgumentParser(description='Horovod GradientTape Fashion-MNIST example',
                                 formatter_class=argparse.ArgumentDefaultsHelpFormatter)
parser.add_argument('--steps', '--steps-per-epoch', dest='steps', type=int, default=None,
                    help='training steps per epoch on each rank (default: one pass over the data / number of ranks)')
parser.add_argument('--epochs', type=int, default=1,
                    help='number of epochs (passes of --steps steps)')
parser.add_argument('--batch-size', type=int, default=64,
                    help='input batch size per rank')
parser.add_argument('--base-lr', type=float, default=0.001,
                    help='learning rate for a single rank')
parser.add_argument('--checkpoint-dir', default='./checkpoints',
                    help='directory rank 0 writes its checkpoint into')
args = parser.parse_args()

# Horovod: initialize Horovod.
hvd.init()

# Horovod: pin GPU to be used to process local rank (one GPU per process)
gpus = tf.config.experimental.list_physical_devices('GPU')
for gpu in gpus:
    tf.config.experimental.set_memory_growth(gpu, True)
if gpus:
    tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], 'GPU')

(images, labels), _ = tf.keras.datasets.fashion_mnist.load_data()

dataset = tf.data.Dataset.from_tensor_slices(
    (tf.cast(images[..., tf.newaxis] / 255.0, tf.float32),
     tf.cast(labels, tf.int64))
)
dataset = dataset.repeat().shuffle(10000).batch(args.batch_size)

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
loss = tf.losses.SparseCategoricalCrossentropy()

# Horovod: adjust learning rate based on number of workers.
opt = tf.optimizers.Adam(args.base_lr * hvd.size())

checkpoint = tf.train.Checkpoint(model=model, optimizer=opt)


@tf.function
def training_step(images, labels, first_batch):
    with tf.GradientTape() as tape:
        probs = model(images, training=True)
        loss_value = loss(labels, probs)

    # Horovod: add Horovod Distributed GradientTape.
    tape = hvd.DistributedGradientTape(tape)

    grads = tape.gradient(loss_value, model.trainable_variables)
    opt.apply_gradients(zip(grads, model.trainable_variables))

    # Horovod: broadcast initial variable states from rank 0 to all other processes.
    # This is necessary to ensure consistent initialization of all workers when
    # training is started with random weights or restored from a checkpoint.
    #
    # Note: broadcast should be done after the first gradient step to ensure optimizer
    # initialization.
    if first_batch:
        hvd.broadcast_variables(model.variables, root_rank=0)
        hvd.broadcast_variables(opt.variables(), root_rank=0)

    return loss_value


# Horovod: adjust number of steps based on number of workers.
steps = args.steps or len(images) // args.batch_size // hvd.size()
total_steps = steps * args.epochs

for batch, (images, labels) in enumerate(dataset.take(total_steps)):
    loss_value = training_step(images, labels, batch == 0)

    if (batch % 10 == 0 or batch == total_steps - 1) and hvd.rank() == 0:
        print('Epoch %d Step #%d\tLoss: %.6f' % (batch // steps + 1, batch, loss_value), flush=True)

# Horovod: save checkpoints only on worker 0 to prevent other workers from
# corrupting it.
if hvd.rank() == 0:
    path = checkpoint.save(os.path.join(args.checkpoint_dir, 'ckpt'))
    print('Saved checkpoint', path)
