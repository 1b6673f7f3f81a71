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


def test_an_accuracy_a_rounding_below_the_target_stops_training_there(tmp_path, monkeypatch):
    """5,940 of 6,000 examples averaged over three ranks' shards is 0.9899999999999999: at a 99.0% target
    it stops, as the exact fraction would."""
    monkeypatch.setenv("EDGETRAIN_RUN_DIR", str(tmp_path))
    averaged = sum(c / 2000 for c in (1981, 1979, 1980)) / 3

    class Scored(et.Evaluations):
        def set_model(self, model):
            super().set_model(model)
            self.score = lambda data: (averaged, 0.1, 6000)

    rng = np.random.default_rng(0)
    x, y = rng.random((100, 4), dtype=np.float32), rng.integers(0, 2, 100)
    model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(2, activation="softmax")])
    model.compile("sgd", "sparse_categorical_crossentropy", metrics=["accuracy"])
    test = tf.data.Dataset.from_tensor_slices((x[:20], y[:20])).batch(20)
    progress = et.Progress(batch_size=10, target_accuracy=0.99)
    model.fit(x, y, batch_size=10, epochs=2, steps_per_epoch=10, verbose=0, callbacks=[progress, Scored(progress, test, every=4)])

    evals = [r for r in map(json.loads, (tmp_path / "metrics.jsonl").read_text().splitlines()) if r.get("kind") == "eval"]
    assert [(r["epoch"], r["step"], r["reached"]) for r in evals] == [(1, 4, True)]
