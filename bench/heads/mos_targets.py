"""MoS training: the targets' log-probabilities alone against the batched mixture picked
at the targets, on JAX or Keras on PyTorch.

`targets` is what a train step of an MoS model computes (`Backend.
mixture_target_log_probs`): on JAX chunk by chunk, no (B, T, K, V) tensor formed or kept
(`tflm.backends.jax_mixture_target_log_probs`); on PyTorch, at this size, each
component's logits once and their log-sum-exp, no log-mixture, and `chunked` (PyTorch
only) is what it computes past `torch_mixture_target_log_probs.WHOLE_WINDOW_ELEMENTS`:
chunks under checkpointing. `batched` is what both computed before and what
TensorFlow computes (`tflm.layers.mos.mixture_log_probs`, the (B, T, V) log-probabilities,
then the targets'). Each is the training loss -mean log P(y) and its gradient with respect
to the components h `(B, T, K, L)`, the log prior and the tied output layer's W and b (JAX:
jit-compiled; PyTorch: eager autograd), at the MoS PTB preset's head size (B=12, T=70,
K=15, V=10,000, L=280), each in a fresh process: the median of `--repeats` timed steps
after the first one, and the peak memory above what the process held before the first
step (CPU: resident memory; GPU: the allocator's peak).

    python -m bench.heads.mos_targets [--backend jax|torch] [--batch 12] [--repeats 5]
        [--device cpu|gpu] [--no-publish] [--json PATH]

Writes results/mos_targets.md (JAX) or results/mos_targets_torch.md beside this script
(`bench.harness.publish`).
"""

import argparse
import json
import os
import statistics
import subprocess
import time

from bench.harness import REPO, module_command, publish, results_path
from tools.frameworks.machine import current_rss_mib, peak_rss_mib

K, V, L, T = 15, 10_000, 280, 70
MODES = ("batched", "targets")


def _inputs(batch):
    """h (tanh'ed), the prior's logits, W (scaled by 0.1), b and the targets, float32 /
    int32 NumPy arrays drawn from one seed: the same for every backend and mode."""
    import numpy as np  # deferred: with the child's other imports

    rng = np.random.default_rng(0)
    h, prior, weight, bias = (rng.normal(size=s).astype("float32") for s in
                              ((batch, T, K, L), (batch, T, K), (V, L), (V,)))
    return (np.tanh(h), prior, (0.1 * weight).astype("float32"), bias,
            rng.integers(0, V, (batch, T)).astype("int32"))


def torch_child(mode, batch, repeats, device):
    # deferred: the child loads Keras and PyTorch with the environment its parent set
    import torch

    from tflm import backends
    from tflm.backends import torch_mixture_target_log_probs
    from tflm.layers.mos import mixture_log_probs

    on = torch.device("cuda" if device == "gpu" else "cpu")
    h, prior, weight, bias, y = (torch.as_tensor(a, device=on) for a in _inputs(batch))
    y = y.long()
    leaves = [t.detach().requires_grad_(True)
              for t in (h, torch.log_softmax(prior, -1), weight, bias)]

    def step():
        h, log_prior, weight, bias = leaves
        if mode == "targets":
            picked = backends.current().mixture_target_log_probs(h, log_prior, weight, bias, y)
        elif mode == "chunked":
            picked = torch_mixture_target_log_probs.mixture_target_log_probs(
                h, log_prior, weight, bias, y)
        else:
            full = mixture_log_probs(h @ weight.T + bias, log_prior)
            picked = torch.gather(full, -1, y[..., None])[..., 0]
        loss = -picked.mean()
        grads = torch.autograd.grad(loss, leaves)
        if device == "gpu":
            torch.cuda.synchronize()
        return loss, grads

    base = current_rss_mib()
    if device == "gpu":
        torch.cuda.reset_peak_memory_stats()
        allocated = torch.cuda.memory_allocated()
    started = time.perf_counter()
    value, grads = step()
    first = time.perf_counter() - started
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        step()
        times.append(time.perf_counter() - started)
    if device == "gpu":
        peak = (torch.cuda.max_memory_allocated() - allocated) / 2**20
    else:
        peak = peak_rss_mib() - base
    print(json.dumps({"seconds": statistics.median(times), "first_seconds": first,
                      "peak_mib": peak, "loss": float(value),
                      "grad_norms": [float(torch.linalg.norm(g)) for g in grads]}))


def child(mode, batch, repeats, device):
    # deferred: the child loads JAX with the environment its parent set
    import jax
    import jax.numpy as jnp

    from tflm.backends.jax_mixture_target_log_probs import mixture_target_log_probs
    from tflm.layers.mos import mixture_log_probs

    h, prior, weight, bias, y = (jnp.asarray(a) for a in _inputs(batch))
    log_prior = jax.nn.log_softmax(prior, -1)

    def loss(h, log_prior, weight, bias):
        if mode == "targets":
            picked = mixture_target_log_probs(h, log_prior, weight, bias, y)
        else:
            full = mixture_log_probs(h @ weight.T + bias, log_prior)
            picked = jnp.take_along_axis(full, y[..., None], -1)[..., 0]
        return -jnp.mean(picked)

    step = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2, 3)))
    args = (h, log_prior, weight, bias)
    base = current_rss_mib()
    started = time.perf_counter()
    value, grads = jax.block_until_ready(step(*args))
    first = time.perf_counter() - started
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        jax.block_until_ready(step(*args))
        times.append(time.perf_counter() - started)
    if device == "gpu":
        stats = jax.devices()[0].memory_stats() or {}
        peak = stats.get("peak_bytes_in_use", 0) / 2**20
    else:
        peak = peak_rss_mib() - base
    print(json.dumps({"seconds": statistics.median(times), "first_seconds": first,
                      "peak_mib": peak, "loss": float(value),
                      "grad_norms": [float(jnp.linalg.norm(g)) for g in grads]}))


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--backend", choices=("jax", "torch"), default="jax")
    p.add_argument("--batch", type=int, default=12)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    p.add_argument("--no-publish", action="store_true")
    p.add_argument("--json", help="also write the rows here")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        run = child if args.backend == "jax" else torch_child
        return run(args.child, args.batch, args.repeats, args.device)
    env = dict(os.environ, KERAS_BACKEND=args.backend, TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=os.pathsep.join(filter(None, [str(REPO),
                                                        os.environ.get("PYTHONPATH")])))
    if args.device == "cpu":
        env.update(JAX_PLATFORMS="cpu", CUDA_VISIBLE_DEVICES="")
    modes = MODES + (("chunked",) if args.backend == "torch" else ())
    rows = {}
    for mode in modes:
        out = subprocess.run(module_command(__spec__.name, "--child", mode, "--backend",
                                            args.backend, "--batch", args.batch,
                                            "--repeats", args.repeats, "--device",
                                            args.device),
                             env=env, capture_output=True, text=True, check=True, cwd=REPO)
        rows[mode] = json.loads(out.stdout.strip().splitlines()[-1])
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump(rows, f, indent=1)
    tensor_mib = args.batch * T * K * V * 4 / 2**20
    base = rows["batched"]
    load = os.getloadavg()
    agree = max(abs(a - b) / max(abs(b), 1e-12) for mode in modes[1:] for a, b in zip(
        [rows[mode]["loss"], *rows[mode]["grad_norms"]], [base["loss"], *base["grad_norms"]]))
    how = {"jax": ("JAX", "chunk by chunk", "jit-compiled"),
           "torch": ("Keras on PyTorch", "each component's logits once", "eager autograd")}
    name, targets, run = how[args.backend]
    title = (f"MoS training on {name} ({args.device}): the targets alone, {targets}, against "
             f"the batched mixture (B={args.batch}, T={T}, K={K}, V={V:,}, L={L}; one "
             f"B*T*K*V float32 tensor = {tensor_mib:,.0f} MiB)")
    memory = "the allocator's peak" if args.device == "gpu" else (
        "the process's peak resident memory above what it held before the first step")
    lines = [f"Loss and its gradient, {run}; seconds: the median of {args.repeats} "
             f"steps after the first one; peak: {memory} (MiB, and in B*T*K*V tensors). "
             f"Load average at the start: {load[0]:.2f}/{load[1]:.2f}/{load[2]:.2f}. The "
             f"loss and the gradients' norms agree to {agree:.1e} (relative).", "",
             "| mode | seconds (median) | first step s | peak MiB | peak / tensor | time "
             "ratio | memory ratio |", "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for mode in modes:
        r = rows[mode]
        lines.append(f"| {mode} | {r['seconds']:.3f} | {r['first_seconds']:.2f} | "
                     f"{r['peak_mib']:,.0f} | {r['peak_mib'] / tensor_mib:.2f} | "
                     f"{r['seconds'] / base['seconds']:.2f} | "
                     f"{r['peak_mib'] / max(base['peak_mib'], 1e-9):.2f} |")
    publish(title, "\n".join(lines),
            None if args.no_publish else results_path(
                __file__, "mos_targets.md" if args.backend == "jax" else "mos_targets_torch.md"))
    return rows


if __name__ == "__main__":
    main()
