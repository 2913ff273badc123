"""The rank tools on a GPU (issue 17): the PTB pipeline end to end, exact singular values of
a PTB-test-sized matrix with torch / CuPy / JAX kernels against the device's measured
floors, and the MoS head's mixture (batched vs sequential) in time and peak device memory.

Made for the lent GPU machine, whose image has PyTorch, JAX and CuPy but not TensorFlow:
Keras runs on PyTorch (and JAX), carried as wheels (bench/README.md, "On a lent GPU
machine"). Every stage runs in its own process (a fresh allocator: peak device memory per
stage) and appends its figures to `OUT/gpu_results.json`; stages are skipped when the time
left (`--budget` seconds) is under their estimate, so a cut-off run still returns what it
measured.

Stages (in this order):

- pipeline-torch: what a user runs, timed as wall clock of the two commands, start-up
  included, on an `awd_lstm_ptb`-shaped model (random weights: the time does not depend on
  them) saved as .keras beforehand:
      KERAS_BACKEND=torch python -m tools.qmatrix model.keras --corpus ptb --out Q.npy
      python -m tools.rank Q.npy --device gpu --json rank.json
  (82,429 x 10,000 float32, batch-1 semantics; the issue's target: under 60 s in all).
- floors: float64 and float32 (TF32 off) GEMM rates, the Gram block product's rate, and
  host-to-device copies (pageable, as the tools copy, and pinned).
- matrix: the 82,430 x 10,000 float32 test matrix of bench/analysis/svd.py (X Y of rank 400,
  column scales 1 ... 1e-3, noise std 1e-6), written to a .npy file.
- svd-*: `tools.spectrum.singular_values(path, device="gpu")` by gram (torch, CuPy) and
  tsqr (torch), and a JAX Gram kernel written here (float64 accumulation,
  `jnp.linalg.eigvalsh`) for the JAX column.
- mos-torch, mos-jax: `MoSLayer` at the MoS PTB head size (B=12, T=70, K=15, V=10,000,
  L=280, input 620), forward and forward + backward, batched vs sequential.
- pipeline-jax: the export under KERAS_BACKEND=jax.
- svd-lapack-torch (last: the slowest, least needed): torch svdvals of the float32 matrix.

    python -m bench.analysis.gpu_rank_tools --out DIR --data-dir DIR [--budget 420] [--smoke]
    python -m bench.analysis.gpu_rank_tools --report DIR/gpu_results.json   # the tables again

`--smoke` runs every stage at toy sizes (on the CPU where there is no GPU) to check the
script before a lease. A run also writes the tables to results/gpu_rank_tools.md beside this
script (`bench.harness.publish`; `--no-publish`); results/gpu_rank_tools.json is the
results file of the H200 run those tables come from.
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

import numpy as np

import tools.spectrum as spectrum
from bench.harness import REPO, module_command, publish, results_path
from tools.qmatrix_io import open_q
from tools.rank import press_rank, press_threshold

RANK, NOISE = 400, 1e-6
MOS = dict(B=12, T=70, K=15, V=10_000, L=280, D=620)
ESTIMATES = {"pipeline-torch": 90, "floors": 20, "matrix": 40, "svd-gram-torch": 30,
             "svd-gram-cupy": 30, "svd-gram-jax": 40, "svd-tsqr-torch": 120,
             "svd-lapack-torch": 150, "mos-torch": 40, "mos-jax": 60, "pipeline-jax": 90}


# ------------------------------------------------------------------ helpers


def _sync():
    # deferred: a stage loads only the GPU library it measures
    import torch
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _timed(fn, repeats=5, warmup=1):
    """Median seconds of `fn()` (which must block until its work is done)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return float(np.median(times))


def _torch_device():
    # deferred: a stage loads only the GPU library it measures
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def _torch_peak_mib():
    # deferred: a stage loads only the GPU library it measures
    import torch
    return torch.cuda.max_memory_allocated() / 2**20 if torch.cuda.is_available() else None


def _sizes(smoke):
    return (20_000, 1_000) if smoke else (82_430, 10_000)


# ------------------------------------------------------------------ stages (children)


def stage_floors(args):
    # deferred: a stage loads only the GPU library it measures
    import torch
    dev = _torch_device()
    torch.backends.cuda.matmul.allow_tf32 = False
    size = 512 if args.smoke else 8192
    out = {"device": torch.cuda.get_device_name() if dev == "cuda" else "cpu",
           "torch": torch.__version__}
    for name, dt in (("fp64", torch.float64), ("fp32", torch.float32)):
        a = torch.randn(size, size, device=dev, dtype=dt)
        b = torch.randn(size, size, device=dev, dtype=dt)
        s = _timed(lambda: (a @ b, _sync()))
        out[f"gemm_{name}_tflops"] = 2 * size ** 3 / s / 1e12
    m, n = _sizes(args.smoke)
    x = torch.randn(512, n, device=dev, dtype=torch.float64)
    s = _timed(lambda: (x.T @ x, _sync()))
    out["gram_block_tflops"] = 2 * 512 * n * n / s / 1e12
    host = np.random.default_rng(0).standard_normal((4096, n), dtype=np.float32)
    s = _timed(lambda: (torch.from_numpy(host).to(dev), _sync()))
    out["h2d_pageable_gbs"] = host.nbytes / s / 1e9
    if dev == "cuda":
        pinned = torch.from_numpy(host).pin_memory()
        s = _timed(lambda: (pinned.to(dev, non_blocking=True), _sync()))
        out["h2d_pinned_gbs"] = host.nbytes / s / 1e9
    return out


def stage_matrix(args):
    # deferred: a stage loads only the GPU library it measures
    import torch
    dev = _torch_device()
    m, n = _sizes(args.smoke)
    path = pathlib.Path(args.work) / "q.npy"
    t0 = time.perf_counter()
    gen = torch.Generator(device=dev).manual_seed(0)
    scales = torch.logspace(0, -3, RANK, device=dev)
    y = torch.randn(RANK, n, device=dev, generator=gen) / RANK ** 0.5
    mm = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(m, n))
    for s in range(0, m, 8192):
        k = min(8192, m - s)
        blk = (torch.randn(k, RANK, device=dev, generator=gen) * scales) @ y
        blk += NOISE * torch.randn(k, n, device=dev, generator=gen)
        mm[s:s + k] = blk.cpu().numpy()
    mm.flush()
    del mm
    return {"shape": [m, n], "seconds": time.perf_counter() - t0,
            "bytes": int(path.stat().st_size)}


def _jax_gram(path):
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    # deferred: JAX reads its environment (no preallocation) when it loads
    import jax
    jax.config.update("jax_enable_x64", True)
    import jax.numpy as jnp  # deferred: as jax
    src = open_q(path)
    n = src.shape[1]
    add = jax.jit(lambda g, x: g + x.T @ x, donate_argnums=0)
    g = jnp.zeros((n, n), jnp.float64)
    for _, blk in src.iter_row_blocks(spectrum.GRAM_BLOCK_ROWS, check_finite=True):
        # A fresh host copy: the reader reuses its buffer, and JAX may read a host array
        # after the call returns (on a CPU it can alias it without copying).
        g = add(g, jax.device_put(np.array(blk, copy=True)).astype(jnp.float64))
    lam = np.asarray(jnp.linalg.eigvalsh(g))
    stats = jax.devices()[0].memory_stats() or {}
    return np.sqrt(np.clip(lam, 0, None))[::-1].copy(), stats.get("peak_bytes_in_use")


def stage_svd(args, method, backend):
    path = pathlib.Path(args.work) / "q.npy"
    out = {"method": method, "backend": backend}
    t0 = time.perf_counter()
    if backend == "jax":
        values, peak = _jax_gram(path)
        out["peak_mib"] = None if peak is None else peak / 2**20
        floor = None
    else:
        if backend == "cupy":
            spectrum._gpu_backend = lambda: ("cupy", None)
        elif _torch_device() == "cpu":  # --smoke without a GPU
            spectrum._gpu_backend = lambda: ("torch", "cpu")
        res = spectrum.singular_values(str(path), method=method, device="gpu")
        values, floor = res.values, res.floor
        out["block_rows"] = res.block_rows
        if backend == "cupy":
            import cupy  # deferred: a stage loads only the GPU library it measures
            out["peak_mib"] = cupy.get_default_memory_pool().total_bytes() / 2**20
            out["peak_note"] = "CuPy pool held at the end"
        else:
            out["peak_mib"] = _torch_peak_mib()
    out["seconds"] = time.perf_counter() - t0
    out["floor"] = floor
    np.save(pathlib.Path(args.work) / f"s_{method}_{backend}.npy", values)
    return out


MOS_CHILD = """
import json, sys, time
import numpy as np
import keras
from keras import ops
from tflm.layers import MoSLayer, TiedEmbedding
cfg, mixture, mode = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3]
B, T, K, V, L, D = (cfg[k] for k in "BTKVLD")
backend = keras.backend.backend()
head = MoSLayer(K, embedding=TiedEmbedding(V, L), mixture=mixture)
g = keras.random.normal((B, T, D), seed=0)
head(g[:1, :2])
if backend == "torch":
    import torch
    cuda = torch.cuda.is_available()
    def step():
        if mode == "forward":
            with torch.no_grad():
                y = head(g)[..., :1].sum()
        else:
            loss = -head(g)[..., 0].mean()
            y = torch.autograd.grad(loss, [v.value for v in head.trainable_variables])
        if cuda:
            torch.cuda.synchronize()
    def in_use():
        return torch.cuda.memory_allocated() if cuda else None
    def peak():
        return torch.cuda.max_memory_allocated() if cuda else None
    step()
    if cuda:
        torch.cuda.reset_peak_memory_stats()
else:
    import jax
    tv = [v.value for v in head.trainable_variables]
    ntv = [v.value for v in head.non_trainable_variables]
    def loss(tv, g):
        y, _ = head.stateless_call(tv, ntv, g)
        return -ops.mean(y[..., 0])
    fn = jax.jit(loss) if mode == "forward" else jax.jit(jax.grad(loss))
    def step():
        jax.block_until_ready(fn(tv, g))
    def stats():
        return jax.devices()[0].memory_stats() or {}
    def in_use():
        return stats().get("bytes_in_use")
    def peak():  # the process's high-water mark: one configuration per process
        return stats().get("peak_bytes_in_use")
    step()
base = in_use()
times = []
for _ in range(5):
    t0 = time.perf_counter(); step(); times.append(time.perf_counter() - t0)
p = peak()
print(json.dumps(dict(mixture=mixture, mode=mode, seconds=float(np.median(times)),
                      peak_mib=None if p is None else (p - base) / 2**20)))
"""


def stage_mos(args, backend):
    """Each (mixture, pass) in a fresh process: JAX's peak is a process high-water mark.
    Peak = the device's high-water mark during the steps above what the weights and the
    input held before them (the warm-up step, compiling on JAX, ran first)."""
    cfg = dict(MOS, **(dict(B=2, T=5, V=300) if args.smoke else {}))
    env = dict(os.environ, KERAS_BACKEND=backend, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    rows = []
    for mixture in ("batched", "sequential"):
        for mode in ("forward", "training"):
            done = subprocess.run([sys.executable, "-c", MOS_CHILD, json.dumps(cfg), mixture,
                                   mode], env=env, capture_output=True, text=True,
                                  timeout=args.stage_timeout, cwd=REPO)
            if done.returncode:
                raise RuntimeError(done.stderr[-3000:])
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return {"config": cfg, "rows": rows}


def stage_pipeline(args, backend):
    work = pathlib.Path(args.work) / f"pipeline-{backend}"
    work.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, KERAS_BACKEND=backend, XLA_PYTHON_CLIENT_PREALLOCATE="false")
    model = work / "model.keras"
    make = (f"import zoo; "
            f"m = zoo.from_preset('awd_lstm_ptb'); m.build(); m.save({str(model)!r})")
    subprocess.run([sys.executable, "-c", make], env=env, check=True, timeout=300,
                   capture_output=True, cwd=REPO)
    q = work / "q.npy"
    export = [sys.executable, "-m", "tools.qmatrix", str(model), "--corpus", "ptb",
              "--data-dir", args.data_dir, "--out", str(q)]
    if args.smoke:
        export += ["--max-rows", "700"]
    device = "gpu" if _torch_device() == "cuda" else "cpu"  # cpu: --smoke without a GPU
    rank = [sys.executable, "-m", "tools.rank", str(q), "--device", device, "--json",
            str(work / "rank.json")]
    out = {"backend": backend}
    for name, cmd in (("export", export), ("rank", rank)):
        t0 = time.perf_counter()
        done = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True,
                              timeout=args.stage_timeout)
        out[f"{name}_wall_s"] = time.perf_counter() - t0
        if done.returncode:
            raise RuntimeError(f"{' '.join(cmd)}: {done.stderr[-3000:]}")
        if name == "export":
            meta = json.loads(done.stdout[done.stdout.index("{"):])
            out.update(export_s=meta["seconds"], rows=meta["shape"][0],
                       rows_per_second=meta["rows_per_second"])
        else:
            report = json.loads((work / "rank.json").read_text())["reports"][0]
            out.update(rank_method=report["method"], rank_s=report["seconds"],
                       press_rank=report["press_rank"], table=done.stdout.strip())
    out["total_wall_s"] = out["export_wall_s"] + out["rank_wall_s"]
    q.unlink()
    return out


STAGES = {
    "pipeline-torch": lambda a: stage_pipeline(a, "torch"),
    "floors": stage_floors,
    "matrix": stage_matrix,
    "svd-gram-torch": lambda a: stage_svd(a, "gram", "torch"),
    "svd-gram-cupy": lambda a: stage_svd(a, "gram", "cupy"),
    "svd-gram-jax": lambda a: stage_svd(a, "gram", "jax"),
    "svd-tsqr-torch": lambda a: stage_svd(a, "tsqr", "torch"),
    "mos-torch": lambda a: stage_mos(a, "torch"),
    "mos-jax": lambda a: stage_mos(a, "jax"),
    "pipeline-jax": lambda a: stage_pipeline(a, "jax"),
    "svd-lapack-torch": lambda a: stage_svd(a, "lapack", "torch"),
}


# ------------------------------------------------------------------ driver


def run_all(args):
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results_file = out / "gpu_results.json"
    results = {"started": time.strftime("%Y-%m-%d %H:%M:%S"), "smoke": args.smoke,
               "stages": {}}
    deadline = time.monotonic() + args.budget
    for name in args.stages or list(STAGES):
        left = deadline - time.monotonic()
        if left < ESTIMATES[name] * (0.1 if args.smoke else 1.0):
            results["stages"][name] = {"skipped": f"{left:.0f} s left"}
            continue
        t0 = time.perf_counter()
        cmd = module_command(__spec__.name, "--child", name, "--work", args.work,
                             "--data-dir", args.data_dir, *["--smoke"] * args.smoke)
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO,
                                  timeout=min(left, args.stage_timeout))
            if done.returncode:
                result = {"error": done.stderr[-2500:]}
            else:
                result = json.loads(done.stdout.strip().splitlines()[-1])
        except subprocess.TimeoutExpired:
            result = {"error": f"timed out after {min(left, args.stage_timeout):.0f} s"}
        result["stage_wall_s"] = time.perf_counter() - t0
        results["stages"][name] = result
        print(f"{name}: {json.dumps(result)[:600]}", flush=True)
        results_file.write_text(json.dumps(results, indent=1))
    work = pathlib.Path(args.work)
    spectra = {p.stem: np.load(p) for p in sorted(work.glob("s_*.npy"))}
    if spectra:
        np.savez_compressed(out / "spectra.npz", **spectra)
        add_agreement(results, spectra)
    results_file.write_text(json.dumps(results, indent=1))
    publish(title(results), report(results), None if args.no_publish else args.results)


# ------------------------------------------------------------------ report


def _fmt(v, spec=",.1f"):
    return "-" if v is None else format(v, spec)


def add_agreement(results, spectra):
    """Each svd stage's Press rank and its largest relative difference from gram (torch) over
    the singular values above the float32 Press threshold, from the saved spectra."""
    shape = tuple(results["stages"].get("matrix", {}).get("shape", (0, 0)))
    ref = spectra.get("s_gram_torch")
    for name, r in results["stages"].items():
        s = spectra.get(f"s_{r.get('method')}_{r.get('backend')}")
        if not name.startswith("svd-") or s is None:
            continue
        r["press_rank"] = press_rank(s, shape, "float32")
        if ref is not None:
            keep = ref > press_threshold(ref[0], shape, "float32")
            r["max_rel_diff_vs_gram_torch"] = float(np.max(np.abs(s[keep] - ref[keep])
                                                           / ref[keep]))


def title(results):
    """The results file's title: the device of a gpu_results.json."""
    return f"The rank tools on {results['stages'].get('floors', {}).get('device', 'a GPU')}"


def report(results):
    """Markdown tables of a gpu_results.json."""
    st = results["stages"]
    fl = st.get("floors", {})
    lines = [f"Started {results['started']} on the lent GPU machine (one process per stage; "
             "Keras on PyTorch / JAX, no TensorFlow in its image). "
             + ("SMOKE RUN at toy sizes, not a measurement. " if results.get("smoke") else ""),
             ""]
    lines += ["### The PTB pipeline end to end (target: under 60 s)", "",
              "| Keras backend | export wall s (rows/s) | rank wall s (method, in-process s) | "
              "Press rank | total wall s |", "| --- | ---: | ---: | ---: | ---: |"]
    for name in ("pipeline-torch", "pipeline-jax"):
        p = st.get(name, {})
        if "total_wall_s" in p:
            lines.append(f"| {p['backend']} | {p['export_wall_s']:.1f} "
                         f"({p['rows_per_second']:,.0f} rows/s) | {p['rank_wall_s']:.1f} "
                         f"({p['rank_method']}, {p['rank_s']:.1f}) | {p['press_rank']} | "
                         f"{p['total_wall_s']:.1f} |")
        else:
            lines.append(f"| {name[9:]} | {p.get('error', p.get('skipped', 'not run'))[:200]}"
                         " | | | |")
    if fl and "gemm_fp64_tflops" in fl:
        lines += ["", "### Measured floors", "",
                  f"- float64 GEMM {fl['gemm_fp64_tflops']:.1f} TFLOP/s, float32 (TF32 off) "
                  f"{fl['gemm_fp32_tflops']:.1f} TFLOP/s; the Gram block product B^T B "
                  f"(512 x N, float64) {fl['gram_block_tflops']:.1f} TFLOP/s.",
                  f"- host to device: {fl['h2d_pageable_gbs']:.1f} GB/s from pageable NumPy "
                  f"memory (the tools' route), {_fmt(fl.get('h2d_pinned_gbs'))} GB/s pinned.",
                  f"- torch {fl.get('torch')}."]
    mx = st.get("matrix", {})
    if "shape" in mx and fl.get("gemm_fp64_tflops"):
        m, n = mx["shape"]
        arith = m * n * n / (fl["gemm_fp64_tflops"] * 1e12)
        copy = mx["bytes"] / (fl["h2d_pageable_gbs"] * 1e9)
        floor = max(arith, copy)
        lines += ["", f"### Exact singular values of a {m:,} x {n:,} float32 matrix (the "
                  "bench/analysis/svd.py matrix: rank 400, scales 1 ... 1e-3, noise 1e-6)", "",
                  f"Floor = max(M N^2 / float64 GEMM rate = {arith:.2f} s, bytes of Q / "
                  f"pageable host-to-device rate = {copy:.2f} s) = {floor:.2f} s. Matrix "
                  f"written in {mx['seconds']:.0f} s. Differences against gram (torch).", "",
                  "| method | kernels | seconds | x floor | peak device MiB | Press rank | "
                  "max rel diff vs gram (torch), s_i > Press thr. |",
                  "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
        for name in [k for k in st if k.startswith("svd-")]:
            r = st[name]
            if "seconds" not in r:
                lines.append(f"| {name[4:]} | | {r.get('error', r.get('skipped'))[:200]} "
                             "| | | | |")
                continue
            rank, diff = r.get("press_rank"), r.get("max_rel_diff_vs_gram_torch")
            kernels = {"torch": "torch (cuBLAS, cuSOLVER)", "cupy": "CuPy (cuBLAS, cuSOLVER)",
                       "jax": "JAX (XLA), kernel in bench"}[r["backend"]]
            lines.append(f"| {r['method']} | {kernels} | {r['seconds']:.1f} | "
                         f"{r['seconds'] / floor:.2f} | {_fmt(r.get('peak_mib'), ',.0f')} | "
                         f"{_fmt(rank, 'd')} | {_fmt(diff, '.2e')} |")
    for name in [k for k in st if k.startswith("mos-")]:
        r = st[name]
        if "rows" not in r:
            if r:
                lines += ["", f"{name}: {r.get('error', r.get('skipped'))[:400]}"]
            continue
        c = r["config"]
        tensor = c["B"] * c["T"] * c["K"] * c["V"] * 4 / 2**20
        lines += ["", f"### MoS mixture on the GPU, Keras on {r.get('label', name[4:])} "
                  f"(B={c['B']}, "
                  f"T={c['T']}, K={c['K']}, V={c['V']:,}, L={c['L']}; one B*T*K*V float32 "
                  f"tensor = {tensor:,.0f} MiB)", "",
                  "| pass | mixture | seconds (median of 5) | peak device MiB | peak / tensor |",
                  "| --- | --- | ---: | ---: | ---: |"]
        for row in sorted(r["rows"], key=lambda x: (x["mode"], x["mixture"])):
            pk = row["peak_mib"]
            ratio = None if pk is None else pk / tensor
            lines.append(f"| {row['mode']} | {row['mixture']} | {row['seconds']:.4f} | "
                         f"{_fmt(pk, ',.0f')} | {_fmt(ratio, '.2f')} |")
    return "\n".join(lines) + "\n"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", default="gpu_out")
    p.add_argument("--work", default="/tmp/bench_gpu")
    p.add_argument("--data-dir", default=os.environ.get("TFLM_DATA_DIR",
                                                        str(REPO.parent / "shared" / "data")))
    p.add_argument("--budget", type=float, default=420.0)
    p.add_argument("--stage-timeout", type=float, default=240.0)
    p.add_argument("--stages", nargs="+", choices=list(STAGES))
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--report", metavar="RESULTS_JSON",
                   help="print the tables of a run's gpu_results.json (nothing is run)")
    p.add_argument("--results", default=str(results_path(__file__, "gpu_rank_tools.md")))
    p.add_argument("--no-publish", action="store_true")
    args = p.parse_args()
    if args.report:
        results = json.loads(pathlib.Path(args.report).read_text())
        print(f"# {title(results)}\n\n{report(results)}")
        return
    if args.child:
        pathlib.Path(args.work).mkdir(parents=True, exist_ok=True)
        print(json.dumps(STAGES[args.child](args)))
        return
    run_all(args)


if __name__ == "__main__":
    main()
