"""TensorBoard files without TensorFlow: tflm.event_files.EventWriter writes the summaries
tf.summary writes (same tags, values, plugins, steps), and tflm.tensorboard.EpochScalars
writes the epoch scalars Keras' TensorBoard callback writes, with the same values."""

import keras
import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.util import tensor_util

from tflm import data
from tflm.event_files import EventWriter
from tflm.tensorboard import EpochScalars


def _read(folder):
    """{tag: [(step, value, plugin name)]} of every tensor summary in `folder`."""
    accumulator = EventAccumulator(str(folder))
    accumulator.Reload()
    found = {}
    for tag in accumulator.Tags()["tensors"]:
        plugin = accumulator.SummaryMetadata(tag).plugin_data.plugin_name
        found[tag] = [(e.step, tensor_util.make_ndarray(e.tensor_proto).tolist(), plugin)
                      for e in accumulator.Tensors(tag)]
    return found


def test_the_same_summaries_as_tf_summary(tmp_path):
    import tensorflow as tf
    rng = np.random.default_rng(0)
    values = rng.normal(size=3).tolist()
    with EventWriter(tmp_path / "ours") as writer:
        for step, value in enumerate(values):
            writer.scalar("group/perplexity", value, step)
        writer.text("top_predictions", "| a | b |\n| --- | --- |", 2)
    tf_writer = tf.summary.create_file_writer(str(tmp_path / "tf"))
    with tf_writer.as_default():
        for step, value in enumerate(values):
            tf.summary.scalar("group/perplexity", value, step=step)
        tf.summary.text("top_predictions", "| a | b |\n| --- | --- |", step=2)
    tf_writer.close()
    ours, theirs = _read(tmp_path / "ours"), _read(tmp_path / "tf")
    assert ours.keys() == theirs.keys() == {"group/perplexity", "top_predictions"}
    assert [(s, p) for s, _, p in ours["group/perplexity"]] == [
        (s, p) for s, _, p in theirs["group/perplexity"]] == [(i, "scalars") for i in range(3)]
    np.testing.assert_allclose([v for _, v, _ in ours["group/perplexity"]], values, rtol=1e-6)
    assert ours["top_predictions"] == theirs["top_predictions"]


def test_epoch_scalars_are_keras_tensorboards(tmp_path):
    from zoo import AWDLSTM
    ids = np.random.default_rng(1).integers(0, 30, size=600).astype("int32")
    model = AWDLSTM(30, embed_dim=8, hidden_dim=8, num_layers=1, dropout=0.0, dropout_h=0.0,
                    dropout_i=0.0, dropout_e=0.0, weight_dropout=0.0)
    model.compile(optimizer=keras.optimizers.SGD(0.5))
    model.fit(data.lm_dataset(ids, 4, 10, train=False), epochs=2, verbose=0,
              validation_data=data.lm_dataset(ids[:200], 2, 10, train=False),
              callbacks=[EpochScalars(tmp_path / "ours"),
                         keras.callbacks.TensorBoard(log_dir=str(tmp_path / "keras"))])
    for folder in ("train", "validation"):
        ours, theirs = _read(tmp_path / "ours" / folder), _read(tmp_path / "keras" / folder)
        assert {"epoch_loss", "epoch_perplexity"} <= ours.keys()
        assert ours.keys() <= theirs.keys(), ours.keys() - theirs.keys()
        for tag, events in ours.items():
            assert [s for s, _, _ in events] == [s for s, _, _ in theirs[tag]] == [0, 1]
            assert [v for _, v, _ in events] == pytest.approx([v for _, v, _ in theirs[tag]],
                                                             rel=1e-6), tag
    assert "epoch_learning_rate" in _read(tmp_path / "ours" / "train")
