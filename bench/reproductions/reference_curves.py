"""Learning curves against the reference code itself: `python -m zoo.train --preset P` and
the reference's own `main.py` (from a checkout) on the same text, for S seeds each: for a
softmax preset salesforce/awd-lstm-lm's, for a mixture-of-softmaxes preset zihangdai/mos's.

    python -m bench.reproductions.reference_curves --reference ~/awd-lstm-lm \\
        --preset awd_lstm_ptb --epochs 3 --seeds 141 142 \\
        --train-tokens 60000 --valid-tokens 12000 --set model.embed_dim=128 --set model.hidden_dim=256
    python -m bench.reproductions.reference_curves --reference ~/mos --preset awd_lstm_mos_ptb ...

Where `bench.reproductions.parity` starts our PyTorch peer from our initial weights, this runs
the published program as its users do: its own initialisation, data loader, window lengths,
loop and NT-ASGD switch, under `reference_launcher.py`'s two documented shims (weight drop
in evaluation mode, `torch.load` of its own pickles) and nothing else. The preset's settings
become main.py's flags (`reference_flags`); a setting main.py has no flag for must be its
default, else the tool refuses. zihangdai/mos's main.py runs with the same shims (its
weight_drop.py is salesforce's) from a folder holding links to its main.py and model.py
(it copies them into its run folder); its test pass after training calls `.cuda()`
unconditionally, so on a CPU it stops there, after its last validation (what this tool
reads). Both sides read one folder of text: the preset's corpus, its
splits cut to whole lines of at most `--train-tokens` / `--valid-tokens` tokens (both splits
of evaluation), with the vocabulary of the cut text in main.py's order (train, valid, test)
as `vocab.txt`, so both models have the same output size.

`--same-init`: both sides of a seed start from the same weights, ours (zoo.train's
initialisation at that seed, passed to zoo.train as `--init-from` and to main.py as the
model its `--resume` loads; `reference_launcher.py --initial-model`), so the seed-to-seed
spread is that of the training's random paths (dropout masks, window lengths) alone and a
difference between the sides is one of training, not of initialisation.

Each side runs once per seed; the table gives every validation perplexity, the gap between
the two means and the seed-to-seed spread within each side (the largest of the two), and
whether the gap is within that spread at every epoch. On a CPU at reduced size, then on a GPU
at the preset's size (drop `--train-tokens`, `--valid-tokens` and the `--set` overrides;
`--device gpu` runs main.py with CUDA). Writes results/reference_curves.md and .png
(reference_curves_mos.md and .png for a MoS preset).
"""

import argparse
import json
import math
import os
import pathlib
import re
import subprocess
import sys
import tempfile
import time
import types

import numpy as np

from bench.harness import REPO, publish, results_path
from bench.reproductions.parity import figure
from bench.reproductions.reference_programs import check_checkout, reference_program
from bench.training.reference_throughput import commit_of
from tflm.testing.reference_peer import peer_to_keras_names

LAUNCHER = pathlib.Path(__file__).resolve().with_name("reference_launcher.py")
EPOCH_LINE = re.compile(r"\|\s*end of epoch\s+(\d+)\s*\|.*\|\s*valid ppl\s+([\d.]+)")
EPOCH_TIME = re.compile(r"\|\s*end of epoch\s+(\d+)\s*\|\s*time:\s*([\d.]+)s")
BATCH_TIME = re.compile(r"\|\s*epoch\s+(\d+)\s*\|.*\|\s*ms/batch\s+([\d.]+)")
LAUNCHER_LINE = re.compile(r"reference_launcher: train windows (\d+), target positions (\d+), "
                           r"peak CUDA allocator MiB ([\d.]+|-)")

# our setting -> (main.py's flag, main.py's default); salesforce/awd-lstm-lm's main.py
MODEL_FLAGS = {"embed_dim": ("--emsize", 400), "hidden_dim": ("--nhid", 1150),
               "num_layers": ("--nlayers", 3), "dropout": ("--dropout", 0.4),
               "dropout_h": ("--dropouth", 0.3), "dropout_i": ("--dropouti", 0.65),
               "dropout_e": ("--dropoute", 0.1), "weight_dropout": ("--wdrop", 0.5),
               "alpha": ("--alpha", 2.0), "beta": ("--beta", 1.0)}
TRAINING_FLAGS = {"lr": ("--lr", 30.0), "clip_norm": ("--clip", 0.25),
                  "batch_size": ("--batch_size", 80), "bptt": ("--bptt", 70),
                  "weight_decay": ("--wdecay", 1.2e-6), "nonmono": ("--nonmono", 5)}
# zihangdai/mos's main.py: the same flags (other defaults) and the mixture's
MOS_MODEL_FLAGS = {**MODEL_FLAGS, "last_dim": ("--nhidlast", -1),
                   "alpha": ("--alpha", 2), "beta": ("--beta", 1)}
MOS_HEAD_FLAGS = {"num_experts": ("--n_experts", 10), "latent_dropout": ("--dropoutl", -0.2)}
MOS_TRAINING_FLAGS = {**TRAINING_FLAGS, "batch_size": ("--batch_size", 20)}
# what main.py does and cannot be told otherwise
FIXED = {("model", "tie_weights"): True,
         ("training", "eval_batch_size"): 10, ("training", "test_batch_size"): 1,
         ("training", "optimizer"): "asgd", ("training", "switch"): "nonmono"}


def reference_flags(config, seed, epochs, data, save, cuda, log_interval=200):
    """main.py's command-line flags for the resolved preset `config` (`SystemExit` naming a
    setting main.py cannot take); main.py prints its `ms/batch` every `log_interval`
    training batches (200, its default)."""
    model, training = config["model"], config["training"]
    program = reference_program(config)
    for (part, key), value in FIXED.items():
        if key in config[part] and config[part][key] != value:
            raise SystemExit(f"{part}.{key}={config[part][key]!r}: main.py always uses {value!r}")
    unsupported = ("partial_shuffle", "fixed_windows", "when")
    if program == "salesforce":
        unsupported += ("max_seq_len",)
    for key in unsupported:
        if training.get(key):
            raise SystemExit(f"training.{key}={training[key]!r}: main.py has no such setting "
                             "(its windows are random, from fixed streams; no --when in this "
                             "tool; salesforce's are uncapped)")
    flags = ["--data", str(data), "--model", "LSTM", "--epochs", str(epochs), "--seed", str(seed),
             "--save", str(save), "--log-interval", str(log_interval)]
    tables = ((model, MODEL_FLAGS), (training, TRAINING_FLAGS))
    if program == "mos":
        head = model["head"] if isinstance(model["head"], dict) else {}
        tables = ((model, MOS_MODEL_FLAGS), (head, MOS_HEAD_FLAGS), (training, MOS_TRAINING_FLAGS))
        if training.get("max_seq_len"):
            flags += ["--max_seq_len_delta", str(int(training["max_seq_len"]) - int(
                training.get("bptt", 70)))]
    for part, table in tables:
        for key, (flag, default) in table.items():
            flags += [flag, repr(part.get(key, default))]
    if program == "mos":
        flags.append("--single_gpu")  # one process: its nn.DataParallel is for several GPUs
    if not cuda:
        flags.append("--cuda")  # main.py's --cuda is store_false: given, it turns CUDA off
    return flags


def reference_curve(stdout):
    """The validation perplexities main.py printed, epoch by epoch."""
    found = {int(e): float(p) for e, p in EPOCH_LINE.findall(stdout)}
    return [found[e] for e in sorted(found)]


def reference_timing(stdout):
    """main.py's timings from its output: each epoch's seconds (its `time:`, validation
    included), the median of its `ms/batch` lines per epoch (each the mean over 200 training
    batches), and `reference_launcher`'s counts (training windows, target positions, the
    CUDA allocator's peak in MiB, None on a CPU)."""
    epochs = {int(e): float(t) for e, t in EPOCH_TIME.findall(stdout)}
    batches = {}
    for epoch, ms in BATCH_TIME.findall(stdout):
        batches.setdefault(int(epoch), []).append(float(ms))
    timing = {"epoch_seconds": [epochs[e] for e in sorted(epochs)],
              "ms_per_batch": [float(np.median(batches[e])) if e in batches else None
                               for e in sorted(epochs)]}
    counts = LAUNCHER_LINE.search(stdout)
    if counts:
        timing.update(windows=int(counts[1]), targets=int(counts[2]),
                      peak_mib=None if counts[3] == "-" else float(counts[3]))
    return timing


def reference_words_per_second(timing, epoch=-1):
    """main.py's training words/s in `epoch` of a `reference_timing`: its mean window
    (target positions / windows, the launcher's counts) over that epoch's median `ms/batch`;
    None without both."""
    ms = timing["ms_per_batch"][epoch] if timing["ms_per_batch"] else None
    if not ms or not timing.get("windows"):
        return None
    return timing["targets"] / timing["windows"] / ms * 1e3


def cut_split(lines, max_tokens):
    """The first whole lines of a split holding at most `max_tokens` tokens (each line's
    words and its end of sentence); all of them for None."""
    if max_tokens is None:
        return lines
    kept, count = [], 0
    for line in lines:
        count += len(line.split()) + 1
        if count > max_tokens:
            break
        kept.append(line)
    return kept


def write_text(corpus_dir, out, train_tokens, valid_tokens):
    """The cut corpus in `out` (train.txt, valid.txt, test.txt, vocab.txt); returns the
    vocabulary size."""
    out.mkdir(parents=True, exist_ok=True)
    vocabulary, seen = [], set()
    for split, limit in (("train", train_tokens), ("valid", valid_tokens),
                         ("test", valid_tokens)):
        source = next(corpus_dir.glob(f"*{split}.txt"))
        lines = cut_split(source.read_text(encoding="utf-8").splitlines(), limit)
        (out / f"{split}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
        for line in lines:
            for word in [*line.split(), "<eos>"]:
                if word not in seen:
                    seen.add(word)
                    vocabulary.append(word)
    (out / "vocab.txt").write_text("\n".join(vocabulary) + "\n", encoding="utf-8")
    return len(vocabulary)


def salesforce_names(num_layers):
    """{main.py's `RNNModel` parameter name: (Keras variable path suffix, transpose?)}: our
    PyTorch peer's names (`reference_peer.peer_to_keras_names`) as the checkout holds them,
    each LSTM inside its `WeightDrop` with the recurrent matrix as `weight_hh_l0_raw`."""
    peer = types.SimpleNamespace(rnns=[None] * num_layers, head="softmax")
    names = {}
    for name, target in peer_to_keras_names(peer).items():
        layer = re.fullmatch(r"rnns\.(\d+)\.(\w+)", name)
        if layer:
            raw = "_raw" if layer[2] == "weight_hh_l0" else ""
            name = f"rnns.{layer[1]}.module.{layer[2]}{raw}"
        names[name] = target
    return names


def salesforce_arrays(model):
    """{main.py's parameter name: array} of a zoo AWD-LSTM softmax model's weights."""
    values = {v.path.split("/", 1)[1]: np.asarray(v.numpy()) for v in model.weights}
    arrays = {}
    for name, (suffix, transpose) in salesforce_names(model.backbone.num_layers).items():
        (value,) = [v for k, v in values.items() if k.endswith(suffix)]
        arrays[name] = value.T if transpose else value
    return arrays


def reference_constructor(config, vocab_size):
    """main.py's `RNNModel` arguments for the resolved preset `config`."""
    flags = dict(zip(*[iter(reference_flags(config, 0, 1, "-", "-", cuda=True))] * 2))
    return {"rnn_type": "LSTM", "ntoken": int(vocab_size), "ninp": int(flags["--emsize"]),
            "nhid": int(flags["--nhid"]), "nlayers": int(flags["--nlayers"]),
            "dropout": float(flags["--dropout"]), "dropouth": float(flags["--dropouth"]),
            "dropouti": float(flags["--dropouti"]), "dropoute": float(flags["--dropoute"]),
            "wdrop": float(flags["--wdrop"]), "tie_weights": True}


def write_same_init(checkout, config, seed, vocab_size, folder):
    """Our initial model at `seed` as `folder`/init.keras (zoo.train's `--init-from`) and,
    the same weights, as main.py's `--resume` file init.pt. Returns both paths."""
    from zoo.runs.builders import build_model  # deferred: Keras only when asked for
    from zoo.runs.settings import RunSettings

    folder.mkdir(parents=True, exist_ok=True)
    config = json.loads(json.dumps(config))
    config["training"]["seed"] = seed
    model = build_model(RunSettings.from_config(config), vocab_size)
    model.build((None, None))
    keras_path, torch_path = folder / "init.keras", folder / "init.pt"
    model.save(keras_path)
    np.savez(folder / "init.npz", **salesforce_arrays(model))
    (folder / "init.json").write_text(json.dumps(reference_constructor(config, vocab_size)))
    subprocess.run([sys.executable, str(LAUNCHER), str(checkout), "--initial-model",
                    str(torch_path), str(folder / "init.npz"), str(folder / "init.json")],
                   cwd=folder, check=True)
    return keras_path, torch_path


def run_reference(checkout, config, seed, epochs, data, work, cuda, resume=None,
                  real_length_rate=False, log_interval=200, gc_collect=True):
    """main.py's validation curve and its timings (`reference_timing`, with the process's
    wall seconds)."""
    folder = work / f"reference-{seed}"
    folder.mkdir(parents=True)
    if reference_program(config) == "mos":  # it copies main.py and model.py from its folder
        for name in ("main.py", "model.py"):
            (folder / name).symlink_to(pathlib.Path(checkout).resolve() / name)
    command = [sys.executable, str(LAUNCHER), str(checkout),
               *(["--real-length-rate"] if real_length_rate else []),
               *([] if gc_collect else ["--no-gc-collect"]),
               *reference_flags(config, seed, epochs, data, folder / "model.pt", cuda,
                                log_interval),
               *(["--resume", str(resume)] if resume else [])]
    start = time.perf_counter()
    proc = subprocess.run(command, cwd=folder, capture_output=True, text=True)
    wall = time.perf_counter() - start
    (folder / "stdout.txt").write_text(proc.stdout + proc.stderr)
    curve = reference_curve(proc.stdout)
    # zihangdai/mos's main.py ends with `.cuda()` for its test pass, which fails on a CPU
    # after the last epoch's validation: the curve is whole, the exit status is not read
    if len(curve) < epochs:
        raise SystemExit(f"main.py (seed {seed}) stopped after {len(curve)} of {epochs} "
                         f"epochs; its output is in {folder / 'stdout.txt'}:\n"
                         f"{proc.stderr[-2000:]}")
    return curve[:epochs], {**reference_timing(proc.stdout), "wall_seconds": wall}


def run_ours(preset, sets, seed, data, work, init_from=None):
    """zoo.train's validation curve and its timings (metrics.json's, with the process's
    wall seconds)."""
    out = work / f"tflm-{seed}"
    start = time.perf_counter()
    subprocess.run([sys.executable, "-m", "zoo.train", "--preset", preset, "--seed", str(seed),
                    "--out", str(out), "--quiet", *[a for s in sets for a in ("--set", s)],
                    *(["--init-from", str(init_from)] if init_from else [])],
                   cwd=REPO, check=True)
    wall = time.perf_counter() - start
    metrics = json.loads((out / "metrics.json").read_text())
    history = metrics["history"]
    timing = {key: [h.get(key) for h in history] for key in (
        "epoch_seconds", "train_seconds", "first_step_seconds", "validation_seconds",
        "words_per_second")}
    timing.update(wall_seconds=wall, peak_mib=metrics.get("device_memory_mib"),
                  test_perplexity=metrics.get("test_perplexity"))
    return [h["val_perplexity"] for h in history], timing


def timing_table(timings):
    """Per side and seed: the first epoch's and the last epoch's seconds (validation
    included), training words/s once warm (the last epoch: tflm's `words_per_second`;
    main.py's mean window over its median `ms/batch` of that epoch), the whole process's
    wall seconds, the GPU allocator's peak."""
    lines = ["| side | seed | epoch 1 s | last epoch s | words/s, last epoch | whole run s | "
             "peak MiB |", "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for (side, seed), t in sorted(timings.items()):
        words = (t["words_per_second"][-1] if side == "keras"
                 else reference_words_per_second(t))
        peak = "-" if t.get("peak_mib") is None else f"{t['peak_mib']:,.0f}"
        words = "-" if words is None else f"{words:,.0f}"
        lines.append(f"| {'tflm' if side == 'keras' else 'main.py'} | {seed} | "
                     f"{t['epoch_seconds'][0]:.1f} | {t['epoch_seconds'][-1]:.1f} | {words} | "
                     f"{t['wall_seconds']:.1f} | {peak} |")
    return "\n".join(lines) + "\n"


def table(curves, seeds, note):
    head = " | ".join([f"tflm seed {s}" for s in seeds] + [f"reference seed {s}" for s in seeds])
    lines = [note, "", f"| epoch | {head} | gap | spread | within | tflm lower |",
             "| --- " * (2 * len(seeds) + 5) + "|"]
    within_all = True
    for e in range(min(len(c) for c in curves.values())):
        ours = [curves["keras", s][e] for s in seeds]
        theirs = [curves["peer", s][e] for s in seeds]
        gap = abs(np.mean(ours) - np.mean(theirs))
        spread = max(np.ptp(ours), np.ptp(theirs))
        within_all &= bool(gap <= spread)
        cells = " | ".join(f"{v:.1f}" for v in ours + theirs)
        lower = sum(a < b for a in ours for b in theirs)
        lines.append(f"| {e + 1} | {cells} | {gap:.1f} | {spread:.1f} | "
                     f"{'yes' if gap <= spread else 'no'} | {lower}/{len(ours) * len(theirs)} |")
    lines += ["", f"Gap within the seed spread at every epoch: {'yes' if within_all else 'no'}. "
              "tflm lower: of the pairs (tflm seed, reference seed), those where tflm's "
              "perplexity is lower (the Mann-Whitney count; half of them when the two sides "
              "train alike, all or none when one is systematically lower)."]
    return "\n".join(lines) + "\n", within_all


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reference", required=True, type=pathlib.Path,
                   help="a checkout of the preset's reference (salesforce/awd-lstm-lm or "
                   "zihangdai/mos): its main.py is run")
    p.add_argument("--preset", default="awd_lstm_ptb")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--seeds", type=int, nargs="+", default=[141, 142])
    p.add_argument("--train-tokens", type=int)
    p.add_argument("--valid-tokens", type=int)
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    p.add_argument("--same-init", action="store_true",
                   help="start both sides of a seed from our initial weights at that seed")
    p.add_argument("--reference-rate", choices=("drawn", "real"), default="drawn",
                   help="real: main.py's cut last window trains at lr x real / bptt "
                   "(reference_launcher.py --real-length-rate, an experiment); drawn: as "
                   "main.py does")
    p.add_argument("--reference-gc", choices=("on", "off"), default="on",
                   help="off: main.py's gc.collect() calls return at once "
                   "(reference_launcher.py --no-gc-collect, a speed experiment: zihangdai/mos "
                   "collects the heap after every small batch); on: as main.py does")
    p.add_argument("--log-interval", type=int, default=200,
                   help="main.py's --log-interval: its ms/batch lines, read for its words/s "
                   "(default 200, main.py's own; lower for a cut text of few batches)")
    p.add_argument("--data-dir", default=os.environ.get("TFLM_DATA_DIR",
                                                        str(REPO.parent / "shared" / "data")))
    p.add_argument("--work", type=pathlib.Path, help="folder for the runs (default: a new "
                   "temporary one)")
    p.add_argument("--results", help="default: results/reference_curves.md (softmax presets; "
                   "reference_curves_mos.md for MoS)")
    p.add_argument("--figure", help="default: the results file's path with .png")
    args = p.parse_args(argv)
    if len(args.seeds) < 2:
        p.error("give at least two --seeds: the gap is read against the seed-to-seed spread")
    from zoo.runs.config import resolve_config  # deferred: Keras after the arguments
    program = reference_program(resolve_config(args.preset, list(args.set)))
    check_checkout(args.reference, program)
    stem = "reference_curves" + ("_mos" if program == "mos" else "")
    args.results = args.results or str(results_path(__file__, f"{stem}.md"))
    args.figure = args.figure or str(pathlib.Path(args.results).with_suffix(".png"))
    if args.same_init and program != "salesforce":
        p.error("--same-init starts salesforce's main.py only (through its --resume); "
                "zihangdai/mos's main.py has no such flag")
    work = args.work or pathlib.Path(tempfile.mkdtemp(prefix="reference-curves-"))
    data = work / "text"
    corpus_name = resolve_config(args.preset, list(args.set))["corpus"]["name"]
    corpus_dir = pathlib.Path(args.data_dir) / {"ptb": "penn"}.get(corpus_name, corpus_name)
    vocab_size = write_text(corpus_dir, data, args.train_tokens, args.valid_tokens)
    sets = [*args.set, f"training.epochs={args.epochs}", f"corpus.name={data}",
            f"corpus.vocab_size={vocab_size}"]
    config = resolve_config(args.preset, sets)
    start, curves, timings = time.time(), {}, {}
    for seed in args.seeds:
        keras_init = torch_init = None
        if args.same_init:
            keras_init, torch_init = write_same_init(args.reference, config, seed, vocab_size,
                                                     work / f"init-{seed}")
        curves["peer", seed], timings["peer", seed] = run_reference(
            args.reference, config, seed, args.epochs, data, work, args.device == "gpu",
            resume=torch_init, real_length_rate=args.reference_rate == "real",
            log_interval=args.log_interval, gc_collect=args.reference_gc == "on")
        print(f"reference seed {seed}: {[round(v, 1) for v in curves['peer', seed]]}", flush=True)
        curves["keras", seed], timings["keras", seed] = run_ours(args.preset, sets, seed, data,
                                                                 work, keras_init)
        print(f"tflm seed {seed}: {[round(v, 1) for v in curves['keras', seed]]}", flush=True)
    # a copy without .git would otherwise name the commit of a repository around it
    commit = commit_of(args.reference) or "(not a git checkout)"
    note = (f"KERAS_BACKEND={os.environ.get('KERAS_BACKEND', 'tensorflow')}; reference "
            f"checkout {commit} under reference_launcher.py's shims; {vocab_size} words; "
            f"{time.time() - start:.0f} s. Validation perplexity per epoch, "
            + ("both sides of a seed from our initial weights at that seed (--same-init)"
               if args.same_init else "each side from its own initialisation")
            + (", main.py's cut windows at lr x real / bptt (--reference-rate real, an "
               "experiment)" if args.reference_rate == "real" else "")
            + (", main.py's gc.collect() calls skipped (--reference-gc off, a speed "
               "experiment)" if args.reference_gc == "off" else "")
            + ", dropout on; gap = |mean tflm - mean reference|, spread = the "
            "largest seed-to-seed difference within one side.")
    body, _ = table(curves, args.seeds, note)
    body += ("\nTimes, run one after another on this machine (" + args.device + "):\n\n"
             + timing_table(timings))
    pathlib.Path(args.results).with_suffix(".json").write_text(json.dumps(
        {"preset": args.preset, "sets": args.set, "device": args.device,
         "reference_rate": args.reference_rate, "reference_gc": args.reference_gc,
         "same_init": args.same_init,
         "curves": {f"{side}-{seed}": c for (side, seed), c in curves.items()},
         "timings": {f"{side}-{seed}": t for (side, seed), t in timings.items()}}, indent=1))
    figure(curves, args.figure, f"{args.preset} vs main.py, {' '.join(args.set)}")
    publish(f"Learning curves against the reference code: {args.preset}", body, args.results)
    print(f"figure: {args.figure}")
    return 0 if all(math.isfinite(v) for c in curves.values() for v in c) else 1


if __name__ == "__main__":
    sys.exit(main())
