"""edgetrain.optimizers.FusedAdam: Keras' Adam, updated by one fused kernel."""

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

from edgetrain.optimizers import FusedAdam  # noqa: E402


def _weights(seed: int) -> list:
    rng = np.random.default_rng(seed)
    return [tf.Variable(rng.standard_normal((300, 40)).astype(np.float32)), tf.Variable(rng.standard_normal(40).astype(np.float32)),
            tf.Variable(rng.standard_normal((50, 8)).astype(np.float32))]


def _train(opt, steps: int = 6) -> tuple[list, list]:
    """``steps`` updates from fixed gradients, the rate changed between them as the jobs' schedule does;
    the last weight gets sparse gradients (rows), as an embedding's are."""
    weights = _weights(0)
    rng = np.random.default_rng(1)
    opt.build(weights)

    @tf.function
    def apply(dense, rows, values):
        opt.apply_gradients([(dense[0], weights[0]), (dense[1], weights[1]),
                             (tf.IndexedSlices(values, rows, tf.constant([50, 8], tf.int64)), weights[2])])

    for step in range(steps):
        opt.learning_rate.assign(0.01 * (step + 1))
        dense = [tf.constant(rng.standard_normal(w.shape).astype(np.float32)) for w in weights[:2]]
        apply(dense, tf.constant([3, 7, 3], tf.int64), tf.constant(rng.standard_normal((3, 8)).astype(np.float32)))
    return [w.numpy() for w in weights], [v.numpy() for v in opt.variables]


def test_fused_adam_updates_weights_and_moments_as_keras_adam_does():
    fused_weights, fused_state = _train(FusedAdam(0.01))
    keras_weights, keras_state = _train(tf.keras.optimizers.Adam(0.01))
    assert [w.shape for w in fused_weights] == [w.shape for w in keras_weights]
    for fused, keras in zip(fused_weights + fused_state, keras_weights + keras_state):
        # float32 rounding, in another order of operations (seen: 1.9e-6); an update moves a weight by 0.01-0.06.
        np.testing.assert_allclose(fused, keras, rtol=1e-5, atol=1e-5)
    # The updates did move the weights: equal because both trained, not because neither did.
    assert not np.allclose(fused_weights[0], _weights(0)[0].numpy(), atol=1e-3)


def test_dense_weights_are_updated_by_the_fused_kernel():
    w = tf.Variable(tf.ones((4, 3)))
    opt = FusedAdam(0.1)
    opt.build([w])
    graph = tf.function(lambda g: opt.apply_gradients([(g, w)])).get_concrete_function(tf.TensorSpec((4, 3))).graph
    assert "ResourceApplyAdam" in {op.type for op in graph.get_operations()}


def test_checkpoints_move_between_keras_adam_and_fused_adam(tmp_path):
    for write_with, read_with in ((tf.keras.optimizers.Adam, FusedAdam), (FusedAdam, tf.keras.optimizers.Adam)):
        w = tf.Variable(tf.ones((5, 2)))
        written = write_with(0.01)
        written.build([w])
        written.apply_gradients([(tf.fill((5, 2), 0.5), w)])
        path = tf.train.Checkpoint(weights=w, optimizer=written).write(str(tmp_path / write_with.__name__))

        w2 = tf.Variable(tf.zeros((5, 2)))
        read = read_with(0.01)
        read.build([w2])
        tf.train.Checkpoint(weights=w2, optimizer=read).read(path).assert_existing_objects_matched()
        assert [v.numpy().tolist() for v in read.variables] == [v.numpy().tolist() for v in written.variables]
        assert int(read.iterations) == 1
