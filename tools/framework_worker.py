"""One backend's run for `tools/compare_frameworks.py` (a fresh process per backend).

    python tools/framework_worker.py SPEC.json

SPEC is written by `compare_frameworks.py`; the worker writes the JSON result it names. The
Keras backend is fixed by `KERAS_BACKEND` before anything imports Keras, which is why every
backend runs in its own process. Phases:

- ``init`` (one Keras backend, TensorFlow when installed): load the corpus, batchify it, cut
  the windows of every epoch (`tflm.data.window_starts`, the rule `lm_windows` and
  `lm_dataset` use), build the model and save its weights by role (see `keras_roles`) and
  the data as .npz files, so that every backend starts from the same weights and sees the
  same windows in the same order.
- ``run`` with ``backend`` one of tensorflow, jax, torch (Keras) or torch-native
  (`tools.torch_native`): load those weights, train `steps` windows, evaluate, optionally
  train whole epochs, and measure (see `compare_frameworks` for the definitions).
"""

import json
import math
import os
import pathlib
import platform
import resource
import sys
import time
import traceback

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

KERAS_BACKENDS = ("tensorflow", "jax", "torch")


class Skip(Exception):
    """The backend cannot run here (not an error of the tool): reported as skipped."""


# ---- small helpers shared by every backend ------------------------------------------------
def rss_mib():
    """Current resident set size of this process (MiB), from /proc (0 when unavailable)."""
    try:
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return 0.0


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def numpy_matmul_rate(n=1024, repeats=5):
    """float32 GEMM rate of this process on the CPU (FLOP/s): median of `repeats` n^3."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n)).astype(np.float32)
    b = rng.standard_normal((n, n)).astype(np.float32)
    a @ b
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return 2.0 * n ** 3 / float(np.median(times))


def torch_cuda_matmul_rate(dtype_name="float32", n=4096, repeats=10):
    import torch
    dtype = getattr(torch, dtype_name)
    a = torch.randn(n, n, device="cuda", dtype=dtype)
    b = torch.randn(n, n, device="cuda", dtype=dtype)
    a @ b
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return 2.0 * n ** 3 / float(np.median(times))


def median_words_per_s(tokens, seconds, skip=0, exclude=None):
    pairs = [(n, t) for i, (n, t) in enumerate(zip(tokens, seconds))
             if i >= skip and not (exclude and exclude[i])]
    if not pairs:
        return None
    return float(np.median([n / t for n, t in pairs]))


def load_spec(path):
    with open(path) as f:
        return json.load(f)


def training_settings(config):
    training = config["training"]
    return {
        "batch_size": int(training.get("batch_size", 20)),
        "eval_batch_size": int(training.get("eval_batch_size", 10)),
        "bptt": int(training.get("bptt", 70)),
        "lr": float(training.get("lr", 30.0)),
        "clip_norm": training.get("clip_norm", 0.25),
        "weight_decay": float(training.get("weight_decay", 0.0)),
        "seed": int(training.get("seed", 0)),
        "max_len": training.get("max_seq_len"),
    }


# ---- Keras side -----------------------------------------------------------------------------
def keras_roles(model):
    """role -> Keras variable for every trainable weight of a `zoo.AWDLSTM`.

    Roles: "embedding", "output_bias", "lstm{i}.kernel" / ".recurrent_kernel" / ".bias",
    "head.<variable name>" for the head's own weights, and "var:<path without the model
    name>" for anything else. The same architecture gives the same roles on every backend.
    """
    roles = {"embedding": model.embedding.embeddings}
    if model.embedding.output_bias is not None:
        roles["output_bias"] = model.embedding.output_bias
    for i, lstm in enumerate(model.lstms):
        roles[f"lstm{i}.kernel"] = lstm.cell.kernel
        roles[f"lstm{i}.recurrent_kernel"] = lstm.cell.recurrent_kernel
        roles[f"lstm{i}.bias"] = lstm.cell.bias
    seen = {id(v) for v in roles.values()}
    for v in model.head.trainable_weights:
        if id(v) not in seen:
            roles[f"head.{v.name}"] = v
            seen.add(id(v))
    for v in model.trainable_weights:
        if id(v) not in seen:
            roles["var:" + v.path.split("/", 1)[-1]] = v
            seen.add(id(v))
    if len(roles) != len(model.trainable_weights):
        raise RuntimeError("role names collide; cannot map weights by role.")
    return roles


def export_keras_roles(model):
    import keras
    return {role: np.asarray(keras.ops.convert_to_numpy(v.value), dtype=np.float32)
            for role, v in keras_roles(model).items()}


def load_keras_roles(model, arrays):
    roles = keras_roles(model)
    missing, extra = sorted(set(roles) - set(arrays)), sorted(set(arrays) - set(roles))
    if missing or extra:
        raise RuntimeError(f"initial weights do not fit the model: missing {missing}, "
                           f"unexpected {extra}.")
    for role, var in roles.items():
        value = arrays[role]
        if tuple(value.shape) != tuple(var.shape):
            raise RuntimeError(f"{role}: saved shape {value.shape} != model {tuple(var.shape)}")
        var.assign(value.astype(np.float32))


def load_corpus_for(config, data_dir):
    from zoo.train import load_data
    return load_data(config["corpus"], data_dir)


def run_init(spec):
    """Make the shared initial weights and data files (one process, one Keras backend)."""
    import keras

    from tflm import data
    from zoo.train import build_model

    config = spec["config"]
    s = training_settings(config)
    corpus, optimal = load_corpus_for(config, spec.get("data_dir"))
    vocab_size = len(corpus.vocabulary)
    train = data.batchify(corpus.train, s["batch_size"])
    valid = data.batchify(corpus.valid, s["eval_batch_size"])
    arrays = {"train_streams": train, "valid_streams": valid}
    variable = spec.get("window_lengths", "variable") == "variable"
    epochs = max(1, int(spec.get("epochs", 0)))
    for epoch in range(epochs):
        starts, lengths = data.window_starts(train, s["batch_size"], s["bptt"], train=variable,
                                             seed=s["seed"], epoch=epoch, max_len=s["max_len"])
        arrays[f"train_windows_{epoch}"] = np.stack([starts, lengths], 1).astype(np.int64)
    starts, lengths = data.window_starts(valid, s["eval_batch_size"], s["bptt"], train=False)
    arrays["valid_windows"] = np.stack([starts, lengths], 1).astype(np.int64)
    np.savez(spec["data_path"], **arrays)

    keras.utils.set_random_seed(s["seed"])
    model = build_model(config, vocab_size)
    model.build()
    weights = export_keras_roles(model)
    np.savez(spec["weights_path"], **weights)
    return {"status": "ok", "vocab_size": vocab_size, "optimal_perplexity": optimal,
            "corpus": corpus.name, "params": int(model.count_params()),
            "roles": {k: list(v.shape) for k, v in weights.items()},
            "keras_paths": [v.path for v in model.trainable_weights],
            "train_tokens": int(len(corpus.train)), "valid_tokens": int(len(corpus.valid)),
            "windows_per_epoch": [int(len(arrays[f"train_windows_{e}"]))
                                  for e in range(epochs)],
            "init_backend": keras.backend.backend()}


class _WindowSource:
    """The windows (start, length) of one pass over `streams`, as a Keras dataset."""

    def __init__(self, streams, windows):
        self.streams = streams
        self.windows = [(int(a), int(b)) for a, b in windows]

    def tokens(self):
        return [self.streams.shape[0] * n for _, n in self.windows]

    def window(self, i):
        start, length = self.windows[i]
        return (np.ascontiguousarray(self.streams[:, start:start + length]),
                np.ascontiguousarray(self.streams[:, start + 1:start + 1 + length]))

    def keras_dataset(self, backend, pad_to_multiple=1):
        """tf.data on TensorFlow (as `tflm.data.lm_dataset` builds it: slices of a constant
        streams tensor), a `keras.utils.PyDataset` of NumPy windows on JAX / PyTorch; windows
        padded to a multiple of `pad_to_multiple` positions as `lm_dataset` pads them."""
        from tflm.data import pad_window, pad_window_tensors
        multiple = int(pad_to_multiple)
        if backend == "tensorflow":
            import tensorflow as tf
            streams = tf.constant(self.streams, tf.int32)
            batch = self.streams.shape[0]
            pairs = np.asarray(self.windows, dtype=np.int64).reshape(-1, 2)

            def cut(start, length):
                start, length = tf.cast(start, tf.int32), tf.cast(length, tf.int32)
                x = tf.slice(streams, tf.stack([0, start]), tf.stack([batch, length]))
                y = tf.slice(streams, tf.stack([0, start + 1]), tf.stack([batch, length]))
                x, y = pad_window_tensors(x, y, multiple)
                return tf.ensure_shape(x, (batch, None)), tf.ensure_shape(y, (batch, None))

            ds = tf.data.Dataset.from_tensor_slices((pairs[:, 0], pairs[:, 1]))
            return ds.map(cut, num_parallel_calls=tf.data.AUTOTUNE,
                          deterministic=True).prefetch(tf.data.AUTOTUNE)
        import keras
        source = self

        class Windows(keras.utils.PyDataset):
            def __len__(self):
                return len(source.windows)

            def __getitem__(self, i):
                return pad_window(*source.window(i), multiple)

        return Windows()

    def subset(self, indices):
        return _WindowSource(self.streams, [self.windows[i] for i in indices])


def _device_report(backend, device):
    """(on_gpu, device name) for a Keras backend; raises Skip if a GPU was asked for and
    this framework sees none."""
    if backend == "tensorflow":
        import tensorflow as tf
        gpus = tf.config.list_physical_devices("GPU")
        name = gpus[0].name if gpus else None
    elif backend == "jax":
        import jax
        devs = [d for d in jax.devices() if d.platform == "gpu"]
        name = devs[0].device_kind if devs else None
    else:
        import torch
        name = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    if device == "gpu" and name is None:
        raise Skip(f"--device gpu: no GPU visible to {backend}")
    if device == "gpu":
        return True, name
    return False, f"CPU ({cpu_name()}, {os.cpu_count()} cores)"


def _gpu_peak_mib(backend):
    if backend == "tensorflow":
        import tensorflow as tf
        return tf.config.experimental.get_memory_info("GPU:0")["peak"] / 2 ** 20
    if backend == "jax":
        import jax
        dev = [d for d in jax.devices() if d.platform == "gpu"][0]
        return dev.memory_stats()["peak_bytes_in_use"] / 2 ** 20
    import torch
    return torch.cuda.max_memory_allocated() / 2 ** 20


def _versions(backend):
    import keras
    out = {"python": platform.python_version(), "numpy": np.__version__,
           "keras": keras.__version__}
    if backend == "tensorflow":
        import tensorflow as tf
        out["tensorflow"] = tf.__version__
    elif backend == "jax":
        import jax
        import jaxlib
        out["jax"] = jax.__version__
        out["jaxlib"] = jaxlib.__version__
    else:
        import torch
        out["torch"] = torch.__version__
    return out


def make_step_timer(counter):
    """Keras callback: wall time, running loss and whether the step (re)traced, per step."""
    import keras

    class StepTimer(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.times, self.losses, self.nlls, self.traced = [], [], [], []
            self._t0 = None
            self._traces = 0

        def on_train_batch_begin(self, batch, logs=None):
            self._traces = counter["train"]
            self._t0 = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            loss = _scalar(logs["loss"])  # a blocking fetch: the step has finished
            nll = _scalar(logs["nll"])
            self.times.append(time.perf_counter() - self._t0)
            self.losses.append(loss)
            self.nlls.append(nll)
            self.traced.append(counter["train"] > self._traces)

    return StepTimer()


def _scalar(value):
    import keras
    return float(np.asarray(keras.ops.convert_to_numpy(value)).reshape(-1)[0])


def _instrument(model, backend):
    """Count Python executions of train/test steps (= traces under tf.function / jax.jit)
    and calls of the backend's fused LSTM kernel (cuDNN on a GPU)."""
    from keras.src import backend as keras_backend
    counter = {"train": 0, "test": 0, "fused_lstm_calls": 0, "fused_lstm_returned": 0}
    train_step, test_step = model.train_step, model.test_step

    def counted_train_step(*args):
        counter["train"] += 1
        return train_step(*args)

    def counted_test_step(*args):
        counter["test"] += 1
        return test_step(*args)

    model.train_step = counted_train_step
    model.test_step = counted_test_step
    fused = keras_backend.lstm

    def probe(*args, **kwargs):
        counter["fused_lstm_calls"] += 1
        out = fused(*args, **kwargs)  # NotImplementedError: no fused kernel for this call
        counter["fused_lstm_returned"] += 1
        return out

    keras_backend.lstm = probe
    return counter


def _pad_to_multiple(setting, backend):
    """--pad-to-multiple for one backend: auto = zoo.train's rule (4 on JAX, 1 elsewhere)."""
    if setting in (None, "auto"):
        from tflm.data import default_pad_to_multiple
        return default_pad_to_multiple(backend)
    return int(setting)


def _keras_evaluate(model, source, backend, pad=1):
    """(perplexity, words/s) over `source`: a compile warm-up on the first and last window
    shapes first, then a timed pass (blocking: evaluate returns Python floats)."""
    n = len(source.windows)
    warm = source.subset(sorted({0, n - 1}))
    model.evaluate(warm.keras_dataset(backend, pad), verbose=0, return_dict=True)
    t0 = time.perf_counter()
    logs = model.evaluate(source.keras_dataset(backend, pad), verbose=0, return_dict=True)
    seconds = time.perf_counter() - t0
    return float(logs["perplexity"]), float(sum(source.tokens()) / seconds), seconds


def run_keras(spec):
    backend = spec["backend"]
    import keras

    from tflm.optimizers import SGD
    from zoo.train import build_model

    if keras.backend.backend() != backend:
        raise RuntimeError(f"KERAS_BACKEND={keras.backend.backend()!r}, expected {backend!r}")
    on_gpu, device_name = _device_report(backend, spec["device"])
    config = spec["config"]
    s = training_settings(config)
    data = np.load(spec["data_path"])
    init = dict(np.load(spec["weights_path"]))
    vocab_size = int(init["embedding"].shape[0])
    if spec["precision"] != "float32":
        keras.mixed_precision.set_dtype_policy(spec["precision"])
    keras.utils.set_random_seed(s["seed"])
    model = build_model(config, vocab_size)
    model.build()
    load_keras_roles(model, init)
    jit = True if backend == "jax" else bool(spec["jit"])
    model.compile(optimizer=SGD(s["lr"]), jit_compile=jit)
    counter = _instrument(model, backend)
    rss_built = rss_mib()
    pad = _pad_to_multiple(spec.get("pad_to_multiple"), backend)

    train_source = _WindowSource(data["train_streams"], data["train_windows_0"])
    steps = min(int(spec["steps"]), len(train_source.windows))
    steps_source = train_source.subset(range(steps))
    eval_source = _eval_source(data, spec)

    timer = make_step_timer(counter)
    t0 = time.perf_counter()
    model.fit(steps_source.keras_dataset(backend, pad), epochs=1, verbose=0,
              callbacks=[timer])
    steps_wall = time.perf_counter() - t0
    tokens = steps_source.tokens()
    result = _step_summary(spec, tokens, timer.times, timer.losses, timer.nlls,
                           timer.traced if backend != "torch" else None)
    result["steps_wall_s"] = steps_wall
    result["train_traces"] = counter["train"] if backend != "torch" else None
    if spec.get("save_weights"):
        np.savez(spec["weights_after_path"], **export_keras_roles(model))
    ppl, eval_wps, eval_s = _keras_evaluate(model, eval_source, backend, pad)
    result.update(valid_perplexity_after_steps=ppl, eval_words_per_s=eval_wps, eval_s=eval_s,
                  eval_windows=len(eval_source.windows),
                  eval_tokens=int(sum(eval_source.tokens())))

    result["epochs"] = []
    if int(spec.get("epochs", 0)) > 0:
        load_keras_roles(model, init)
        model.optimizer.iterations.assign(0)
        keras.utils.set_random_seed(s["seed"])
        ppl0, _, _ = _keras_evaluate(model, eval_source, backend, pad)
        curve = [{"epoch": 0, "train_time_s": 0.0, "val_perplexity": ppl0}]
        elapsed = 0.0
        for epoch in range(int(spec["epochs"])):
            source = _WindowSource(data["train_streams"], data[f"train_windows_{epoch}"])
            t0 = time.perf_counter()
            hist = model.fit(source.keras_dataset(backend, pad), epochs=1, verbose=0)
            seconds = time.perf_counter() - t0
            elapsed += seconds
            val, _, _ = _keras_evaluate(model, eval_source, backend, pad)
            curve.append({"epoch": epoch + 1, "train_time_s": elapsed, "epoch_s": seconds,
                          "val_perplexity": val,
                          "train_perplexity": float(hist.history["perplexity"][-1]),
                          "epoch_words_per_s": float(sum(source.tokens()) / seconds)})
        result["epochs"] = curve

    result.update(
        params=int(model.count_params()), on_gpu=on_gpu, device=device_name,
        pad_to_multiple=pad,
        versions=_versions(backend),
        jit=("XLA (jax.jit)" if backend == "jax" else
             ("XLA" if jit else "tf.function graph") if backend == "tensorflow" else
             ("torch.compile" if jit else "eager")),
        fused_lstm_calls=counter["fused_lstm_calls"],
        fused_lstm_returned=counter["fused_lstm_returned"],
        cudnn=_keras_cudnn(backend, on_gpu, counter),
        rss_after_build_mib=rss_built)
    _memory(result, backend, on_gpu)
    result["matmul_flops"] = _matmul_rate(on_gpu, spec["precision"])
    return result


def _keras_cudnn(backend, on_gpu, counter):
    if not on_gpu:
        return "no"
    if backend == "torch":
        import torch
        return "yes" if torch.backends.cudnn.is_available() else "no"
    return "yes" if counter["fused_lstm_returned"] else "no"


def _memory(result, backend, on_gpu):
    result["peak_rss_mib"] = peak_rss_mib()
    if on_gpu:
        result["peak_memory_mib"] = (_gpu_peak_mib(backend) if backend != "torch-native"
                                     else _gpu_peak_mib("torch"))
        result["memory_kind"] = "GPU allocator peak"
    else:
        result["peak_memory_mib"] = result["peak_rss_mib"]
        result["memory_kind"] = "peak RSS"


def _matmul_rate(on_gpu, precision):
    """GPU: torch GEMM rate in the run's precision; CPU: None (measured at start in main)."""
    if not on_gpu:
        return None
    try:
        return torch_cuda_matmul_rate("bfloat16" if precision == "mixed_bfloat16"
                                      else "float32")
    except Exception:  # torch missing or no CUDA build: no GPU rate
        return None


def _eval_source(data, spec):
    source = _WindowSource(data["valid_streams"], data["valid_windows"])
    limit = int(spec.get("eval_windows") or 0)
    if limit and limit < len(source.windows):
        source = source.subset(range(limit))
    return source


def _step_summary(spec, tokens, times, losses, nlls, traced):
    warmup = min(int(spec["warmup"]), max(0, len(times) - 1))
    # Keras logs running (token-weighted) means; recover each step's own value from them.
    step_losses, step_nlls = [], []
    total = 0
    for i, n in enumerate(tokens[:len(losses)]):
        prev = total
        total += n
        if i == 0:
            step_losses.append(losses[0])
            step_nlls.append(nlls[0])
        else:
            step_losses.append((losses[i] * total - losses[i - 1] * prev) / n)
            step_nlls.append((nlls[i] * total - nlls[i - 1] * prev) / n)
    return {
        "steps": len(times), "warmup": warmup, "step_tokens": tokens[:len(times)],
        "step_times_s": times, "running_loss": losses, "running_nll": nlls,
        "step_losses": step_losses, "step_nlls": step_nlls,
        "step_traced": traced,
        "first_step_loss": losses[0] if losses else None,
        "first_step_nll": nlls[0] if nlls else None,
        "train_perplexity": math.exp(nlls[-1]) if nlls else None,
        "train_words_per_s": median_words_per_s(tokens, times, skip=warmup),
        "train_words_per_s_end_to_end": (float(sum(tokens[:len(times)]) / sum(times))
                                         if times else None),
        "train_words_per_s_steady": median_words_per_s(tokens, times, skip=warmup,
                                                       exclude=traced),
    }


# ---- torch-native side --------------------------------------------------------------------
def run_native(spec):
    import torch

    from tools.torch_native import NativeTrainer, from_model_config

    config = spec["config"]
    s = training_settings(config)
    if spec["device"] == "gpu":
        if not torch.cuda.is_available():
            raise Skip("--device gpu: no GPU visible to torch")
        device = torch.device("cuda")
        device_name = torch.cuda.get_device_name(0)
    else:
        device = torch.device("cpu")
        device_name = f"CPU ({cpu_name()}, {os.cpu_count()} cores)"
    data = np.load(spec["data_path"])
    init = dict(np.load(spec["weights_path"]))
    vocab_size = int(init["embedding"].shape[0])
    torch.manual_seed(s["seed"])
    try:
        model = from_model_config(config["model"], vocab_size, seed=s["seed"])
    except ValueError as err:
        raise Skip(f"torch-native: {err}") from err
    model.load_roles(init)
    model.to(device)
    model.set_seed(s["seed"])
    autocast = torch.bfloat16 if spec["precision"] == "mixed_bfloat16" else None
    trainer = NativeTrainer(model, s["lr"], s["bptt"], s["clip_norm"], s["weight_decay"],
                            autocast_dtype=autocast)
    if spec["jit"]:
        trainer.forward = torch.compile(model)
    rss_built = rss_mib()
    train_streams = torch.as_tensor(data["train_streams"], dtype=torch.long, device=device)
    valid_streams = torch.as_tensor(data["valid_streams"], dtype=torch.long, device=device)
    windows = [(int(a), int(b)) for a, b in data["train_windows_0"]]
    steps = min(int(spec["steps"]), len(windows))
    batch = train_streams.shape[0]

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    def train_pass(pass_windows, record=None):
        trainer.reset("train")
        loss_sum = nll_sum = 0.0
        tokens = 0
        for start, length in pass_windows:
            x = train_streams[:, start:start + length]
            y = train_streams[:, start + 1:start + 1 + length]
            t0 = time.perf_counter()
            loss, nll = trainer.train_step(x, y)
            loss, nll = float(loss), float(nll)  # blocking fetch, as in the Keras workers
            seconds = time.perf_counter() - t0
            n = batch * length
            tokens += n
            loss_sum += loss * n
            nll_sum += nll * n
            if record is not None:
                record["times"].append(seconds)
                record["losses"].append(loss_sum / tokens)
                record["nlls"].append(nll_sum / tokens)
        return nll_sum / max(tokens, 1)

    eval_windows = [(int(a), int(b)) for a, b in data["valid_windows"]]
    limit = int(spec.get("eval_windows") or 0)
    if limit:
        eval_windows = eval_windows[:limit]
    eval_batch = valid_streams.shape[0]

    def evaluate(windows_):
        trainer.reset("eval")
        total, tokens = 0.0, 0
        for start, length in windows_:
            x = valid_streams[:, start:start + length]
            y = valid_streams[:, start + 1:start + 1 + length]
            total += float(trainer.eval_step(x, y))
            tokens += eval_batch * length
        return math.exp(total / tokens), tokens

    def timed_evaluate():
        evaluate(sorted({eval_windows[0], eval_windows[-1]}))
        sync()
        t0 = time.perf_counter()
        ppl, tokens = evaluate(eval_windows)
        sync()
        seconds = time.perf_counter() - t0
        return ppl, tokens / seconds, seconds, tokens

    record = {"times": [], "losses": [], "nlls": []}
    t0 = time.perf_counter()
    train_pass(windows[:steps], record)
    steps_wall = time.perf_counter() - t0
    tokens = [batch * n for _, n in windows[:steps]]
    result = _step_summary(spec, tokens, record["times"], record["losses"], record["nlls"],
                           None)
    result["steps_wall_s"] = steps_wall
    result["train_traces"] = None
    if spec.get("save_weights"):
        np.savez(spec["weights_after_path"], **model.export_roles())
    ppl, eval_wps, eval_s, eval_tokens = timed_evaluate()
    result.update(valid_perplexity_after_steps=ppl, eval_words_per_s=eval_wps, eval_s=eval_s,
                  eval_windows=len(eval_windows), eval_tokens=eval_tokens)

    result["epochs"] = []
    if int(spec.get("epochs", 0)) > 0:
        model.load_roles(init)
        model.set_seed(s["seed"])
        ppl0 = timed_evaluate()[0]
        curve = [{"epoch": 0, "train_time_s": 0.0, "val_perplexity": ppl0}]
        elapsed = 0.0
        for epoch in range(int(spec["epochs"])):
            ws = [(int(a), int(b)) for a, b in data[f"train_windows_{epoch}"]]
            t0 = time.perf_counter()
            nll = train_pass(ws)
            sync()
            seconds = time.perf_counter() - t0
            elapsed += seconds
            curve.append({"epoch": epoch + 1, "train_time_s": elapsed, "epoch_s": seconds,
                          "val_perplexity": timed_evaluate()[0],
                          "train_perplexity": math.exp(nll),
                          "epoch_words_per_s": batch * sum(n for _, n in ws) / seconds})
        result["epochs"] = curve

    result.update(
        params=int(sum(p.numel() for p in model.parameters())), on_gpu=device.type == "cuda",
        device=device_name,
        versions={"python": platform.python_version(), "numpy": np.__version__,
                  "torch": torch.__version__},
        jit="torch.compile" if spec["jit"] else "eager",
        cudnn=("yes" if device.type == "cuda" and torch.backends.cudnn.is_available()
               and torch.backends.cudnn.enabled else "no"),
        rss_after_build_mib=rss_built)
    _memory(result, "torch-native", device.type == "cuda")
    result["matmul_flops"] = _matmul_rate(device.type == "cuda", spec["precision"])
    return result


def set_threads(spec):
    """Pin the framework's CPU thread pools to `spec["threads"]` (0: leave the defaults).

    The environment (OMP/MKL/OpenBLAS, TF_NUM_*, XLA_FLAGS) is set by the parent before this
    process starts; the calls below make it explicit where a framework has an API."""
    n = int(spec.get("threads") or 0)
    if not n:
        return
    backend = spec.get("backend")
    if backend in ("torch", "torch-native"):
        import torch
        torch.set_num_threads(n)
        try:
            torch.set_num_interop_threads(n)
        except RuntimeError:  # already set (parallel work started)
            pass
    elif backend == "tensorflow":
        import tensorflow as tf
        tf.config.threading.set_intra_op_parallelism_threads(n)
        tf.config.threading.set_inter_op_parallelism_threads(n)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    spec = load_spec(argv[0])
    started = time.perf_counter()
    # The machine's GEMM rate, before any framework starts its thread pools.
    matmul = numpy_matmul_rate() if spec.get("phase") == "run" else None
    try:
        set_threads(spec)
        if spec["phase"] == "init":
            result = run_init(spec)
        elif spec["backend"] == "torch-native":
            result = run_native(spec)
        else:
            result = run_keras(spec)
        result.setdefault("status", "ok")
    except Skip as err:
        result = {"status": "skipped", "reason": str(err)}
    except Exception as err:  # reported in the table; the traceback goes to the log
        traceback.print_exc()
        message = " ".join(str(err).split())
        if "cannot be changed after initialization" in message and spec.get("jit"):
            message = ("XLA (jit_compile=True) cannot assign the TensorFlow stream-state "
                       "variables of shape (None, units) a new batch shape; " + message)
        result = {"status": "failed", "reason": f"{type(err).__name__}: {message}"[:500]}
    if matmul and result.get("status") == "ok" and not result.get("on_gpu"):
        result["matmul_flops"] = matmul
    result["backend"] = spec.get("backend")
    result["worker_wall_s"] = time.perf_counter() - started
    with open(spec["result_path"], "w") as f:
        json.dump(result, f, indent=1)
    return 0 if result["status"] != "failed" else 1


if __name__ == "__main__":
    sys.exit(main())
