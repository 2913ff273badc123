"""One call on a lent GPU machine: issue 41's GPU measurements (and issue 46's before it), one
after another under one deadline, each stage's figures packed into the folder that comes back.

    python -m bench.gpu_session --out $OUT --carried .device [--deadline 570] [--small] \
        [--stages NAME ...]

A lent machine is rare and short (minutes, one call), starts bare, and has PyTorch and JAX but
no TensorFlow: Keras travels as a wheel, and so do the PTB text and the two reference
checkouts, under `--carried` (`data/penn/`, `awd-lstm-lm/`, `mos/`; optionally `tree-base/`,
below). The stages run in the order given, each with what is left of the deadline (at most
its own cap), so a slow stage costs the ones after it and never the call; a stage that fails
or runs out of time is reported as such and the next one starts. By default
(`DEFAULT_STAGES`), what issue 41 has not measured yet:

1. `spe`: `bench.training.steps_per_execution` for `awd_lstm_ptb` and `awd_lstm_mos_ptb` as
   they are, on JAX: k = 8 windows in one compiled scan (`tflm.backends.scanned_steps`)
   against one dispatch a window, the same windows, interleaved epochs: what the host's
   work between dispatches costs a latency-bound step.
2. `mos-head`: `bench.heads.mos_targets` on the GPU: an MoS model's training objective on
   JAX, the targets' log-probabilities alone, chunk by chunk
   (`tflm.backends.jax_mixture_target_log_probs`, what a JAX train step of an MoS model
   computes since it was written), against the batched mixture picked at the targets (what
   it computed before): time and the allocator's peak, at the preset's head size.
3. `mos-profile`: `bench.training.step_profile` for `awd_lstm_mos_ptb` at its own size,
   tflm on JAX against zihangdai/mos main.py's step (without its per-batch `gc.collect()`):
   where each step's time goes, kernels, idle share, memory.
4. `torch`: the same for `awd_lstm_ptb`, Keras on PyTorch against salesforce main.py's step:
   the "Keras on PyTorch >= 1.0x" target at the preset's size.
5. `torch-compile`: the same with `--set training.jit_compile=true`: Keras on PyTorch with
   the train step's forward pass and loss compiled by `torch.compile`
   (`tflm.backends.torch_compiled_step`: cuDNN's LSTM one operator in the graph,
   `tflm::lstm`, its backward a recomputation): does one compiled graph take the host's
   work off the step, and what does the recomputed LSTM forward cost. Its compiles happen
   in the warm-up steps.
6. `torch-base`: Keras on PyTorch again, from `--carried/tree-base/` (a copy of tflm's tree
   at the commit before a change, e.g. `git archive BASE | tar -x -C .device/tree-base`),
   run from that tree: the change's A/B in one session. Left out where no tree is carried.
   The changes waiting for it: a backbone's layers called through `layer.call` on PyTorch
   (`tflm.backends.torch_layer_calls`), then the step's small updates made in place
   (`Backend.assign_add`, 1546ca5); BASE = 6174509, the commit before both.
7. `mos`: `bench.reproductions.reference_curves` for `awd_lstm_mos_ptb` on the first 150,000
   words of PTB (1 epoch, seeds 141 and 142; main.py's ms/batch every 20 batches) against
   zihangdai/mos's main.py with its per-batch `gc.collect()` skipped (`--reference-gc off`,
   the stricter comparison: the collections are no arithmetic): training words/s once warm
   (the steps after the first) and the GPU allocators' peaks. (The 60,000 words of the
   session of 2026-11-28 gave 72 warm steps, too few: seeds 37,259 / 47,859 words/s.)
8. `torch-train`: `reference_curves` for `awd_lstm_ptb` with Keras on PyTorch, one epoch on
   the first 200,000 words of PTB (seeds 141 and 142) against salesforce's main.py:
   `zoo.train`'s own loop (its batch hooks on Keras' worker thread, no wait at a step's
   end), training words/s once warm and the allocators' peaks.
9. `f16`, `f32` and `bf16`: `zoo.train` for `awd_lstm_ptb` on JAX, 2 epochs of the full
   PTB, seed 141, under `mixed_float16` (with loss scaling; cuDNN's LSTM in float16: never
   measured on a GPU), float32 and `mixed_bfloat16` (last measured before the
   device-padding fix, against the `curves` stage's float32 run): the mixed-precision
   target's speed and perplexities side by side in one session, each against the float32
   run.
10. `mos-head-torch`: `bench.heads.mos_targets --backend torch` on the GPU: an MoS head's
   training objective on Keras on PyTorch, the whole-window pick (what its train step runs
   at the preset's size) and the checkpointed chunks (past 1 GiB of logits,
   `tflm.backends.torch_mixture_target_log_probs`) against the batched mixture: time and
   the allocator's peak.
11. `mos-profile-torch`: `bench.training.step_profile` for `awd_lstm_mos_ptb` on Keras on
   PyTorch (its step picks the targets since 2026-12-07): where the step's time goes, beside
   the `mos-profile` stage's JAX and zihangdai/mos rows.

Also known, by name with `--stages`: `mogrifier-torch` and `mogrifier-torch-base` (the
Mogrifier preset's step on Keras on PyTorch from this tree and from the base tree: the A/B
of its time loop written out, 3 reads a time step fewer), `curves` (`reference_curves` for
`awd_lstm_ptb` at its own size on the full PTB against salesforce's main.py, 3 epochs, seeds
141 and 142: curves, first-epoch, warm-epoch and whole-run times and memory,
`train_step_traces`) and `pad-72`, `pad-88` (`step_profile` for JAX with bptt-70 windows
padded to 72 and to 88): these two ran in the sessions of 2026-11-28. Earlier sessions' stages
are in git: the step profile against main.py's step, the `mixed_bfloat16` run and Keras on
PyTorch (`tools.compare_frameworks`) ran in the first (results/gpu_session.md); `--report`
still reads their folders.

`--small` shrinks every stage (a model of 32 / 64, a few thousand words) so that the whole
session runs on a CPU in a few minutes: the check that it runs before a GPU is spent on it.

`--report FOLDER` (FOLDER: a session's stage folders, unpacked from its `.tgz` files) reads
the figures back and writes issue 41's targets, each met or missed with its figure, with the
step profile beside them (`results/gpu_session.md`; nothing is run).

Writes to `--out`: `session.log` (every stage's command, exit status, seconds and output
tail), `session.json` (the same, machine-read) and `<stage>.tgz` for each stage after `info`
(its folder's text files: results tables, JSON, metrics, stdout; no models, no corpus).
"""

import argparse
import json
import statistics
import os
import pathlib
import subprocess
import sys
import tarfile
import time

from bench.harness import REPO, publish, results_path

# zoo.train's precision stages: name -> Keras dtype policy
PRECISION_STAGES = {"f16": "mixed_float16", "bf16": "mixed_bfloat16", "f32": "float32"}
PACKED_SUFFIXES = (".md", ".json", ".txt", ".log", ".png", ".csv")
PACKED_MAX_BYTES = 4 << 20
UNPACKED_FOLDERS = {"text"}  # the corpus copies reference_curves cuts


BASE_TREE = "tree-base"  # under --carried: tflm at the commit before a change, for an A/B


def stages(work, carried, small):
    """{name: (cap seconds, environment overrides, command, working folder)}, every stage
    this script knows; `DEFAULT_STAGES` run unless `--stages` names others."""
    py = sys.executable
    salesforce, mos = carried / "awd-lstm-lm", carried / "mos"
    data = carried / "data"
    device = "cpu" if small else "gpu"
    tiny = ["--set", "model.embed_dim=32", "--set", "model.hidden_dim=64"] if small else []
    cut_awd = (["--train-tokens", "6000", "--valid-tokens", "1500", "--log-interval", "2"]
               if small else [])
    cut_mos = ["--train-tokens", "6000" if small else "150000", "--valid-tokens",
               "1500" if small else "8000", "--log-interval", "2" if small else "20"]
    cut_torch = ["--train-tokens", "6000" if small else "200000", "--valid-tokens",
                 "1500" if small else "8000", "--log-interval", "2" if small else "10"]
    cut_corpus = (["--set", "corpus.max_train_tokens=6000", "--set",
                   "corpus.max_valid_tokens=1500", "--set", "corpus.max_test_tokens=1500"]
                  if small else [])
    mos_tiny = (["--set", "model.last_dim=48", "--set", "model.head.num_experts=3"]
                if small else [])
    jax = {"KERAS_BACKEND": "jax"}
    steps = ["--steps", "5" if small else "30", "--warmup", "2" if small else "10",
             "--device", device, "--no-publish"]
    profile = [py, "-m", "bench.training.step_profile", *steps]
    base = carried / BASE_TREE
    # the base tree's own tflm, zoo and bench; the carried packages (Keras) after them
    base_env = {"PYTHONPATH": os.pathsep.join(filter(None, [str(base),
                                                            os.environ.get("PYTHONPATH")]))}
    return {
        "info": (30, jax, [py, "-c", INFO], REPO),  # Keras imports its backend: JAX, as the stages
        "mos-profile": (150, jax, [
            *profile, "--preset", "awd_lstm_mos_ptb", "--backends", "jax", "--reference",
            str(mos), "--out", str(work / "mos-profile"), *tiny, *mos_tiny], REPO),
        "mos-profile-torch": (120, {}, [
            *profile, "--preset", "awd_lstm_mos_ptb", "--backends", "torch",
            "--out", str(work / "mos-profile-torch"), *tiny, *mos_tiny], REPO),
        "torch": (120, {}, [
            *profile, "--preset", "awd_lstm_ptb", "--backends", "torch", "--reference",
            str(salesforce), "--out", str(work / "torch"), *tiny], REPO),
        "torch-compile": (240, {}, [
            *profile, "--preset", "awd_lstm_ptb", "--backends", "torch", "--set",
            "training.jit_compile=true", "--out", str(work / "torch-compile"), *tiny,
            # --small: a short window, so Inductor compiles on a CPU within the stage's time
            *(["--set", "training.bptt=12"] if small else [])], REPO),
        "torch-base": (90, base_env, [
            *profile, "--preset", "awd_lstm_ptb", "--backends", "torch",
            "--out", str(work / "torch-base"), *tiny], base),
        **{f"mogrifier-torch{suffix}": (90, env, [
            *profile, "--preset", "mogrifier_ptb", "--backends", "torch",
            "--out", str(work / f"mogrifier-torch{suffix}"), *tiny], folder)
           for suffix, env, folder in (("", {}, REPO), ("-base", base_env, base))},
        "torch-train": (150, {"KERAS_BACKEND": "torch"}, [
            py, "-m", "bench.reproductions.reference_curves", "--reference", str(salesforce),
            "--preset", "awd_lstm_ptb", "--epochs", "1", "--seeds", "141", "142",
            "--device", device, "--data-dir", str(data), "--work", str(work / "torch-train"),
            "--results", str(work / "torch-train" / "reference_curves_torch_gpu.md"),
            *cut_torch, *tiny], REPO),
        "mos": (200, jax, [
            py, "-m", "bench.reproductions.reference_curves", "--reference", str(mos),
            "--preset", "awd_lstm_mos_ptb", "--epochs", "1", "--seeds", "141", "142",
            "--reference-gc", "off", "--device", device, "--data-dir", str(data),
            "--work", str(work / "mos"),
            "--results", str(work / "mos" / "reference_curves_mos_gpu.md"), *cut_mos, *tiny,
            *mos_tiny], REPO),
        "curves": (370, jax, [
            py, "-m", "bench.reproductions.reference_curves", "--reference", str(salesforce),
            "--preset", "awd_lstm_ptb", "--epochs", "3", "--seeds", "141", "142",
            "--device", device, "--data-dir", str(data), "--work", str(work / "curves"),
            "--results", str(work / "curves" / "reference_curves_gpu.md"), *cut_awd, *tiny],
            REPO),
        **{name: (110, {**jax, "TFLM_DATA_DIR": str(data)}, [
            py, "-m", "zoo.train", "--preset", "awd_lstm_ptb", "--seed", "141",
            "--precision", precision, "--set", "training.epochs=2",
            "--out", str(work / name / "run"), *tiny, *cut_corpus], REPO)
           for name, precision in PRECISION_STAGES.items()},
        "mos-head": (90, jax, [
            py, "-m", "bench.heads.mos_targets", "--device", device, "--no-publish",
            "--repeats", "1" if small else "5", *(["--batch", "1"] if small else []),
            "--json", str(work / "mos-head" / "mos_targets.json")], REPO),
        "mos-head-torch": (90, {}, [
            py, "-m", "bench.heads.mos_targets", "--backend", "torch", "--device", device,
            "--no-publish", "--repeats", "1" if small else "5",
            *(["--batch", "1"] if small else []),
            "--json", str(work / "mos-head-torch" / "mos_targets_torch.json")], REPO),
        "spe": (200, jax, [
            py, "-m", "bench.training.steps_per_execution", "--sizes",
            *(["tiny"] if small else ["preset", "mos"]), "--k", "8", "--windows",
            "16" if small else "200",
            "--repeats", "1" if small else "3", "--device", device, "--no-publish",
            "--json", str(work / "spe" / "steps_per_execution.json")], REPO),
        **{f"pad-{n}": (70, jax, [*profile, "--preset", "awd_lstm_ptb", "--backends", "jax",
                                  "--set", f"training.pad_to_multiple={n}",
                                  "--out", str(work / f"pad-{n}"), *tiny], REPO)
           for n in (72, 88)},
    }


# What the next lent GPU measures first (issue 41): steps_per_execution 8 against 1 for the
# AWD-LSTM and MoS presets (the windows of a dispatch in one scan: the host's share of the
# 16.9 ms an AWD-LSTM step took, of which the GPU was busy 12.5, is what it saves), then
# MoS's chunked training objective against the batched one (`mos-head`), the MoS step
# against zihangdai/mos's, Keras on PyTorch at the AWD-LSTM preset's size against
# main.py's step, eagerly and with its forward pass compiled (`torch-compile`; and against
# the base tree's, where one is carried: the A/B of a change), a longer warm MoS run,
# then Keras on PyTorch in `zoo.train`'s own loop.
# `curves` and the `pad-*` stages ran in the sessions of 2026-11-28 (results/gpu_session.md).
# Then, where time is left, the precisions in zoo.train (2 epochs each, seed 141):
# mixed_float16 (loss scaling; cuDNN's LSTM in float16) never measured on a GPU, float32
# beside it, then mixed_bfloat16, not measured since the device-padding fix. Last, an MoS
# head's training objective on Keras on PyTorch (`mos-head-torch`: the whole-window pick
# and the checkpointed chunks against the batched mixture), then its whole step
# (`mos-profile-torch`).
DEFAULT_STAGES = ("info", "spe", "mos-head", "mos-profile", "torch", "torch-compile",
                  "torch-base", "mos", "torch-train", "f16", "f32", "bf16", "mos-head-torch",
                  "mos-profile-torch")


INFO = """
import json, platform, subprocess
info = {"python": platform.python_version()}
for name in ("jax", "keras", "torch", "numpy"):
    try:
        info[name] = __import__(name).__version__
    except Exception as error:  # noqa: BLE001 - a missing package is a finding here
        info[name] = f"missing: {error}"
try:
    import jax
    info["jax_devices"] = [str(d) for d in jax.devices()]
except Exception as error:  # noqa: BLE001
    info["jax_devices"] = f"error: {error}"
try:
    info["nvidia_smi"] = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,"
                                         "driver_version,clocks.max.sm", "--format=csv"],
                                        capture_output=True, text=True).stdout
except OSError as error:
    info["nvidia_smi"] = f"not run: {error}"
print(json.dumps(info, indent=1))
"""


def pack(folder, archive):
    """The text files of `folder` (results, JSON, metrics, stdout; no models) as `archive`."""
    with tarfile.open(archive, "w:gz") as tar:
        for path in sorted(folder.rglob("*")):
            if (path.is_file() and path.suffix in PACKED_SUFFIXES
                    and path.stat().st_size <= PACKED_MAX_BYTES
                    and not UNPACKED_FOLDERS & set(path.relative_to(folder).parts)):
                tar.add(path, arcname=str(path.relative_to(folder.parent)))


def run_stage(name, cap, env, command, cwd, work, out, deadline, log):
    """Run one stage from `cwd` with min(cap, time left) seconds; its record."""
    left = deadline - time.monotonic()
    record = {"stage": name, "command": " ".join(command), "cap_s": cap}
    if left < 20:
        record.update(status="skipped: the deadline", seconds=0)
        return record
    folder = work / name
    folder.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    try:
        proc = subprocess.run(command, cwd=cwd, env={**os.environ, **env},
                              capture_output=True, text=True, timeout=min(cap, left - 10))
        status, output = f"exit {proc.returncode}", proc.stdout + proc.stderr
    except subprocess.TimeoutExpired as stopped:
        status = f"stopped after {min(cap, left - 10):.0f} s"
        output = "".join(part.decode() if isinstance(part, bytes) else (part or "")
                         for part in (stopped.stdout, stopped.stderr))
    record.update(status=status, seconds=round(time.monotonic() - start, 1))
    (folder / "output.txt").write_text(output)
    log.write(f"## {name}: {status}, {record['seconds']} s\n$ {record['command']}\n"
              f"{output[-6000:]}\n\n")
    log.flush()
    if name != "info":  # its output is in session.log; the files that come back are few
        pack(folder, out / f"{name}.tgz")
    return record


def _json(path):
    return json.loads(path.read_text()) if path.is_file() else None


def _ms_or_dash(value):
    return "-" if value is None else f"{value:.2f}"


def _mib(value):
    return "-" if value is None else f"{value:,.0f}"


def _verdict(met):
    return "-" if met is None else ("met" if met else "missed")


def warm_words_per_second(metrics):
    """A run's training words/s once warm, from its last epoch: its tokens over the loop's
    time after the first step (which compiles), the first step's share of the tokens (one
    step of `train_steps`) left out; None without `train_steps` or with a compile after
    the first step (`train_step_traces` > 1)."""
    logs = metrics["history"][-1]
    steps = logs.get("train_steps")
    if not steps or steps < 2 or logs.get("train_step_traces", 1) > 1:
        return None
    tokens = logs["words_per_second"] * logs["train_seconds"]
    return tokens * (steps - 1) / steps / (logs["train_seconds"] - logs["first_step_seconds"])


def _reference_run(folder):
    """The reference main.py's words/s (`reference_words_per_second`) and peak MiB from the
    first reference run's output under `folder` (a `reference_curves` work folder), or
    (None, None)."""
    from bench.reproductions.reference_curves import (  # deferred: Keras
        reference_timing, reference_words_per_second)
    for stdout in sorted(folder.glob("reference-*/stdout.txt")):
        t = reference_timing(stdout.read_text())
        words = reference_words_per_second(t)
        if words:
            return words, t.get("peak_mib")
    return None, None


def _precision_row(policy, mixed, f32):
    """The row of the mixed precision `policy` from two `zoo.train` runs of one session
    (its stage's and `f32`'s metrics.json): the last epoch's words/s and the validation
    perplexity by epoch, side by side."""
    half = [h["val_perplexity"] for h in mixed["history"]]
    full = [h["val_perplexity"] for h in f32["history"]]
    speed, f32_speed = (run["history"][-1]["words_per_second"] for run in (mixed, f32))
    return (f"{policy}: speed and perplexity against float32 (measured)",
            f"epoch {len(half)} words/s {speed:,.0f} vs {f32_speed:,.0f} "
            f"({speed / f32_speed:.2f}x); valid ppl by epoch "
            f"{' / '.join(f'{v:.1f}' for v in half)} vs {' / '.join(f'{v:.1f}' for v in full)}"
            f" (seed 141, same session); test {mixed['test_perplexity']:.1f} vs "
            f"{f32['test_perplexity']:.1f}", None)


def report(folder):
    """Issue 41's targets from a session's stage folders: a markdown body."""
    from bench.reproductions.reference_curves import reference_words_per_second  # deferred: Keras
    curves = _json(folder / "curves" / "reference_curves_gpu.json")
    rows, t = [], (curves or {}).get("timings", {})
    ours = [v for k, v in t.items() if k.startswith("keras-")]
    theirs = [v for k, v in t.items() if k.startswith("peer-")]
    ref_words = None
    measured = [w for w in map(reference_words_per_second, theirs) if w]
    if ours and measured:
        ref_words = statistics.mean(measured)
        jax_words = statistics.mean(r["words_per_second"][-1] for r in ours)
        cold = t["keras-141"]
        ref_first = statistics.mean(r["epoch_seconds"][0] for r in theirs)
        ref_wall = statistics.mean(r["wall_seconds"] for r in theirs)
        rows += [
            ("AWD-LSTM: fastest Keras backend's training words/s once warm >= 1.3x main.py's",
             f"JAX {jax_words:,.0f} (last epoch, mean of {len(ours)} seeds) / main.py "
             f"{ref_words:,.0f} = {jax_words / ref_words:.2f}x", jax_words >= 1.3 * ref_words),
            ("AWD-LSTM: first epoch (compiles included) <= 1.3x main.py's",
             f"{cold['epoch_seconds'][0]:.1f} s (seed 141, empty compilation cache) / "
             f"{ref_first:.1f} s = {cold['epoch_seconds'][0] / ref_first:.2f}x",
             cold["epoch_seconds"][0] <= 1.3 * ref_first),
            ("AWD-LSTM: a whole 3-epoch run takes less wall time than main.py's",
             f"{cold['wall_seconds']:.1f} s (seed 141; seed 142, compiles cached: "
             f"{t['keras-142']['wall_seconds']:.1f} s) / {ref_wall:.1f} s = "
             f"{cold['wall_seconds'] / ref_wall:.2f}x", cold["wall_seconds"] < ref_wall)]
    mos_words, mos_peak = _reference_run(folder / "mos")
    mos_runs = [m for m in (_json(folder / "mos" / f"tflm-{seed}" / "metrics.json")
                            for seed in (141, 142)) if m]
    mos_gc = ((_json(folder / "mos" / "reference_curves_mos_gpu.json") or {})
              .get("reference_gc", "on"))
    if mos_words:
        label = ("MoS: >= 1.5x zihangdai/mos main.py's training words/s, no more memory"
                 + (" (main.py without its per-batch gc.collect())" if mos_gc == "off" else ""))
        warm = [w for w in map(warm_words_per_second, mos_runs) if w]
        if warm:
            words, peak = statistics.mean(warm), max(m.get("device_memory_mib") or 0
                                                    for m in mos_runs)
            seeds = "mean of 2 seeds" if len(warm) == 2 else "one seed"
            rows.append((label, f"{words:,.0f} (the steps after the first, {seeds}) / "
                         f"{mos_words:,.0f} = {words / mos_words:.2f}x; "
                         f"peak {peak} / {mos_peak} MiB",
                         words >= 1.5 * mos_words and peak <= (mos_peak or 0)))
        else:
            first = (f"; tflm's only run, its first epoch with the compiles: "
                     f"{mos_runs[0]['history'][0]['words_per_second']:,.0f} words/s, peak "
                     f"{mos_runs[0].get('device_memory_mib')} MiB" if mos_runs else "")
            rows.append((label, f"main.py {mos_words:,.0f} words/s, peak {mos_peak} MiB"
                         f"{first}; tflm once warm: not measured", None))
    rows += _torch_rows(folder)
    rows += _torch_training_rows(folder / "torch-train")
    torch = _json(folder / "torch" / "results.json")  # the first session's stage
    if torch and ref_words:
        row = torch["backends"][0]
        words = row["train_words_per_s_steady"]
        rows.append(("Keras on PyTorch >= 1.0x main.py", f"{words:,.0f} (median step, "
                     f"compare_frameworks) / {ref_words:,.0f} = {words / ref_words:.2f}x",
                     words >= ref_words))
    bf16 = _json(folder / "bf16" / "run" / "metrics.json")
    f32_run = _json(folder / "f32" / "run" / "metrics.json")
    for stage, policy in PRECISION_STAGES.items():
        mixed = _json(folder / stage / "run" / "metrics.json")
        if mixed and f32_run and stage != "f32":
            rows.append(_precision_row(policy, mixed, f32_run))
    if bf16 and not f32_run and ours:  # the first session's: float32 from the curves stage
        f32 = t["keras-141"]
        half = [h["val_perplexity"] for h in bf16["history"]]
        full = curves["curves"]["keras-141"][:len(half)]
        speed = bf16["history"][-1]["words_per_second"]
        f32_speed = f32["words_per_second"][len(half) - 1]
        rows.append(("mixed_bfloat16: speed and perplexity against float32 (measured)",
                     f"epoch {len(half)} words/s {speed:,.0f} vs {f32_speed:,.0f} "
                     f"({speed / f32_speed:.2f}x); valid ppl by epoch "
                     f"{' / '.join(f'{v:.1f}' for v in half)} vs "
                     f"{' / '.join(f'{v:.1f}' for v in full)} (float32, seed 141); test "
                     f"{bf16['test_perplexity']:.1f}", None))
    traces = {seed: [h.get("train_step_traces") for h in metrics["history"]]
              for seed in (141, 142)
              if (metrics := _json(folder / "curves" / f"tflm-{seed}" / "metrics.json"))}
    if any(None not in v for v in traces.values()):
        rows.append(("AWD-LSTM: training programs compiled per epoch (`train_step_traces`)",
                     "; ".join(f"seed {seed}: {' / '.join(map(str, v))}"
                               for seed, v in traces.items()), None))
    spe = _json(folder / "spe" / "steps_per_execution.json") or {}
    for size, r in spe.get("results", {}).items():  # "preset", "mos"; "tiny" (--small)
        rows.append((f"`{r['preset']}` ({size}): steps_per_execution {spe['k']} (one scan "
                     "a dispatch) against 1 (JAX, same windows)",
                     f"{r['one'] * 1000:.2f} / {r['k'] * 1000:.2f} ms a window = "
                     f"{r['one'] / r['k']:.2f}x; first epoch (compiles) "
                     f"{r['first_one']:.1f} / {r['first_k']:.1f} s; weights within "
                     f"{r['diff']:.1e}", None))
    head = _json(folder / "mos-head" / "mos_targets.json")
    if head:
        batched, picked = head["batched"], head["targets"]
        rows.append(("MoS head on JAX, training: the targets alone, chunk by chunk, against "
                     "the batched mixture (`bench.heads.mos_targets`)",
                     f"{picked['seconds'] * 1e3:.1f} / {batched['seconds'] * 1e3:.1f} ms a "
                     f"step = {batched['seconds'] / picked['seconds']:.2f}x; peak "
                     f"{picked['peak_mib']:,.0f} / {batched['peak_mib']:,.0f} MiB", None))
    head = _json(folder / "mos-head-torch" / "mos_targets_torch.json")
    if head:
        batched = head["batched"]
        rows.append(("MoS head on Keras on PyTorch, training: the targets alone, the whole "
                     "window / in checkpointed chunks, against the batched mixture "
                     "(`bench.heads.mos_targets --backend torch`)",
                     "; ".join(f"{mode} {head[mode]['seconds'] * 1e3:.1f} / "
                               f"{batched['seconds'] * 1e3:.1f} ms a step = "
                               f"{batched['seconds'] / head[mode]['seconds']:.2f}x, peak "
                               f"{head[mode]['peak_mib']:,.0f} / {batched['peak_mib']:,.0f} MiB"
                               for mode in ("targets", "chunked") if mode in head), None))
    pads = {n: _json(folder / f"pad-{n}" / "step_profile.json") for n in (72, 88)}
    if all(pads.values()):
        (short,), (long,) = (pads[n]["rows"] for n in (72, 88))
        if "wall_ms" in short and "wall_ms" in long:
            rows.append(("A padded position's cost: a bptt-70 step padded to 88 against 72 "
                         "(step_profile, JAX, synchronized steps)",
                         f"{long['wall_ms']:.2f} / {short['wall_ms']:.2f} ms wall = "
                         f"{long['wall_ms'] / short['wall_ms']:.2f}x; busy "
                         f"{_ms_or_dash(long.get('busy_ms'))} / "
                         f"{_ms_or_dash(short.get('busy_ms'))} ms", None))
    lines = ["| target | figure | verdict |", "| --- | --- | --- |"]
    lines += [f"| {a} | {b} | {_verdict(c)} |" for a, b, c in rows]
    for stage, what in (("profile", "the AWD-LSTM preset"), ("mos-profile", "the MoS preset"),
                        ("mos-profile-torch", "the MoS preset, Keras on PyTorch"),
                        ("torch", "the AWD-LSTM preset, Keras on PyTorch"),
                        ("torch-compile", "the AWD-LSTM preset, Keras on PyTorch, "
                                          "jit_compile=True"),
                        ("torch-base", "the AWD-LSTM preset, Keras on PyTorch, base tree")):
        profile = _json(folder / stage / "step_profile.json")
        if profile:
            lines += ["", f"Where a training step's time goes, {what} (`{stage}`: "
                      "`bench.training.step_profile`, fixed windows of bptt, each step "
                      "synchronized; busy = the union of the GPU kernels' intervals):", "",
                      "| system | wall ms/step | GPU busy ms/step | idle | kernels/step | "
                      "peak MiB |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
            lines += [f"| {r['system']} | {r['wall_ms']:.2f} | {r['busy_ms']:.2f} | "
                      f"{r['idle_share']:.0%} | {r['kernels_per_step']:,.0f} | "
                      f"{_mib(r.get('peak_memory_mib'))} |"
                      for r in profile["rows"] if "wall_ms" in r and r.get("busy_ms")]
    return "\n".join(lines) + "\n"


def _torch_training_rows(folder):
    """Keras on PyTorch in `zoo.train` against main.py, one epoch on the same words (the
    `torch-train` stage): training words/s once warm and the GPU allocators' peaks."""
    theirs, their_peak = _reference_run(folder)
    runs = [m for m in (_json(folder / f"tflm-{seed}" / "metrics.json")
                        for seed in (141, 142)) if m]
    warm = [w for w in map(warm_words_per_second, runs) if w]
    if not (theirs and warm):
        return []
    ours = statistics.mean(warm)
    peak = max(m.get("device_memory_mib") or 0 for m in runs)
    return [("Keras on PyTorch >= 1.0x main.py: `zoo.train`, one epoch (training words/s "
             "once warm)", f"{ours:,.0f} (mean of {len(warm)} seed(s)) / {theirs:,.0f} = "
             f"{ours / theirs:.2f}x; peak {_mib(peak)} / {_mib(their_peak)} MiB",
             ours >= theirs)]


def _profiled(folder, stage, system):
    """The `system` row of a stage's step_profile.json, or None (no stage, or it failed)."""
    profile = _json(folder / stage / "step_profile.json") or {"rows": []}
    return next((r for r in profile["rows"] if r.get("system") == system and "wall_ms" in r),
                None)


def _torch_rows(folder):
    """Keras on PyTorch at the AWD-LSTM preset's size against main.py's step (the `torch`
    stage), and against the base tree's Keras on PyTorch (`torch-base`, an A/B; the same
    for the Mogrifier preset, `mogrifier-torch` and `mogrifier-torch-base`)."""
    from bench.training.step_profile import REFERENCE  # deferred: the harness only
    ours, theirs = (_profiled(folder, "torch", s) for s in ("tflm, torch", REFERENCE))
    rows = []
    if ours and theirs:
        rows.append(("Keras on PyTorch >= 1.0x main.py at the AWD-LSTM preset's size "
                     "(step_profile: one synchronized step)",
                     f"{ours['words_per_s']:,.0f} / {theirs['words_per_s']:,.0f} words/s = "
                     f"{ours['words_per_s'] / theirs['words_per_s']:.2f}x; GPU idle "
                     f"{ours['idle_share']:.0%} / {theirs['idle_share']:.0%}",
                     ours["words_per_s"] >= theirs["words_per_s"]))
    compiled = _profiled(folder, "torch-compile", "tflm, torch")
    if compiled and theirs:
        rows.append(("Keras on PyTorch with `jit_compile=True` (the forward pass compiled, "
                     "`tflm.backends.torch_compiled_step`) >= 1.0x main.py at the AWD-LSTM "
                     "preset's size (step_profile)",
                     f"{compiled['words_per_s']:,.0f} / {theirs['words_per_s']:,.0f} words/s "
                     f"= {compiled['words_per_s'] / theirs['words_per_s']:.2f}x; GPU idle "
                     f"{compiled['idle_share']:.0%}; kernels a step "
                     f"{compiled['kernels_per_step']:,.0f}",
                     compiled["words_per_s"] >= theirs["words_per_s"]))
    for stage, preset in (("torch", ""), ("mogrifier-torch", ", the Mogrifier preset")):
        ours = _profiled(folder, stage, "tflm, torch")
        base = _profiled(folder, f"{stage}-base", "tflm, torch")
        if ours and base:
            rows.append((f"Keras on PyTorch{preset}, this tree against the base tree (an A/B)",
                         f"{ours['wall_ms']:.2f} / {base['wall_ms']:.2f} ms a step = "
                         f"{base['wall_ms'] / ours['wall_ms']:.2f}x the speed; GPU idle "
                         f"{ours['idle_share']:.0%} / {base['idle_share']:.0%}", None))
    return rows


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--report", type=pathlib.Path, metavar="FOLDER",
                   help="write issue 41's targets from a session's stage folders; run nothing")
    p.add_argument("--results", default=str(results_path(__file__, "gpu_session.md")))
    p.add_argument("--out", type=pathlib.Path,
                   help="the folder that comes back from the machine ($OUT)")
    p.add_argument("--carried", type=pathlib.Path,
                   help="the carried folder: data/penn/, awd-lstm-lm/, mos/")
    p.add_argument("--deadline", type=float, default=570.0,
                   help="seconds from the start for all the stages")
    p.add_argument("--work", type=pathlib.Path, default=pathlib.Path("/tmp/gpu_session"))
    p.add_argument("--small", action="store_true", help="tiny stages: a check on a CPU")
    p.add_argument("--stages", nargs="+", metavar="NAME",
                   help=f"the stages to run, in this order (default: {' '.join(DEFAULT_STAGES)})")
    args = p.parse_args(argv)
    if args.report:
        publish("Issue 41's targets on a lent GPU, from one session", report(args.report),
                args.results)
        return 0
    if args.out is None or args.carried is None:
        p.error("give --out and --carried (or --report FOLDER)")
    carried = args.carried.resolve()
    missing = [x for x in ("data/penn/train.txt", "awd-lstm-lm/main.py", "mos/main.py")
               if not (carried / x).is_file()]
    if missing:
        p.error(f"--carried {carried}: missing {', '.join(missing)}")
    known = stages(args.work, carried, args.small)
    chosen = list(args.stages or DEFAULT_STAGES)
    unknown = [name for name in chosen if name not in known]
    if unknown:
        p.error(f"--stages: no stage {', '.join(unknown)}; known: {', '.join(known)}")
    if not (carried / BASE_TREE / "zoo").is_dir():  # no base tree: nothing to compare with
        chosen = [name for name in chosen if not name.endswith("-base")]
    deadline = time.monotonic() + args.deadline
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    records = []
    with open(args.out / "session.log", "w") as log:
        for name in chosen:
            records.append(run_stage(name, *known[name], args.work, args.out, deadline, log))
            print(f"{name}: {records[-1]['status']} ({records[-1]['seconds']} s)", flush=True)
            (args.out / "session.json").write_text(json.dumps(records, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
