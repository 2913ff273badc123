"""TensorBoard extras for language models: embedding projector, top-k predictions as text,
and Keras' TensorBoard callback made async-safe where it writes nothing per batch.

Keras 3's `TensorBoard` callback logs every scalar in the epoch logs (loss, perplexity,
learning rate, words/s, gradient norm, averaging state) and optional weight histograms, but
its `embeddings_freq` no longer writes a projector checkpoint; `EmbeddingProjector` does.
Without TensorFlow (Keras on JAX or PyTorch on a machine that has none) the files are written
with the `tensorboard` package alone (`tflm.event_files`): `tensorboard_callback` gives
`EpochScalars` (the epoch logs, Keras' tags) instead of Keras' callback, and the projector
reads the matrix from a TSV file instead of a TensorFlow checkpoint.
"""

import inspect
import pathlib
import shutil

import keras
import numpy as np

from tflm import backends
from tflm.event_files import EventWriter


def tensorboard_callback(log_dir, histogram_freq=0):
    """The run's TensorBoard callback: `AsyncSafeTensorBoard` where TensorFlow is installed,
    else `EpochScalars` (no histograms: those need TensorFlow)."""
    if backends.tensorflow_installed():
        return AsyncSafeTensorBoard(log_dir=str(log_dir), histogram_freq=histogram_freq)
    return EpochScalars(log_dir)


class EmbeddingProjector(keras.callbacks.Callback):
    """Write the embedding matrix with the vocabulary as projector metadata, every epoch.

    Files in `log_dir`: `embedding-<epoch>.*` (a `tf.train.Checkpoint` holding the matrix,
    the last epoch's only; without TensorFlow, `embedding.tsv` instead) and its `checkpoint`
    state file, `metadata.tsv` (one token per line, in id order), `projector_config.pbtxt` (naming the
    checkpoint by its absolute path, so `tensorboard --logdir` works from any directory; the
    metadata path is relative to the logdir, as the projector resolves it).

    The projector also lists every run folder below `log_dir` (`train/`, `validation/`, as
    Keras' TensorBoard callback writes them) with the checkpoint it finds in the folder's
    parent, this one, and opens the first: without a config of its own such a run shows the
    matrix without its words. So each folder of `runs` gets the same config and a copy of
    `metadata.tsv` (the projector reads no file outside a config's folder): whichever run
    the projector opens, the words are there.

    Args:
        log_dir: the run's TensorBoard directory.
        vocabulary: tokens in id order (any iterable of str).
        get_matrix: callable returning the (V, d) matrix; default: `model.embedding.embeddings`.
        runs: the run folders below `log_dir` that scalars are (or will be) written to.
            Default: Keras' ("train", "validation").
    """

    def __init__(self, log_dir, vocabulary, get_matrix=None, runs=("train", "validation")):
        super().__init__()
        self.log_dir = pathlib.Path(log_dir)
        self.vocabulary = [str(t) for t in vocabulary]
        self.get_matrix = get_matrix
        self.runs = tuple(runs)

    def on_epoch_end(self, epoch, logs=None):
        matrix = (self.get_matrix() if self.get_matrix is not None
                  else self.model.embedding.embeddings)
        matrix = np.asarray(keras.ops.convert_to_numpy(matrix), dtype=np.float32)
        if matrix.shape[0] != len(self.vocabulary):
            raise ValueError(f"EmbeddingProjector: the matrix has {matrix.shape[0]} rows but "
                             f"the vocabulary has {len(self.vocabulary)} tokens.")
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if not (self.log_dir / "projector_config.pbtxt").exists():  # metadata once per run
            (self.log_dir / "metadata.tsv").write_text(
                "\n".join(t if t.strip() else "<blank>" for t in self.vocabulary) + "\n",
                encoding="utf-8")
        if backends.tensorflow_installed():
            self._write_checkpoint(matrix, epoch)
        else:
            self._write_tsv(matrix)

    def _write_tsv(self, matrix):
        """The matrix as `embedding.tsv` (one row per token, tab-separated) and a projector
        config naming it: what the projector reads when there is no TensorFlow checkpoint."""
        np.savetxt(self.log_dir / "embedding.tsv", matrix, fmt="%.6g", delimiter="\t")
        (self.log_dir / "projector_config.pbtxt").write_text(
            'embeddings {\n  tensor_name: "embedding"\n  tensor_path: "embedding.tsv"\n'
            '  metadata_path: "metadata.tsv"\n}\n', encoding="utf-8")

    def _write_checkpoint(self, matrix, epoch):
        import tensorflow as tf  # deferred: TensorFlow, needed only when writing
        from tensorboard.plugins import projector  # deferred: imports TensorFlow

        checkpoint = tf.train.Checkpoint(embedding=tf.Variable(matrix))
        # A CheckpointManager also writes the `checkpoint` state file into the logdir, where
        # the projector looks first; without one it looks in the logdir's parent, which in a
        # zoo run holds the run's checkpoint/ folder (FailedPreconditionError lines).
        manager = tf.train.CheckpointManager(checkpoint, str(self.log_dir.resolve()),
                                             max_to_keep=1, checkpoint_name="embedding")
        path = manager.save(checkpoint_number=epoch + 1)
        config = projector.ProjectorConfig()
        # Absolute: TensorBoard resolves a relative checkpoint path against its own working
        # directory, not the logdir.
        config.model_checkpoint_path = str(path)
        entry = config.embeddings.add()
        entry.tensor_name = "embedding/.ATTRIBUTES/VARIABLE_VALUE"
        entry.metadata_path = "metadata.tsv"
        projector.visualize_embeddings(str(self.log_dir), config)
        for run in self.runs:  # the projector reads no file outside a config's folder
            folder = self.log_dir / run
            if not (folder / "metadata.tsv").exists():
                folder.mkdir(exist_ok=True)
                shutil.copyfile(self.log_dir / "metadata.tsv", folder / "metadata.tsv")
            projector.visualize_embeddings(str(folder), config)


class TopPredictionsText(keras.callbacks.Callback):
    """Log, every epoch, a markdown table of the top-k next words for fixed contexts.

    Args:
        log_dir: TensorBoard directory (a `validation` subfolder is written).
        contexts: list of 1-D token-id arrays (e.g. slices of the validation split).
        vocabulary: tokens in id order.
        k: how many predictions. Default 5.
    """

    def __init__(self, log_dir, contexts, vocabulary, k=5):
        super().__init__()
        self.log_dir = pathlib.Path(log_dir)
        self.contexts = [np.asarray(c, dtype=np.int32) for c in contexts]
        self.vocabulary = [str(t) for t in vocabulary]
        self.k = int(k)
        self._writer = None

    def _last_log_probs(self):
        """Each context's next-word log-probabilities, `[V]` per context: contexts of one
        length in one window through the backend's compiled forward
        (`Backend.window_log_probs`; op by op, JAX took 1.3-2 s an epoch for three
        contexts of 20 words of the PTB model, compiled 0.01 s after a 0.6 s compile)."""
        last = [None] * len(self.contexts)
        by_length = {}
        for i, ids in enumerate(self.contexts):
            by_length.setdefault(len(ids), []).append(i)
        for indices in by_length.values():
            window = np.stack([self.contexts[i] for i in indices])
            log_probs, _ = backends.current().window_log_probs(self.model, window, None)
            log_probs = np.asarray(keras.ops.convert_to_numpy(log_probs))
            for row, i in enumerate(indices):
                last[i] = log_probs[row, -1]
        return last

    def table(self):
        rows = ["| context | top-%d next words (probability) |" % self.k, "| --- | --- |"]
        for ids, last in zip(self.contexts, self._last_log_probs()):
            top = np.argsort(-last)[:self.k]
            words = ", ".join(f"{self.vocabulary[i]} ({np.exp(last[i]):.3f})" for i in top)
            context = " ".join(self.vocabulary[i] for i in ids[-12:])
            rows.append(f"| ... {context} | {words} |")
        return "\n".join(rows)

    def on_epoch_end(self, epoch, logs=None):
        if self._writer is None:
            self._writer = EventWriter(self.log_dir / "validation")
        self._writer.text("top_predictions", self.table(), step=epoch)
        self._writer.flush()

    def on_train_end(self, logs=None):
        if self._writer is not None:
            self._writer.close()
            self._writer = None


class EpochScalars(keras.callbacks.Callback):
    """Every number of the epoch logs as a TensorBoard scalar, without TensorFlow: the
    training ones as `epoch_<name>` in `log_dir/train`, the `val_` ones as `epoch_<name>`
    in `log_dir/validation`, at step = epoch, and the optimizer's `epoch_learning_rate`:
    the tags and folders Keras' `TensorBoard` callback writes. Writes nothing per batch
    (async-safe)."""

    async_safe = True

    def __init__(self, log_dir):
        super().__init__()
        self.log_dir = pathlib.Path(log_dir)
        self._writers = {}

    def _writer(self, name):
        if name not in self._writers:
            self._writers[name] = EventWriter(self.log_dir / name)
        return self._writers[name]

    def on_epoch_end(self, epoch, logs=None):
        for key, value in (logs or {}).items():
            try:
                value = float(keras.ops.convert_to_numpy(value))
            except (TypeError, ValueError):
                continue  # not a number (Keras' logs hold numbers; a callback's may not)
            folder, name = ("validation", key[4:]) if key.startswith("val_") else ("train", key)
            self._writer(folder).scalar(f"epoch_{name}", value, step=epoch)
        rate = getattr(getattr(self.model, "optimizer", None), "learning_rate", None)
        if rate is not None and "learning_rate" not in (logs or {}):  # as Keras' callback
            self._writer("train").scalar("epoch_learning_rate",
                                         float(keras.ops.convert_to_numpy(rate)), step=epoch)
        for writer in self._writers.values():
            writer.flush()

    def on_train_end(self, logs=None):
        for writer in self._writers.values():
            writer.close()
        self._writers = {}


class AsyncSafeTensorBoard(keras.callbacks.TensorBoard):
    """Keras' `TensorBoard` callback, async-safe (`tflm.callbacks`) where it has nothing to
    write after a training batch.

    With `update_freq="epoch"` (the default), no profiling (`profile_batch=0`) and no
    steps-per-second scalars, Keras' callback writes nothing per batch, yet after every
    training batch it still calls `tf.summary.scalar` for each log (no writer is set, so
    nothing is written), and after the first it reads `model.train_function` to write a
    TensorFlow graph, which on JAX writes the model state back to the variables in the
    middle of the epoch. Where that is so and the backend is not TensorFlow (the only one
    with such a graph, and one Keras never runs hooks off the main thread for), this
    callback skips its batch-end hook and declares itself async-safe, so a `fit` whose
    other callbacks are async-safe too dispatches each step without waiting for the one
    before. Everything else (the epoch scalars, histograms, the validation writer) is
    Keras'. Same arguments as `keras.callbacks.TensorBoard`.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        arguments = inspect.signature(keras.callbacks.TensorBoard.__init__).bind(
            self, *args, **kwargs)
        arguments.apply_defaults()
        self._nothing_per_batch = (keras.backend.backend() != "tensorflow"
                                   and self.update_freq == "epoch"
                                   and not self.write_steps_per_second
                                   and not arguments.arguments["profile_batch"])

    @property
    def async_safe(self):
        return self._nothing_per_batch

    def on_train_batch_end(self, batch, logs=None):
        if not self._nothing_per_batch:
            super().on_train_batch_end(batch, logs)
