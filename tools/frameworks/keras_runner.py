"""One Keras backend's run: the library's own path, `model.fit` on `tflm.data` windows.

The model is the preset's `zoo.AWDLSTM` (`zoo.runs.builders`) with the shared initial weights,
trained by `LanguageModel`'s train step with `tflm.optimizers.SGD`. The windows are built
by `tflm.data` from the shared streams with the comparison's rule: `lm_dataset` on
TensorFlow (how `python -m zoo.train` feeds it), a `keras.utils.PyDataset` of `lm_windows`
on JAX / PyTorch, padded to a multiple of 4 positions on JAX unless `--pad-to-multiple`
says otherwise, with `zoo.train`'s window shapes (`zoo.runs.builders.set_window_shapes`: on
JAX a window runs at a length compiled already unless `--compiled-lengths each`; the
padding is masked and its cost is part of the measured speed). The LSTM kernel is the
model's choice (`model.use_cudnn`, set with `--lstm-kernel`), and which kernel ran is read
from the layers. Only a Keras worker imports this module (its backend set by the parent).
"""

import dataclasses
import time

import keras
import numpy as np

from tflm import data
from tflm.optimizers import SGD
from tools.frameworks.machine import current_rss_mib
from tools.frameworks.measure import add_memory, gpu_matmul_rate, keras_device, versions
from tools.frameworks.roles import export_keras_roles, load_keras_roles
from tools.frameworks.settings import training_settings, window_rule
from tools.frameworks.timing import keras_step_timer, step_summary
from zoo.runs.builders import (build_model, make_lr_schedule, make_optimizer, pad_to_multiple,
                               set_window_shapes)
from zoo.runs.settings import RunSettings


def pad_multiple(setting, backend):
    """--pad-to-multiple for one backend: auto = zoo.train's rule (4 on JAX, 1 elsewhere)."""
    if setting in (None, "auto"):
        return data.default_pad_to_multiple(backend)
    return int(setting)


class Windows:
    """The windows of one pass over `streams` (`tflm.data` rule `rule`), or a subset of
    them (`indices`, in order), as the dataset `model.fit` / `evaluate` take."""

    def __init__(self, streams, bptt, rule, indices=None):
        self.streams, self.bptt, self.rule = streams, int(bptt), dict(rule)
        _, lengths = data.window_starts(streams, streams.shape[0], bptt, **rule)
        self.indices = list(range(len(lengths)) if indices is None else indices)
        self.lengths = [int(lengths[i]) for i in self.indices]

    def subset(self, positions):
        """The windows at `positions` of this (sub)set."""
        return Windows(self.streams, self.bptt, self.rule,
                       [self.indices[p] for p in positions])

    def tokens(self):
        return [self.streams.shape[0] * n for n in self.lengths]

    def dataset(self, backend, pad):
        batch = self.streams.shape[0]
        if backend == "tensorflow":
            import tensorflow as tf  # deferred: the tensorflow backend's worker only
            ds = data.lm_dataset(self.streams, batch, self.bptt, pad_to_multiple=pad,
                                 **self.rule)
            if self.indices == list(range(len(self.indices))):
                return ds.take(len(self.indices))
            wanted = tf.constant(self.indices, tf.int64)
            return ds.enumerate().filter(
                lambda i, w: tf.reduce_any(tf.equal(i, wanted))).map(lambda i, w: w)
        everything = list(data.lm_windows(self.streams, batch, self.bptt, pad_to_multiple=pad,
                                          **self.rule))
        chosen = [everything[i] for i in self.indices]

        class PassWindows(keras.utils.PyDataset):
            def __len__(self):
                return len(chosen)

            def __getitem__(self, i):
                return chosen[i]

        return PassWindows()


class PresetFit:
    """The model `python -m zoo.train` builds for `settings` (`zoo.runs.builders`), compiled
    with its optimizer and given its window shapes for fixed windows of bptt, and a
    `model.fit` of the next `n` of `windows` windows of random tokens out of `vocab` words
    at each call (the benchmarks' step timing and counting)."""

    def __init__(self, settings, vocab, windows):
        self.training = dataclasses.replace(settings.training, fixed_windows=True)
        self.pad = pad_to_multiple(self.training)  # zoo.train's: 4 on JAX, else 1
        self.model = build_model(settings, vocab)
        self.model.compile(optimizer=make_optimizer(self.training),
                           jit_compile=self.training.jit_compile)
        self.model.build((None, None))
        set_window_shapes(self.model, self.training, self.pad)
        batch, bptt = self.training.batch_size, self.training.bptt
        streams = np.random.default_rng(0).integers(
            0, vocab, (batch, windows * bptt + 1), dtype=np.int32)
        self._windows, self._done = Windows(streams, bptt, {"train": False}), 0

    def __call__(self, n, callbacks=()):
        """Train on the next `n` windows, one epoch of `model.fit`."""
        part = self._windows.subset(range(self._done, self._done + n))
        self._done += n
        self.model.fit(part.dataset(keras.backend.backend(), self.pad), epochs=1, verbose=0,
                       callbacks=list(callbacks))


def evaluate(model, windows, backend, pad):
    """(perplexity, words/s, seconds) over `windows`: a compile warm-up on the first and
    last window shapes first, then a timed pass (blocking: evaluate returns floats)."""
    n = len(windows.indices)
    model.evaluate(windows.subset(sorted({0, n - 1})).dataset(backend, pad), verbose=0,
                   return_dict=True)
    t0 = time.perf_counter()
    logs = model.evaluate(windows.dataset(backend, pad), verbose=0, return_dict=True)
    seconds = time.perf_counter() - t0
    return float(logs["perplexity"]), float(sum(windows.tokens()) / seconds), seconds


def eval_windows(spec, streams, bptt):
    windows = Windows(streams, bptt, {"train": False})
    limit = int(spec.get("eval_windows") or 0)
    if limit and limit < len(windows.indices):
        windows = windows.subset(range(limit))
    return windows


def run_keras(spec):
    rss_imports = current_rss_mib()  # Keras, its backend, tflm (and TensorFlow) imported
    backend = spec["backend"]
    if keras.backend.backend() != backend:
        raise RuntimeError(f"KERAS_BACKEND={keras.backend.backend()!r}, expected {backend!r}")
    on_gpu, device_name = keras_device(backend, spec["device"])
    config = spec["config"]
    settings = RunSettings.from_config(config)
    s = training_settings(config)
    arrays = np.load(spec["data_path"])
    init = dict(np.load(spec["weights_path"]))
    vocab_size = int(init["embedding"].shape[0])
    if spec["precision"] != "float32":
        keras.mixed_precision.set_dtype_policy(spec["precision"])
    keras.utils.set_random_seed(s["seed"])
    model = build_model(settings, vocab_size)
    model.build()
    load_keras_roles(model, init)
    jit = True if backend == "jax" else bool(spec["jit"])
    timer = keras_step_timer(model)
    model.compile(optimizer=SGD(s["lr"]), jit_compile=jit)
    rss_built = current_rss_mib()
    pad = pad_multiple(spec.get("pad_to_multiple"), backend)
    # zoo.train's window shapes (JAX: lengths compiled already; elsewhere the mask-free
    # LSTM loop for unpadded windows), for this comparison's window rule
    set_window_shapes(model, dataclasses.replace(
        settings.training, fixed_windows=not window_rule(spec, s, 0)["train"],
        pad_to_compiled_lengths=spec.get("compiled_lengths", "auto") == "auto"), pad)

    train_streams = arrays["train_streams"]
    epoch0 = Windows(train_streams, s["bptt"], window_rule(spec, s, 0))
    steps = epoch0.subset(range(min(int(spec["steps"]), len(epoch0.indices))))
    valid = eval_windows(spec, arrays["valid_streams"], s["bptt"])

    t0 = time.perf_counter()
    model.fit(steps.dataset(backend, pad), epochs=1, verbose=0, callbacks=[timer])
    steps_wall = time.perf_counter() - t0
    result = step_summary(timer.record, spec["warmup"], eager=backend == "torch")
    result["steps_wall_s"] = steps_wall
    result["train_traces"] = model.traced_steps["train"] if backend != "torch" else None
    if spec.get("save_weights"):
        np.savez(spec["weights_after_path"], **export_keras_roles(model))
    ppl, eval_wps, eval_s = evaluate(model, valid, backend, pad)
    result.update(valid_perplexity_after_steps=ppl, eval_words_per_s=eval_wps, eval_s=eval_s,
                  eval_windows=len(valid.indices), eval_tokens=int(sum(valid.tokens())))

    result["epochs"] = []
    if int(spec.get("epochs", 0)) > 0:
        load_keras_roles(model, init)
        model.optimizer.iterations.assign(0)
        keras.utils.set_random_seed(s["seed"])
        ppl0, _, _ = evaluate(model, valid, backend, pad)
        curve = [{"epoch": 0, "train_time_s": 0.0, "val_perplexity": ppl0}]
        elapsed = 0.0
        # training.when / lr_decay (the PTB tutorial's per-epoch decay), as zoo.train
        schedule = [c for c in [make_lr_schedule(settings.training)] if c is not None]
        for epoch in range(int(spec["epochs"])):
            windows = Windows(train_streams, s["bptt"], window_rule(spec, s, epoch))
            t0 = time.perf_counter()
            hist = model.fit(windows.dataset(backend, pad), initial_epoch=epoch,
                             epochs=epoch + 1, verbose=0, callbacks=schedule)
            seconds = time.perf_counter() - t0
            elapsed += seconds
            val, _, _ = evaluate(model, valid, backend, pad)
            curve.append({"epoch": epoch + 1, "train_time_s": elapsed, "epoch_s": seconds,
                          "val_perplexity": val,
                          "train_perplexity": float(hist.history["perplexity"][-1]),
                          "epoch_words_per_s": float(sum(windows.tokens()) / seconds)})
        result["epochs"] = curve

    kernels = sorted({lstm.last_kernel for lstm in model.lstms})
    result.update(
        params=int(model.count_params()), on_gpu=on_gpu, device=device_name,
        pad_to_multiple=pad, versions=versions(backend),
        jit=("XLA (jax.jit)" if backend == "jax" else
             ("XLA" if jit else "tf.function graph") if backend == "tensorflow" else
             ("torch.compile" if jit else "eager")),
        lstm_kernel="/".join(kernels), cudnn="yes" if on_gpu and kernels == ["fused"] else "no",
        rss_after_build_mib=rss_built)
    add_memory(result, backend, on_gpu, rss_after_imports=rss_imports)
    result["matmul_flops"] = gpu_matmul_rate(spec["precision"]) if on_gpu else None
    return result
