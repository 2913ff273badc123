"""The native PyTorch peer's run (`tools.frameworks.torch_native`): plain PyTorch, no Keras.

Same weights, windows, seeds and steps as the Keras runners (from the shared start files),
the salesforce/awd-lstm-lm loop: `torch.lstm` with the weight-dropped matrix, global-norm
clipping, `torch.optim.SGD` with lr * T / bptt. Only the torch-native worker imports this
module.
"""

import math
import time

import numpy as np
import torch

from tools.frameworks.machine import current_rss_mib
from tools.frameworks.measure import (Skip, add_memory, cpu_description, gpu_matmul_rate,
                                      versions)
from tools.frameworks.settings import training_settings
from zoo.runs.settings import TrainingSettings
from tools.frameworks.timing import StepRecord, step_summary
from tools.frameworks.torch_native import NativeTrainer, from_model_config


def epoch_rate(training, lr, epoch):
    """The learning rate of the 0-based `epoch` under `training.lr_decay` (the PTB
    tutorial's per-epoch decay after `decay_after` epochs; `tflm.epoch_decay`; `training`
    the run's `TrainingSettings`), else lr. (`training.when` is not mirrored here.)"""
    if training.lr_decay is None:
        return lr
    from tflm.epoch_decay import decayed_rate  # deferred: `import tflm` loads Keras
    return decayed_rate(lr, training.lr_decay, training.decay_after, epoch)


def _windows(array):
    return [(int(a), int(b)) for a, b in array]


def run_native(spec):
    rss_imports = current_rss_mib()  # PyTorch (and zoo's settings) imported
    config = spec["config"]
    s = training_settings(config)
    training = TrainingSettings.from_dict(config["training"])
    if spec["device"] == "gpu":
        if not torch.cuda.is_available():
            raise Skip("--device gpu: no GPU visible to torch")
        device = torch.device("cuda")
        device_name = torch.cuda.get_device_name(0)
    else:
        device = torch.device("cpu")
        device_name = cpu_description()
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
                            autocast_dtype=autocast, loss_reduction=s["loss_reduction"],
                            scale_by_window=s["scale_by_window"])
    if spec["jit"]:
        trainer.forward = torch.compile(model)
    rss_built = current_rss_mib()
    train_streams = torch.as_tensor(data["train_streams"], dtype=torch.long, device=device)
    valid_streams = torch.as_tensor(data["valid_streams"], dtype=torch.long, device=device)
    windows = _windows(data["train_windows_0"])
    steps = min(int(spec["steps"]), len(windows))
    batch = train_streams.shape[0]

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    def train_pass(pass_windows, record=None):
        trainer.reset("train")
        nll_sum, tokens = 0.0, 0
        for start, length in pass_windows:
            x = train_streams[:, start:start + length]
            y = train_streams[:, start + 1:start + 1 + length]
            t0 = time.perf_counter()
            loss, nll = trainer.train_step(x, y)
            loss, nll = float(loss), float(nll)  # blocking fetch, as in the Keras runners
            seconds = time.perf_counter() - t0
            tokens += batch * length
            nll_sum += nll * batch * length
            if record is not None:
                record.add(seconds, loss, nll, batch * length)
        return nll_sum / max(tokens, 1)

    eval_windows = _windows(data["valid_windows"])
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

    record = StepRecord()
    t0 = time.perf_counter()
    train_pass(windows[:steps], record)
    steps_wall = time.perf_counter() - t0
    result = step_summary(record, spec["warmup"], eager=True)
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
            trainer.lr = epoch_rate(training, s["lr"], epoch)
            ws = _windows(data[f"train_windows_{epoch}"])
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

    on_gpu = device.type == "cuda"
    result.update(
        # trained parameters (the Zaremba peer's LSTMs hold an untrained zero b_hh)
        params=int(sum(p.numel() for p in model.parameters() if p.requires_grad)),
        on_gpu=on_gpu,
        device=device_name, versions=versions("torch-native"),
        jit="torch.compile" if spec["jit"] else "eager", lstm_kernel="fused",
        cudnn=("yes" if on_gpu and torch.backends.cudnn.is_available()
               and torch.backends.cudnn.enabled else "no"),
        rss_after_build_mib=rss_built)
    add_memory(result, "torch", on_gpu, rss_after_imports=rss_imports)
    result["matmul_flops"] = gpu_matmul_rate(spec["precision"]) if on_gpu else None
    return result
