"""One GPU per rank, the way Horovod's examples pin them: ``from edgetrain.gpu import pin_gpu``
in a script, and what the built-in jobs call. (The node's GPUs are checked by the controller:
edgetrain.controller.gpu.)"""

from __future__ import annotations

from edgetrain.shared.errors import EdgetrainError


def pin_gpu(tf, local_rank: int) -> str | None:
    """Give this rank the GPU of its local rank, the way Horovod's examples do; None without GPUs.

    Memory growth on every visible GPU (a rank does not grab all memory up front), then only
    ``gpus[local_rank]`` stays visible to TensorFlow. Call it right after ``hvd.init()``, before
    anything creates a tensor. Returns the pinned device's name.
    """
    gpus = tf.config.experimental.list_physical_devices("GPU")
    if not gpus:
        return None
    if not 0 <= local_rank < len(gpus):
        raise EdgetrainError(
            f"local rank {local_rank} has no GPU of its own: this host shows {len(gpus)} GPU(s)",
            f"give the host at most {len(gpus)} slot(s) (edgetrain_slots) so each rank gets one GPU")
    try:
        for gpu in gpus:
            tf.config.experimental.set_memory_growth(gpu, True)
        tf.config.experimental.set_visible_devices(gpus[local_rank], "GPU")
    except RuntimeError as e:
        raise EdgetrainError(f"cannot pin local rank {local_rank} to {gpus[local_rank].name}: {e}",
                             "call pin_gpu before TensorFlow creates any tensor or model") from None
    return gpus[local_rank].name
