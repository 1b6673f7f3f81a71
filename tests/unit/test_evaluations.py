"""edgetrain.callbacks.Evaluations: where within an epoch the model is evaluated, in one process."""

import json

import numpy as np
import pytest

tf = pytest.importorskip("tensorflow")

import edgetrain.callbacks as et  # noqa: E402


def test_the_grid_starts_again_with_each_epoch_whose_end_is_its_own_validation(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGETRAIN_RUN_DIR", str(tmp_path))
    rng = np.random.default_rng(0)
    x, y = rng.random((200, 4), dtype=np.float32), rng.integers(0, 2, 200)
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2, activation="softmax")])
    # Two steps per execution: Keras reports every second step, so the grid is met on passing it.
    model.compile("sgd", "sparse_categorical_crossentropy", metrics=["accuracy"], steps_per_execution=2)
    test = tf.data.Dataset.from_tensor_slices((x[:40], y[:40])).batch(20)
    progress = et.Progress(batch_size=10)
    model.fit(x, y, batch_size=10, epochs=2, steps_per_epoch=10, validation_data=test, verbose=0,
              callbacks=[progress, et.Evaluations(progress, test, every=4)])

    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    evals = [(r["epoch"], r["step"]) for r in records if r.get("kind") == "eval"]
    # Every 4 steps of each epoch and at its end (step 10) - not at global steps 12 and 16, which
    # fall 2 and 6 steps into the second epoch.
    assert evals == [(1, 4), (1, 8), (1, 10), (2, 4), (2, 8), (2, 10)]
    assert [r["images"] for r in records if r.get("kind") == "eval"] == [40, 80, 100, 140, 180, 200]
