"""One call on a lent GPU machine: the GPU measurements of issues 41 and 46, one after another
under one deadline, each stage's figures packed into the folder that comes back.

    python -m bench.gpu_session --out $OUT --carried .device [--deadline 570] [--small]

A lent machine is rare and short (minutes, one call), starts bare, and has PyTorch and JAX but
no TensorFlow: Keras travels as a wheel, and so do the PTB text and the two reference
checkouts, under `--carried` (`data/penn/`, `awd-lstm-lm/`, `mos/`). The stages run in the
order of what they are worth, each with what is left of the deadline (at most its own cap),
so a slow stage costs the ones after it and never the call; a stage that fails or runs out of
time is reported as such and the next one starts.

1. `curves`: `bench.reproductions.reference_curves` for `awd_lstm_ptb` at the preset's own
   size on the full PTB, salesforce's main.py with CUDA against `zoo.train` on Keras-JAX,
   3 epochs, seeds 141 and 142: the curves at full size (issue 46) and, from the same runs,
   the first-epoch, warm-epoch and whole-run times and the memory of both sides (issue 41).
   Seed 141's tflm run starts with an empty JAX compilation cache; seed 142's finds it full.
2. `profile`: `bench.training.step_profile`: where a training step's time goes (kernels,
   host, idle) for tflm on JAX and on PyTorch and for main.py's step.
3. `mos`: `reference_curves` for `awd_lstm_mos_ptb` at its own size on the first 60,000
   words of PTB (1 epoch, seeds 141 and 142; main.py's ms/batch every 20 batches) against
   zihangdai/mos's main.py: training words/s and the GPU allocators' peaks (seed 142's
   tflm run finds its programs compiled by seed 141's).
4. `bf16`: `zoo.train` `awd_lstm_ptb` seed 141 for 2 epochs with `--precision
   mixed_bfloat16` on JAX, against stage 1's float32 run of the same seed.
5. `torch`: `tools.compare_frameworks` on Keras-PyTorch at the preset's size (median step).

`--small` shrinks every stage (a model of 32 / 64, a few thousand words) so that the whole
session runs on a CPU in a few minutes: the check that it runs before a GPU is spent on it.

Writes to `--out`: `session.log` (every stage's command, exit status, seconds and output
tail), `session.json` (the same, machine-read) and `<stage>.tgz` for each stage after `info`
(its folder's text files: results tables, JSON, metrics, stdout; no models, no corpus).
"""

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tarfile
import time

from bench.harness import REPO

PACKED_SUFFIXES = (".md", ".json", ".txt", ".log", ".png", ".csv")
PACKED_MAX_BYTES = 4 << 20
UNPACKED_FOLDERS = {"text"}  # the corpus copies reference_curves cuts


def stages(work, carried, small):
    """[(name, cap seconds, environment overrides, command)] in the order they run."""
    py = sys.executable
    salesforce, mos = carried / "awd-lstm-lm", carried / "mos"
    data = carried / "data"
    device = "cpu" if small else "gpu"
    tiny = ["--set", "model.embed_dim=32", "--set", "model.hidden_dim=64"] if small else []
    cut_awd = ["--train-tokens", "6000", "--valid-tokens", "1500"] if small else []
    cut_mos = ["--train-tokens", "6000" if small else "60000", "--valid-tokens",
               "1500" if small else "8000", "--log-interval", "2" if small else "20"]
    mos_tiny = (["--set", "model.last_dim=48", "--set", "model.head.num_experts=3"]
                if small else [])
    jax = {"KERAS_BACKEND": "jax"}
    return [
        ("info", 30, {}, [py, "-c", INFO]),
        ("curves", 360, jax, [
            py, "-m", "bench.reproductions.reference_curves", "--reference", str(salesforce),
            "--preset", "awd_lstm_ptb", "--epochs", "3", "--seeds", "141", "142",
            "--device", device, "--data-dir", str(data), "--work", str(work / "curves"),
            "--results", str(work / "curves" / "reference_curves_gpu.md"), *cut_awd, *tiny]),
        ("profile", 80, jax, [
            py, "-m", "bench.training.step_profile", "--reference", str(salesforce),
            "--preset", "awd_lstm_ptb", "--backends", "jax,torch",
            "--steps", "5" if small else "30", "--warmup",
            "2" if small else "10", "--device", device, "--out", str(work / "profile"),
            "--no-publish", *tiny]),
        ("mos", 130, jax, [
            py, "-m", "bench.reproductions.reference_curves", "--reference", str(mos),
            "--preset", "awd_lstm_mos_ptb", "--epochs", "1", "--seeds", "141", "142",
            "--device", device, "--data-dir", str(data), "--work", str(work / "mos"),
            "--results", str(work / "mos" / "reference_curves_mos_gpu.md"), *cut_mos, *tiny,
            *mos_tiny]),
        ("bf16", 100, {**jax, "TFLM_DATA_DIR": str(data)}, [
            py, "-m", "zoo.train", "--preset", "awd_lstm_ptb", "--seed", "141",
            "--precision", "mixed_bfloat16", "--set", "training.epochs=2",
            "--out", str(work / "bf16" / "run"), *tiny,
            *(["--set", "corpus.name=" + str(work / "curves" / "text")] if small else [])]),
        ("torch", 70, {"KERAS_BACKEND": "torch"}, [
            py, "-m", "tools.compare_frameworks", "--preset", "awd_lstm_ptb", "--backends",
            "torch", "--device", device, "--steps", "8" if small else "60", "--warmup",
            "2" if small else "10", "--eval-windows", "3", "--data-dir", str(data),
            "--out", str(work / "torch"), *tiny]),
    ]


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


def run_stage(name, cap, env, command, work, out, deadline, log):
    """Run one stage with min(cap, time left) seconds; its record."""
    left = deadline - time.monotonic()
    record = {"stage": name, "command": " ".join(command), "cap_s": cap}
    if left < 20:
        record.update(status="skipped: the deadline", seconds=0)
        return record
    folder = work / name
    folder.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    try:
        proc = subprocess.run(command, cwd=REPO, env={**os.environ, **env},
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


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", required=True, type=pathlib.Path,
                   help="the folder that comes back from the machine ($OUT)")
    p.add_argument("--carried", required=True, type=pathlib.Path,
                   help="the carried folder: data/penn/, awd-lstm-lm/, mos/")
    p.add_argument("--deadline", type=float, default=570.0,
                   help="seconds from the start for all the stages")
    p.add_argument("--work", type=pathlib.Path, default=pathlib.Path("/tmp/gpu_session"))
    p.add_argument("--small", action="store_true", help="tiny stages: a check on a CPU")
    args = p.parse_args(argv)
    carried = args.carried.resolve()
    missing = [x for x in ("data/penn/train.txt", "awd-lstm-lm/main.py", "mos/main.py")
               if not (carried / x).is_file()]
    if missing:
        p.error(f"--carried {carried}: missing {', '.join(missing)}")
    deadline = time.monotonic() + args.deadline
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    records = []
    with open(args.out / "session.log", "w") as log:
        for name, cap, env, command in stages(args.work, carried, args.small):
            records.append(run_stage(name, cap, env, command, args.work, args.out, deadline,
                                     log))
            print(f"{name}: {records[-1]['status']} ({records[-1]['seconds']} s)", flush=True)
            (args.out / "session.json").write_text(json.dumps(records, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
