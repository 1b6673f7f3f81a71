"""Do TensorFlow's parameter-server tasks of x86_64 and aarch64 work together? (docs/scaling-history.md,
"Parameter-server tasks across architectures"). A measurement, not a test: it needs an arm64 Debian root holding TensorFlow,
run through qemu as a Pi 4's CPU (Cortex-A72), and an x86_64 machine with this checkout's
environment. The chief always runs here, with oneDNN forced on, the case feared: the functions
an x86_64 coordinator optimises are what its workers run.

    apt-get install qemu-user-static binfmt-support debootstrap && update-binfmts --enable qemu-aarch64
    debootstrap --arch=arm64 --variant=minbase --include=python3,python3-venv bookworm ROOT http://deb.debian.org/debian
    pip download -d ROOT/wheels --platform manylinux2014_aarch64 --python-version 3.11 --only-binary=:all: \\
        tensorflow-cpu-aws==2.15.1 -c constraints.txt
    chroot ROOT sh -c 'python3 -m venv /opt/tf && /opt/tf/bin/pip install --no-index -f /wheels tensorflow-cpu-aws==2.15.1'
    mount -t proc proc ROOT/proc
    .venv/bin/python -m lab.mixed_arch_ps ROOT

Every task listens on loopback. Each layout prints the chief's accuracy by epoch and its evaluation.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

EPOCHS, STEPS = 4, 40
LAYOUTS = {  # parameter server's architecture, workers' architectures
    "control: all x86_64": ("x86_64", ("x86_64",)),
    "aarch64 worker": ("x86_64", ("aarch64",)),
    "aarch64 parameter server, one worker of each": ("aarch64", ("x86_64", "aarch64")),
}


def task() -> None:
    """One task, TF_CONFIG from the environment: the chief trains and evaluates, the others serve."""
    import numpy as np
    import tensorflow as tf

    config = json.loads(os.environ["TF_CONFIG"])
    kind = config["task"]["type"]
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if kind != "chief":
        tf.distribute.Server(resolver.cluster_spec(), job_name=kind, task_index=config["task"]["index"],
                             protocol="grpc", start=True).join()
    strategy = tf.distribute.ParameterServerStrategy(resolver)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(4000, 32, 32, 1)).astype(np.float32)
    y = (x[:, :4, :4, 0].mean(axis=(1, 2)) > 0).astype(np.int64)  # learnable by a linear model

    def dataset_fn(context):
        return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(4000).repeat().batch(32).prefetch(2)

    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Conv2D(4, 3, padding="same", input_shape=(32, 32, 1)),
                                     tf.keras.layers.Flatten(), tf.keras.layers.Dense(2)])
        model.compile(optimizer=tf.keras.optimizers.legacy.SGD(0.05),
                      loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    history = model.fit(tf.keras.utils.experimental.DatasetCreator(dataset_fn), epochs=EPOCHS, steps_per_epoch=STEPS, verbose=0)
    _, accuracy = model.evaluate(tf.data.Dataset.from_tensor_slices((x[:512], y[:512])).batch(128), steps=4, verbose=0)
    print(json.dumps({"machine": platform.machine(), "accuracy": history.history["accuracy"], "evaluation": accuracy}), flush=True)


def layout(root: Path, ps: str, workers: tuple[str, ...], port: int = 24000) -> dict:
    """The chief here, the parameter server and the workers on the architectures named; the chief's result."""
    cluster = {"chief": [f"127.0.0.1:{port}"], "ps": [f"127.0.0.1:{port + 1}"],
               "worker": [f"127.0.0.1:{port + 10 + i}" for i in range(len(workers))]}
    here = Path(__file__).resolve()

    def start(kind: str, index: int, arch: str, **env) -> subprocess.Popen:
        config = json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}})
        if arch == "aarch64":
            shutil.copy(here, root / "mixed_arch_ps.py")
            argv = [shutil.which("chroot") or "/usr/sbin/chroot", str(root), "/usr/bin/env", "-i", "PATH=/usr/bin:/bin",
                    "QEMU_CPU=cortex-a72", "TF_CPP_MIN_LOG_LEVEL=2", f"TF_CONFIG={config}", "/opt/tf/bin/python",
                    "/mixed_arch_ps.py", "task"]
            return subprocess.Popen(argv, stdout=subprocess.PIPE, text=True)
        return subprocess.Popen([sys.executable, str(here), "task"], stdout=subprocess.PIPE, text=True,
                                env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "TF_CONFIG": config, **env})

    servers = [start("ps", 0, ps)] + [start("worker", i, arch) for i, arch in enumerate(workers)]
    try:
        chief = start("chief", 0, "x86_64", TF_ENABLE_ONEDNN_OPTS="1")
        out, _ = chief.communicate(timeout=1800)
        if chief.returncode != 0:
            raise SystemExit(f"the chief failed ({chief.returncode})")
        return json.loads(out.strip().splitlines()[-1])
    finally:
        for s in servers:
            s.kill()
            s.wait()


def main() -> None:
    if sys.argv[1:] == ["task"]:
        task()
        return
    root = Path(sys.argv[1])
    for name, (ps, workers) in LAYOUTS.items():
        found = layout(root, ps, workers)
        print(f"{name}: training accuracy by epoch " + " / ".join(f"{a:.1%}" for a in found["accuracy"])
              + f", evaluation {found['evaluation']:.1%}", flush=True)


if __name__ == "__main__":
    main()
