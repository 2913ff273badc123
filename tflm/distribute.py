"""Choosing a distribution strategy (TensorFlow) or distribution (JAX) by name.

    with tflm.distribute.get_strategy("mirrored").scope():
        model = zoo.AWDLSTM(...)          # create (and compile) the model inside the scope
        model.compile(optimizer=...)
    model.fit(train_ds, ...)              # the global batch is split across replicas

Under `MirroredStrategy` Keras splits each global batch of B streams into contiguous blocks
of B / R rows, the same way at every step, so replica r always sees the same streams and
carries their LSTM state in its own copy of the state variables (ON_READ). The train step
all-reduces the gradients before clipping, so a step equals the single-device step on the
same global batch, and the reported loss / perplexity are token-weighted over the whole
global batch.

On JAX the Keras 3 way is `keras.distribution.DataParallel` (`data_parallel()`; `python -m
zoo.train --strategy data-parallel`): one program over a mesh of devices, each batch's
streams sharded along its batch axis, the weights replicated, and the carried LSTM state
sharded by stream like the batches (`tflm.backends.jax_streams.stream_layout`). JAX
computes the global program, and its random bits do not depend on how an array is sharded
(`jax_threefry_partitionable`), so every dropout mask is the one a single device draws for
that stream and a step equals the single-device step up to float summation order.
"""

import json
import os
import socket

import keras
import numpy as np

from tflm import data

STRATEGIES = ("default", "mirrored", "multi-worker")  # tf.distribute (TensorFlow)
DATA_PARALLEL = "data-parallel"  # keras.distribution.DataParallel (JAX)


def use_logical_cpus(count):
    """Split the host CPU into `count` logical devices (call before TensorFlow starts work).

    For testing MirroredStrategy without GPUs.
    """
    import tensorflow as tf  # deferred: TensorFlow only when a strategy is used
    cpus = tf.config.list_physical_devices("CPU")
    tf.config.set_logical_device_configuration(
        cpus[0], [tf.config.LogicalDeviceConfiguration() for _ in range(int(count))])
    return [d.name for d in tf.config.list_logical_devices("CPU")]


def get_strategy(name="default", devices=None):
    """A `tf.distribute.Strategy` by name.

    Args:
        name: "default" (one device), "mirrored" (all local GPUs, or `devices`), or
            "multi-worker" (`MultiWorkerMirroredStrategy`; the cluster comes from
            `$TF_CONFIG`).
        devices: device names for "mirrored" (e.g. ["/cpu:0", "/cpu:1"]).
    """
    if name == DATA_PARALLEL:
        raise ValueError(f"{DATA_PARALLEL!r} is keras.distribution.DataParallel on "
                         "KERAS_BACKEND=jax (tflm.distribute.data_parallel()); on TensorFlow "
                         "use 'mirrored'.")
    if keras.backend.backend() != "tensorflow":
        raise ValueError(
            f"get_strategy({name!r}) is for the TensorFlow backend; with KERAS_BACKEND="
            f"{keras.backend.backend()} use tflm.distribute.data_parallel() (JAX; "
            f"zoo.train --strategy {DATA_PARALLEL}).")
    import tensorflow as tf  # deferred: TensorFlow only when a strategy is used
    if name not in STRATEGIES:
        raise ValueError(f"Unknown strategy {name!r}; choose one of {', '.join(STRATEGIES)}.")
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "mirrored":
        return tf.distribute.MirroredStrategy(devices=devices)
    if "TF_CONFIG" not in os.environ:
        raise ValueError("strategy 'multi-worker' needs $TF_CONFIG describing the cluster "
                         '(e.g. {"cluster": {"worker": ["127.0.0.1:12345", ...]}, '
                         '"task": {"type": "worker", "index": 0}}).')
    json.loads(os.environ["TF_CONFIG"])  # fail early on malformed JSON
    return tf.distribute.MultiWorkerMirroredStrategy()


def data_parallel(devices=None, batch_sizes=()):
    """Data parallelism on the JAX backend: sets and returns a
    `keras.distribution.DataParallel` over `devices` (default: all of JAX's). Every size
    in `batch_sizes` (the global batches the run will use) must split evenly over the
    devices: a `ValueError` names the first that does not."""
    if keras.backend.backend() != "jax":
        raise ValueError(f"{DATA_PARALLEL} (keras.distribution.DataParallel) is for "
                         "KERAS_BACKEND=jax; on TensorFlow use the 'mirrored' strategy "
                         "(tflm.distribute.get_strategy, zoo.train --strategy mirrored).")
    count = len(devices) if devices else len(keras.distribution.list_devices())
    for size in batch_sizes:
        if int(size) % count:
            raise ValueError(f"a batch of {size} streams does not split over {count} devices "
                             f"under {DATA_PARALLEL}: give batch sizes that {count} divides "
                             "(--batch-size, training.eval_batch_size)")
    distribution = keras.distribution.DataParallel(devices=devices)
    keras.distribution.set_distribution(distribution)
    return distribution


def lm_dataset_for(strategy, ids, batch_size, bptt, **kwargs):
    """`tflm.data.lm_dataset` laid out for `strategy` (global batch `batch_size`).

    No strategy (None): `tflm.data.lm_batches`, the running backend's pipeline (`tf.data`
    on TensorFlow, a `WindowSequence` on JAX and PyTorch, which need no TensorFlow).
    One device or `MirroredStrategy`: the plain dataset (Keras splits each global batch into
    contiguous per-replica blocks, the same streams every step). `MultiWorkerMirroredStrategy`:
    Keras' automatic sharding would hand each worker every k-th *window* (or, with sharding
    off, the same rows to every worker), breaking the streams; instead each worker builds the
    windows of its own block of streams, so worker w always carries streams
    [w B / W, (w + 1) B / W). Needs one replica per worker.
    """
    if strategy is None:  # no tf.distribute: the running backend's pipeline
        return data.lm_batches(ids, batch_size, bptt, **kwargs)
    if strategy.num_replicas_in_sync == 1 or not is_multi_worker(strategy):
        return data.lm_dataset(ids, batch_size, bptt, **kwargs)
    replicas = strategy.num_replicas_in_sync
    if batch_size % replicas:
        raise ValueError(f"batch_size={batch_size} must be divisible by the {replicas} "
                         "replicas of the multi-worker strategy.")
    # 1-D ids are batchified here; 2-D streams (a partial shuffle's) are used as given.
    streams = data.batchify(ids, batch_size) if np.ndim(ids) == 1 else np.asarray(ids)

    def make(context):
        if context.num_input_pipelines != replicas:
            raise ValueError("multi-worker language-model data needs one replica per worker; "
                             f"got {replicas} replicas in {context.num_input_pipelines} workers.")
        per = batch_size // replicas
        rows = streams[context.input_pipeline_id * per:(context.input_pipeline_id + 1) * per]
        return data.lm_dataset(rows, per, bptt, **kwargs)

    return strategy.distribute_datasets_from_function(make)


def free_local_ports(count):
    """`count` TCP ports free on 127.0.0.1 now, for a local MultiWorkerMirroredStrategy
    cluster (`TF_CONFIG`'s "worker" addresses)."""
    socks = [socket.socket() for _ in range(int(count))]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def is_multi_worker(strategy):
    """True when `strategy` is a `MultiWorkerMirroredStrategy` spanning more than one worker
    (chief and worker tasks of its cluster; one process with TF_CONFIG unset is not)."""
    import tensorflow as tf  # deferred: TensorFlow only when a strategy is used
    if not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return False
    spec = strategy.cluster_resolver.cluster_spec()
    return sum(spec.num_tasks(job) for job in ("chief", "worker") if job in spec.jobs) > 1
