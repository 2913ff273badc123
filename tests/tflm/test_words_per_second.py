"""`tflm.callbacks.WordsPerSecond`: training throughput without the validation pass, and
where an epoch's time went."""

import time

import keras
import numpy as np
import pytest

from tflm.callbacks import WordsPerSecond


class SlowValidation(keras.callbacks.Callback):
    def on_test_begin(self, logs=None):
        time.sleep(0.4)


def test_validation_is_not_counted_as_training_time():
    x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    speed = WordsPerSecond(tokens_per_epoch=1000)
    history = model.fit(x, x[:, :1], batch_size=8, epochs=2, verbose=0,
                        validation_data=(x, x[:, :1]), callbacks=[speed, SlowValidation()])
    for epoch in range(2):
        logs = {k: v[epoch] for k, v in history.history.items()}
        assert logs["validation_seconds"] >= 0.4
        assert 0 < logs["first_step_seconds"] <= logs["train_seconds"]
        assert logs["train_seconds"] + logs["validation_seconds"] <= logs["epoch_seconds"]
        assert logs["train_seconds"] < logs["epoch_seconds"] - 0.4
        assert logs["words_per_second"] == pytest.approx(1000 / logs["train_seconds"])
        assert logs["train_steps"] == 8  # 64 rows, batches of 8
    assert speed.last == pytest.approx(history.history["words_per_second"][-1])


def test_without_validation_the_loop_is_the_epoch():
    x = np.zeros((16, 4), "float32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    history = model.fit(x, x[:, :1], batch_size=8, epochs=1, verbose=0,
                        callbacks=[WordsPerSecond(tokens_per_epoch=16)])
    assert history.history["validation_seconds"] == [0.0]
    assert history.history["train_seconds"][0] <= history.history["epoch_seconds"][0]


def test_steps_per_execution_counts_batches_not_calls():
    """With `steps_per_execution` 3 a hook ends 3 batches (`batch`: the last one's index,
    past the epoch's 8 batches in its last group of 2): still 8 training steps."""
    x = np.zeros((64, 4), "float32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", steps_per_execution=3)

    ends = []
    calls = keras.callbacks.LambdaCallback(
        on_train_batch_end=lambda batch, logs: ends.append(batch))
    history = model.fit(x, x[:, :1], batch_size=8, epochs=1, verbose=0,
                        callbacks=[WordsPerSecond(tokens_per_epoch=64), calls])
    assert ends == [2, 5, 8]
    assert history.history["train_steps"] == [8]
