"""The accelerator memory a run took: the peak of the backend's own allocator on the first
GPU, in MiB, or None where the run has no GPU.

JAX: `Device.memory_stats()["peak_bytes_in_use"]`; PyTorch: `torch.cuda.max_memory_allocated()`;
TensorFlow: `tf.config.experimental.get_memory_info("GPU:0")["peak"]`. Each counts the
tensors its allocator handed out (not the pool it reserved, nor cuDNN's or XLA's own
workspaces outside it), the figure the PyTorch reference's `torch.cuda.max_memory_allocated`
gives for its side.
"""


def peak_mib(backend=None):
    """The peak allocator memory on the first GPU of `backend` (default: Keras' own), MiB;
    None without a GPU."""
    if backend is None:
        import keras  # deferred: the PyTorch peer's measurements import no Keras
        backend = keras.backend.backend()
    if backend == "jax":
        import jax  # deferred: the running backend's framework only
        gpus = [d for d in jax.devices() if d.platform == "gpu"]
        stats = gpus[0].memory_stats() if gpus else None
        return stats["peak_bytes_in_use"] / 2 ** 20 if stats else None
    if backend == "torch":
        import torch  # deferred: the running backend's framework only
        return torch.cuda.max_memory_allocated() / 2 ** 20 if torch.cuda.is_available() else None
    if backend == "tensorflow":
        import tensorflow as tf  # deferred: the running backend's framework only
        if not tf.config.list_physical_devices("GPU"):
            return None
        return tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2 ** 20
    return None
