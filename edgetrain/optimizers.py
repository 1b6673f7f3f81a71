"""Keras' Adam with its update in one fused kernel, for CPUs where the update is a large share of a step.

Keras 2.11+'s Adam updates each weight in about a dozen element-wise operations, each one pass
over the weight and its two moments; LeNet's Dense kernel alone is 6.4 MB. TensorFlow's
``ResourceApplyAdam`` does the same arithmetic in one pass. On this project's CPUs, one thread,
LeNet at batch 64, it took a step from 28.4 to 26.3 ms of CPU (docs/scaling-history.md); on a Raspberry
Pi, whose caches hold none of those arrays, every pass goes to memory.

The state is Keras' own (the same moments, ``build()``, checkpoints, Horovod's wrapper), so a
checkpoint written with ``tf.keras.optimizers.Adam`` resumes with this one and the other way round.
Sparse gradients and AMSGrad take Keras' own path.
"""

from __future__ import annotations

import tensorflow as tf


class FusedAdam(tf.keras.optimizers.Adam):
    """``tf.keras.optimizers.Adam`` with the dense update in one kernel; same arguments, same results."""

    def update_step(self, gradient, variable):
        if isinstance(gradient, tf.IndexedSlices) or self.amsgrad:
            return super().update_step(gradient, variable)
        dtype = variable.dtype
        step = tf.cast(self.iterations + 1, dtype)
        beta_1, beta_2 = tf.cast(self.beta_1, dtype), tf.cast(self.beta_2, dtype)
        # Keras' Adam finds a weight's moments this way too (keras/src/optimizers/adam.py).
        index = self._index_dict[self._var_key(variable)]
        tf.raw_ops.ResourceApplyAdam(
            var=variable.handle, m=self._momentums[index].handle, v=self._velocities[index].handle,
            beta1_power=tf.pow(beta_1, step), beta2_power=tf.pow(beta_2, step),
            lr=tf.cast(self.learning_rate, dtype), beta1=beta_1, beta2=beta_2, epsilon=tf.cast(self.epsilon, dtype),
            grad=gradient, use_locking=False,
        )
