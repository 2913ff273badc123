"""Async-safe callbacks (`tflm.callbacks`): on JAX and PyTorch, `zoo.train`'s fit runs its
batch-end hooks on Keras' worker thread, and what those hooks do (stop on NaN, Ctrl-C, time
the loop, write TensorBoard) still works from there."""

import json
import re
import textwrap

import numpy as np
import pytest

from tests.backends import run_in_backend
from tests.zoo.test_train import TINY

PROBE = """
import keras
from tflm.callbacks import HookThreads
"""


def run_with_probe(code):
    """`code` under JAX, after `PROBE` (which imports `tflm.callbacks.HookThreads`, a probe
    as async-safe as the rest); returns its last line of output, parsed as JSON."""
    out = run_in_backend("jax", PROBE + textwrap.dedent(code))
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("backend", [pytest.param("jax", marks=pytest.mark.slow), "torch"])
def test_zoo_train_runs_its_batch_hooks_off_the_main_thread(backend, tmp_path):
    out = run_in_backend(backend, f"""
        import json, threading
        from tflm import callbacks
        from zoo import train

        on_main = []
        timed = callbacks.WordsPerSecond.on_train_batch_end

        def probe(self, batch, logs=None):  # WordsPerSecond's hook, watched
            on_main.append(threading.current_thread() is threading.main_thread())
            return timed(self, batch, logs)

        callbacks.WordsPerSecond.on_train_batch_end = probe
        assert train.main(["--epochs", "1", "--out", {str(tmp_path / "run")!r},
                           *{TINY!r}]) == 0
        print(json.dumps(on_main))
    """)
    on_main = json.loads(out.strip().splitlines()[-1])
    assert len(on_main) > 5 and not any(on_main)
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    epoch = metrics["history"][0]
    assert 0 < epoch["first_step_seconds"] <= epoch["train_seconds"] < epoch["epoch_seconds"]
    assert np.isfinite(metrics["test_perplexity"])


def test_nan_and_ctrl_c_reach_fit_from_the_worker_thread():
    result = run_with_probe("""
        import json, os, signal
        import numpy as np
        from tflm.callbacks import StopOnNaN, TrainingDiverged, WordsPerSecond
        from zoo.runtime import interrupt

        class EpochEnd(keras.callbacks.Callback):  # stands for a checkpoint writer
            ended = False

            def on_epoch_end(self, epoch, logs=None):
                EpochEnd.ended = True

        def fit(x, *more):
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
            model.compile(optimizer="sgd", loss="mse")
            probe = HookThreads()
            try:
                model.fit(x, x[:, :1], batch_size=8, epochs=1, verbose=0, shuffle=False,
                          callbacks=[StopOnNaN(), interrupt.CheckCtrlC(),
                                     WordsPerSecond(64), probe, EpochEnd(), *more])
                return "finished", probe.on_main
            except TrainingDiverged as err:
                return str(err), probe.on_main
            except KeyboardInterrupt:
                return "KeyboardInterrupt", probe.on_main

        x = np.ones((64, 4), "float32")
        x[24:32] = np.nan  # the fourth batch
        diverged = fit(x)

        class CtrlCAtThirdBatch(keras.callbacks.Callback):
            def on_train_batch_begin(self, batch, logs=None):
                if batch == 2:
                    os.kill(os.getpid(), signal.SIGINT)

        signal.signal(signal.SIGINT, signal.default_int_handler)  # not ignored, as in a shell
        with interrupt.handle_ctrl_c(), interrupt.deferring():
            interrupted = fit(np.ones((64, 4), "float32"), CtrlCAtThirdBatch())
        print(json.dumps({"diverged": diverged, "interrupted": interrupted,
                          "epoch_ended": EpochEnd.ended}))
    """)
    message, on_main = result["diverged"]
    # The fourth step is the first non-finite one; a later step's hook may notice first.
    step = re.search(r"training loss became nan at epoch 1, step (\d+);", message)
    assert step and 4 <= int(step.group(1)) <= 8, message
    assert on_main and not any(on_main)
    stopped, on_main = result["interrupted"]
    assert stopped == "KeyboardInterrupt" and on_main and not any(on_main)
    assert not result["epoch_ended"]  # neither reached an on_epoch_end


def test_words_per_second_times_the_loop_when_its_hook_runs_late():
    result = run_with_probe("""
        import json, time
        import numpy as np
        from tflm.callbacks import WordsPerSecond

        class SlowValidation(keras.callbacks.Callback):
            def on_test_begin(self, logs=None):
                time.sleep(0.4)

        x = np.random.default_rng(0).normal(size=(64, 4)).astype("float32")
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        probe = HookThreads()
        history = model.fit(x, x[:, :1], batch_size=8, epochs=2, verbose=0,
                            validation_data=(x, x[:, :1]),
                            callbacks=[WordsPerSecond(1000), SlowValidation(), probe])
        print(json.dumps({"history": history.history, "on_main": probe.on_main}))
    """)
    assert len(result["on_main"]) == 16 and not any(result["on_main"])
    history = result["history"]
    for epoch in range(2):
        logs = {k: v[epoch] for k, v in history.items()}
        assert logs["validation_seconds"] >= 0.4
        assert 0 < logs["first_step_seconds"] <= logs["train_seconds"]
        assert logs["train_seconds"] < logs["epoch_seconds"] - 0.4
        assert logs["words_per_second"] == pytest.approx(1000 / logs["train_seconds"])
        assert logs["train_steps"] == 8  # every hook counted, on the worker thread too


def test_tensorboard_is_async_safe_only_where_it_writes_nothing_per_batch(tmp_path):
    result = run_with_probe(f"""
        import json
        import numpy as np
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
        from tflm.tensorboard import AsyncSafeTensorBoard

        logs = {str(tmp_path)!r}
        safe = {{
            "default": AsyncSafeTensorBoard(logs).async_safe,
            "batch": AsyncSafeTensorBoard(logs, update_freq="batch").async_safe,
            "every 5": AsyncSafeTensorBoard(logs, update_freq=5).async_safe,
            "steps per second": AsyncSafeTensorBoard(
                logs, write_steps_per_second=True).async_safe,
        }}
        x = np.ones((32, 4), "float32")
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        probe = HookThreads()
        model.fit(x, x[:, :1], batch_size=8, epochs=2, verbose=0, validation_data=(x, x[:, :1]),
                  callbacks=[AsyncSafeTensorBoard(logs), probe])
        tags = {{}}
        for folder in ("train", "validation"):
            events = EventAccumulator(logs + "/" + folder)
            events.Reload()
            tags[folder] = sorted(events.Tags()["tensors"])
        print(json.dumps({{"safe": safe, "on_main": probe.on_main, "tags": tags}}))
    """)
    assert result["safe"] == {"default": True, "batch": False, "every 5": False,
                              "steps per second": False}
    assert len(result["on_main"]) == 8 and not any(result["on_main"])
    assert "epoch_loss" in result["tags"]["train"]
    assert "epoch_loss" in result["tags"]["validation"]


def test_tensorboard_keeps_keras_batch_hook_on_tensorflow(tmp_path):
    from tflm.tensorboard import AsyncSafeTensorBoard
    import keras
    assert keras.backend.backend() == "tensorflow"
    assert not AsyncSafeTensorBoard(str(tmp_path)).async_safe  # it writes the step's graph


def test_progress_bar_skips_an_update_older_than_its_position(capsys):
    from tflm.callbacks import EpochProgbar
    bar = EpochProgbar(total_epochs=3)
    assert bar.async_safe
    bar.set_params({"verbose": 1, "epochs": 1, "steps": 10})
    bar.on_train_begin()
    bar.on_epoch_begin(0)
    bar.on_train_batch_end(5, {"loss": 2.0})
    bar.on_train_batch_end(3, {"loss": 9.0})  # ran late on another thread
    assert bar.seen == 6
    bar.on_train_batch_end(6, {"loss": 1.5})
    assert bar.seen == 7
    assert "loss: 9.0" not in capsys.readouterr().out


def test_hook_threads_says_main_on_tensorflow():
    import keras
    import numpy as np
    from tflm.callbacks import HookThreads
    probe = HookThreads()
    assert probe.where is None
    x = np.ones((16, 4), "float32")
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    model.fit(x, x[:, :1], batch_size=8, epochs=1, verbose=0, callbacks=[probe])
    assert probe.on_main == [True, True] and probe.where == "main"
