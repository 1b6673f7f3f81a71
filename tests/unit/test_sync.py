"""The --sync-every settings (edgetrain.shared.sync): their checks, a checkpoint's older name for
them, and the refusal where no Horovod exchanges the gradients."""

from __future__ import annotations

import subprocess
import sys

import pytest

from edgetrain.shared import job_options
from edgetrain.shared.errors import UsageError
from edgetrain.shared.job_options import JobOptions
from edgetrain.shared.sync import Sync, SyncMode
from tests.conftest import ROOT


@pytest.mark.parametrize(("given", "message"), [
    ({"sync_every": 0}, "--sync-every 0 must be at least 1"),
    ({"sync_mode": "weights", "outer_lr": 0.0}, "--outer-lr 0.0 must be in (0, 2]"),
    ({"sync_mode": "weights", "outer_momentum": 1.0}, "--outer-momentum 1.0 must be in [0, 1)"),
    ({"outer_momentum": 0.9}, "--outer-lr and --outer-momentum are for --sync-mode weights"),
    ({"sync_mode": "weights", "sync_every": 4, "fp16_allreduce": True}, "--fp16-allreduce compresses gradients"),
])
def test_the_sync_settings_are_checked_alone_and_together(given, message):
    with pytest.raises(UsageError, match=None) as caught:
        JobOptions(**given).check()
    assert str(caught.value).startswith(message), caught.value


def test_the_modes_are_named_by_their_values_on_the_workers_command_line():
    values = {**JobOptions(sync_every=4, sync_mode=SyncMode.WEIGHTS, outer_lr=0.7, outer_momentum=0.9).__dict__,
              "epochs": 1, "batch_size": 64}
    argv = job_options.argv(values)
    assert argv[argv.index("--sync-mode") + 1] == "weights" and argv[argv.index("--sync-every") + 1] == "4"
    assert job_options.sync_of(values) == Sync(4, SyncMode.WEIGHTS, 0.7, 0.9)
    assert job_options.recorded(values, {}) == {"batch_size": 64, "sync_every": 4, "sync_mode": "weights", "outer_lr": 0.7,
                                                "outer_momentum": 0.9}


def test_a_checkpoint_from_before_sync_every_is_read_with_todays_name():
    # Horovod's backward passes per step were the accumulation --sync-every K grads is.
    assert job_options.saved({"batch_size": 64, "backward_passes_per_step": 2}) == {"batch_size": 64, "sync_every": 2}


def test_a_held_out_run_records_its_split_and_one_from_before_the_option_held_out_split_0():
    values = {**JobOptions(holdout=6000).__dict__, "epochs": 1, "batch_size": 64}
    assert job_options.recorded(values, {}) == {"batch_size": 64, "holdout": 6000, "holdout_split": 2}
    assert job_options.recorded({**values, "holdout": None}, {}) == {"batch_size": 64}
    # The worker is told the split with --holdout even at the default: an older image's default differs.
    told = job_options.argv(values)
    assert told[told.index("--holdout-split") + 1] == "2"
    assert "--holdout-split" not in job_options.argv({**values, "holdout": None})
    assert job_options.saved({"batch_size": 64, "holdout": 6000}) == {"batch_size": 64, "holdout": 6000, "holdout_split": 0}
    assert job_options.saved({"batch_size": 64}) == {"batch_size": 64}
    with pytest.raises(UsageError, match="--holdout-split 0 picks the examples --holdout keeps apart, and none are"):
        JobOptions(holdout_split=0).check()


@pytest.mark.parametrize("call", [
    "et.distributed_optimizer(tf.keras.optimizers.SGD(), Sync(4, 'weights'))",
    "et.distributed_optimizer(tf.keras.optimizers.SGD(), Sync(4, 'grads'))",
    "et.SyncWeights(tf.keras.Sequential([tf.keras.Input((2,)), tf.keras.layers.Dense(1)]), Sync(4, 'weights'))",
])
def test_syncing_every_k_without_horovod_is_refused_in_one_line(call):
    """Under MultiWorkerMirroredStrategy or parameter servers (TF_CONFIG set) TensorFlow exchanges
    every step itself: a script asking for K > 1 there is told so, not left to train every step."""
    pytest.importorskip("tensorflow")
    code = ("import tensorflow as tf, edgetrain.callbacks as et\n"
            "from edgetrain.shared.sync import Sync\n"
            "from edgetrain.shared.errors import EdgetrainError\n"
            f"try:\n    {call}\nexcept EdgetrainError as e:\n    print('refused:', e)\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300,
                       env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "TF_CONFIG": '{"cluster": {}}',
                            "TF_CPP_MIN_LOG_LEVEL": "3"})
    assert r.returncode == 0, r.stderr[-2000:]
    assert ("refused: syncing every few batches needs Horovod (hvd.init() first): parameter servers and "
            "MultiWorkerMirroredStrategy exchange every step inside TensorFlow") in r.stdout, r.stdout
