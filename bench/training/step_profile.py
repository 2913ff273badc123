"""Where one training step's time goes: tflm's train step on a Keras backend against
the published code's own model and training step (salesforce/awd-lstm-lm's for a softmax
preset, zihangdai/mos's for a mixture of softmaxes), on a GPU (or the CPU).

    python -m bench.training.step_profile --reference /path/to/awd-lstm-lm \\
        --preset awd_lstm_ptb --steps 30 --warmup 10 [--backends jax,torch] \\
        [--set KEY=VALUE ...] [--vocab 10000] [--device gpu|cpu] [--out DIR] [--no-publish]

Each system runs in a process of its own (no two frameworks or CUDA libraries share one;
TensorFlow is never imported), at the preset's sizes, batch and bptt, on fixed windows of
bptt random tokens out of `--vocab` words:
- tflm, per backend of `--backends` (default $KERAS_BACKEND, else jax): the model
  `python -m zoo.train` builds (`zoo.runs.builders`), compiled with its optimizer, with its
  window shapes for `training.fixed_windows` (JAX pads a window to a multiple of 4), trained
  by `model.fit` (`LanguageModel.train_step`) on in-memory windows
  (`tools.frameworks.keras_runner.PresetFit`);
- salesforce main.py's step (with `--reference`): its `RNNModel` at the preset's sizes
  (`reference_curves.reference_constructor`), its `SplitCrossEntropyLoss` and the lines of
  its train() loop (repackage_hidden, forward with return_h, the split loss, AR, TAR,
  backward, clip_grad_norm_, SGD with weight decay; lr x seq_len / bptt is lr: every
  window is bptt long), under `reference_launcher.py`'s shims;
- zihangdai/mos main.py's step (with `--reference` a checkout of it, for a MoS preset): its
  `RNNModel` as its main.py builds it, the same lines of its train() with the NLL of the
  mixture's log-probabilities as the loss, one small batch of the whole batch (its default
  `--small_batch_size`), its per-small-batch `gc.collect()` left out (as
  `reference_curves --reference-gc off`). `--reference` must hold the preset's program:
  the other one's checkout is refused before anything runs
  (`bench.reproductions.reference_programs`).

`--warmup` steps, `--steps` timed steps (wall: from one step's end to the next, each ending
on a synchronised device: a fetch of the step's loss, `torch.cuda.synchronize()`), then
`--steps` steps under the profiler, which give the device time ("profiled ms": their
median wall, the timed one plus the profiler's cost).

Device-busy ms per step: the union of the kernels' intervals (kernels overlapping on two
streams count once) over the profiled steps. "Op ms" adds each kernel's or op's own time (its
children's taken out); the top-8 shares divide it. Read from:
- JAX: `jax.profiler.trace`'s `*.xplane.pb` (`jax.profiler.ProfileData`). GPU: every event of
  the `Stream #N(...)` lines of the `/device:GPU:*` planes, CUPTI's kernel / memcpy / memset
  activity; the "XLA Ops" / "XLA Modules" lines a viewer derives repeat that time per HLO op
  and are not read. Without a `Stream #` line, the GPU events carrying a kernel / memcpy /
  memset details stat. CPU: the events with an `hlo_op` stat on `/host:CPU`'s threads
  (XLA's thunks; two threads' ops can overlap). The JSON lists every plane, line and count.
- PyTorch: `torch.profiler`. GPU: the CUDA events (kernels, memcpy, memset; not user
  annotations): what `key_averages()`' self device time totals. CPU: the torch ops per thread.
Kernels per step leave copies and sets out (CPU: ops, nested ones included). Idle/host share
= 1 - busy / the profiled steps' mean wall: the part of a step the device waits for the host
(Python, dispatch, launches, the synchronising fetch).

Caveats: the profiler adds host time (the share reads a little high where "profiled ms"
exceeds the wall) and, on a CPU, slows the ops themselves (a record per XLA op: JAX's ops ran
about twice as long at 16 / 32 wide), so a CPU run shows the op mix, not the split. XLA may
run its command buffers (CUDA graphs) thunk by thunk while a profile is active. Writes
results/step_profile.md (unless `--no-publish`) and OUT/step_profile.json with every figure.
"""

import argparse
import collections
import json
import os
import pathlib
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
import types

import numpy as np

from bench.harness import REPO, module_command, publish, results_path

TOP = 8
COPIES = ("Memcpy", "Memset")
REFERENCE = "salesforce main.py's step"
REFERENCES = {"salesforce": REFERENCE, "mos": "zihangdai/mos main.py's step"}
ACTIVITY_STATS = {"kernel_details", "memcpy_details", "memset_details"}
MAIN_PY_SPLITS = ((500000, [4200, 35000, 180000]), (75000, [2800, 20000, 76000]))


def timeline_summary(lines, steps):
    """Busy time, own op time, count and top ops of timelines `lines` ([[(name, start_ns,
    duration_ns)]]; events on one line nest, lines may overlap), per step of `steps`."""
    spans = sorted((start, start + duration) for line in lines for _, start, duration in line)
    busy, reach = 0.0, -np.inf
    for start, end in spans:
        if end > reach:
            busy += end - max(start, reach)
            reach = end
    own, count = collections.Counter(), 0
    for line in lines:
        stack = []
        for name, start, duration in sorted(line, key=lambda e: (e[1], -e[2])):
            while stack and stack[-1][0] <= start:
                stack.pop()
            if stack:
                own[stack[-1][1]] -= min(start + duration, stack[-1][0]) - start
            own[name] += duration
            stack.append((start + duration, name))
            count += not name.startswith(COPIES)
    total = sum(own.values())
    top = [{"name": name, "ms_per_step": t / 1e6 / steps, "share": t / total if total else 0.0}
           for name, t in own.most_common(TOP)]
    return {"busy_ms": busy / 1e6 / steps if spans else None, "op_ms": total / 1e6 / steps,
            "kernels_per_step": count / steps, "top": top}


def xplane_lines(profile):
    """(what was read, timelines, {plane: [[line, events]]}) of a `jax.profiler.ProfileData`."""
    layout = {plane.name: [[line.name, sum(1 for _ in line.events)] for line in plane.lines]
              for plane in profile.planes}
    gpu = [line for plane in profile.planes if plane.name.startswith("/device:GPU:")
           for line in plane.lines]
    if gpu and any(line.name.startswith("Stream #") for line in gpu):
        return "GPU: the 'Stream #' lines of /device:GPU:*", _events(
            [line for line in gpu if line.name.startswith("Stream #")]), layout
    if gpu:
        return ("GPU (no 'Stream #' line): events with a kernel / memcpy / memset details stat",
                _events(gpu, ACTIVITY_STATS), layout)
    host = [line for plane in profile.planes if plane.name == "/host:CPU" for line in plane.lines]
    return "CPU: the events with an hlo_op stat on /host:CPU", _events(host, {"hlo_op"}), layout


def _events(lines, stats=None):
    return [[(e.name, e.start_ns, e.duration_ns) for e in line.events
             if stats is None or any(key in stats for key, _ in e.stats)] for line in lines]


def jax_profile(run, steps, folder):
    import jax  # deferred: the JAX worker only
    from jax.profiler import ProfileData

    options = jax.profiler.ProfileOptions()
    options.python_tracer_level = 0  # no record per Python call
    with jax.profiler.trace(str(folder), profiler_options=options):
        times = run(steps)
    path = max(pathlib.Path(folder).rglob("*.xplane.pb"), key=os.path.getmtime)
    source, lines, layout = xplane_lines(ProfileData.from_file(str(path)))
    return times, dict(timeline_summary(lines, steps), source=source, layout=layout,
                       trace=str(path))


def torch_profile(run, steps, cuda):
    import torch  # deferred: the PyTorch workers only
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=activities) as prof:
        times = run(steps)
    wanted = DeviceType.CUDA if cuda else DeviceType.CPU
    events = [e for e in prof.events()
              if e.device_type == wanted and not getattr(e, "is_user_annotation", False)]
    by_line = collections.defaultdict(list)
    for i, e in enumerate(events):  # kernels do not nest: one line each; ops per thread
        by_line[i if cuda else e.thread].append(
            (e.name, 1e3 * e.time_range.start, 1e3 * (e.time_range.end - e.time_range.start)))
    source = "CUDA events (torch.profiler)" if cuda else "torch ops on the host (torch.profiler)"
    return times, dict(timeline_summary(list(by_line.values()), steps), source=source)


def tflm_system(args, config, folder):
    from zoo.runtime import allocator, xla_flags
    allocator.keep_freed_memory()
    xla_flags.fast_cpu_compiles()  # as zoo.train, before the framework starts
    # deferred: Keras after the process set-up above
    import keras
    from tools.frameworks.keras_runner import PresetFit
    from tools.frameworks.measure import add_memory, keras_device
    from zoo.runs.settings import RunSettings

    backend = keras.backend.backend()
    on_gpu, device = keras_device(backend, args.device)
    fit = PresetFit(RunSettings.from_config(config), args.vocab, args.warmup + 2 * args.steps)
    model, pad = fit.model, fit.pad
    batch, bptt = fit.training.batch_size, fit.training.bptt

    class StepWall(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if batch == 0:
                self.times, self.last = [], time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            keras.ops.convert_to_numpy(logs["loss"])  # waits for the step
            now = time.perf_counter()
            self.times.append(now - self.last)
            self.last = now

    def run(n):
        timer = StepWall()
        fit(n, [timer])
        return timer.times

    if backend == "jax":
        result = measure(run, args, jax_profile, folder)
    else:
        result = measure(run, args, lambda r, s, f: torch_profile(r, s, on_gpu), folder)
    result.update(system=f"tflm, {backend}", backend=backend, device=device, batch=batch,
                  bptt=bptt, padded_to=-(-bptt // pad) * pad,
                  traces=model.traced_steps["train"] if backend != "torch" else None)
    add_memory(result, backend, on_gpu)
    return result


def reference_system(args, config, folder):
    from bench.reproductions.reference_curves import reference_constructor, reference_flags
    from bench.reproductions.reference_launcher import use_checkout
    from bench.reproductions.reference_programs import reference_program

    program = reference_program(config)  # its checkout checked by `main` before the run
    use_checkout(args.reference)
    # deferred: the checkout's modules, after its shims
    import torch
    import model as reference_model
    from utils import batchify, get_batch, repackage_hidden

    from tools.frameworks.measure import add_memory, cpu_description

    cuda = args.device == "gpu"
    if cuda and not torch.cuda.is_available():
        raise SystemExit("--device gpu: PyTorch sees no GPU")
    flags = dict(zip(*[iter(reference_flags(config, 0, 1, "-", "-", cuda=True))] * 2))
    alpha, beta = float(flags["--alpha"]), float(flags["--beta"])
    batch, bptt, clip = int(flags["--batch_size"]), int(flags["--bptt"]), float(flags["--clip"])
    torch.manual_seed(0)
    made = reference_constructor(config, args.vocab)
    criterion = None  # salesforce's split softmax; zihangdai/mos's head is in its model
    if program == "mos":
        net, loss_of = mos_model(reference_model, made, flags)
    else:
        from splitcross import SplitCrossEntropyLoss

        net = reference_model.RNNModel(**made)
        splits = next((s for above, s in MAIN_PY_SPLITS if args.vocab > above), [])
        criterion = SplitCrossEntropyLoss(int(flags["--emsize"]), splits=splits, verbose=False)

        def loss_of(output, targets):
            return criterion(net.decoder.weight, net.decoder.bias, output, targets)
    if cuda:
        net = net.cuda()  # Module.cuda() moves in place: loss_of's criterion moves too
        if criterion is not None:
            criterion.cuda()
    params = list(net.parameters()) + (list(criterion.parameters()) if criterion else [])
    optimizer = torch.optim.SGD(params, lr=float(flags["--lr"]),
                                weight_decay=float(flags["--wdecay"]))
    main_args = types.SimpleNamespace(cuda=cuda, bptt=bptt)
    ids = torch.randint(0, args.vocab, ((args.warmup + 2 * args.steps) * bptt * batch + batch,))
    train_data = batchify(ids, batch, main_args)
    state = {"hidden": net.init_hidden(batch), "i": 0}

    def step():  # main.py's train(), one batch (zihangdai/mos: one small batch of batch)
        data, targets = get_batch(train_data, state["i"], main_args, seq_len=bptt)
        state["i"] += bptt
        net.train()
        hidden = repackage_hidden(state["hidden"])
        optimizer.zero_grad()
        output, state["hidden"], rnn_hs, dropped_rnn_hs = net(data, hidden, return_h=True)
        loss = loss_of(output, targets.contiguous().view(-1))
        if alpha:
            loss = loss + sum(alpha * h.pow(2).mean() for h in dropped_rnn_hs[-1:])
        if beta:
            loss = loss + sum(beta * (h[1:] - h[:-1]).pow(2).mean() for h in rnn_hs[-1:])
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(params, clip)
        optimizer.step()

    def run(n):
        times, last = [], time.perf_counter()
        for _ in range(n):
            step()
            if cuda:
                torch.cuda.synchronize()
            now = time.perf_counter()
            times.append(now - last)
            last = now
        return times

    result = measure(run, args, lambda r, s, f: torch_profile(r, s, cuda), folder)
    result.update(system=REFERENCES[program], backend="torch", batch=batch, bptt=bptt,
                  padded_to=bptt,
                  device=torch.cuda.get_device_name(0) if cuda else cpu_description())
    add_memory(result, "torch", cuda)
    return result


def mos_model(reference_model, made, flags):
    """zihangdai/mos's `RNNModel` as its main.py builds it (its negative `--nhidlast` and
    `--dropoutl` mean `--emsize` and `--dropouth`) and the loss of its train(): the NLL of
    the mixture's log-probabilities (its forward returns them). Its per-small-batch
    `gc.collect()` is left out, as `reference_curves --reference-gc off` runs it."""
    import torch

    last = int(flags["--nhidlast"])
    latent_dropout = float(flags["--dropoutl"])
    net = reference_model.RNNModel(
        made["rnn_type"], made["ntoken"], made["ninp"], made["nhid"],
        last if last > 0 else made["ninp"], made["nlayers"], made["dropout"],
        made["dropouth"], made["dropouti"], made["dropoute"], made["wdrop"], True,
        latent_dropout if latent_dropout >= 0 else made["dropouth"], int(flags["--n_experts"]))

    def loss_of(log_prob, targets):
        return torch.nn.functional.nll_loss(log_prob.view(-1, log_prob.size(2)), targets)

    return net, loss_of


def measure(run, args, profile, folder):
    """Warm-up, timed and profiled steps of `run(n)` (which returns n step seconds)."""
    started = time.perf_counter()
    run(args.warmup)
    warmup_s = time.perf_counter() - started
    times = run(args.steps)
    profiled, found = profile(run, args.steps, folder / "trace")
    busy, mean = found["busy_ms"], 1e3 * statistics.mean(profiled)
    return dict(found, wall_ms=1e3 * statistics.median(times), step_ms=[1e3 * t for t in times],
                mean_wall_ms=1e3 * statistics.mean(times), profiled_ms=1e3 * statistics.median(
                    profiled), profiled_mean_ms=mean, profiled_step_ms=[1e3 * t for t in profiled],
                warmup_s=warmup_s, idle_share=None if busy is None else 1 - busy / mean)


def child(args):
    from zoo.runs.config import resolve_config

    config = resolve_config(args.preset, list(args.set))
    folder = pathlib.Path(args.out) / args.child
    folder.mkdir(parents=True, exist_ok=True)
    system = reference_system if args.child == "reference" else tflm_system
    result = system(args, config, folder)
    result["tokens_per_step"] = result["batch"] * result["bptt"]
    result["words_per_s"] = result["tokens_per_step"] / result["wall_ms"] * 1e3
    (folder / "result.json").write_text(json.dumps(result, indent=1))


def run_child(args, name, backend, out):
    """One system in its own process; its result, or {"system", "error"}."""
    cmd = module_command("bench.training.step_profile", "--child", name, "--preset", args.preset,
                         "--steps", args.steps, "--warmup", args.warmup, "--vocab", args.vocab,
                         "--device", args.device, "--out", out,
                         *(["--reference", args.reference] if args.reference else []),
                         *[a for s in args.set for a in ("--set", s)])
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = dict(os.environ, KERAS_BACKEND=backend, PYTHONPATH=path)  # keeps carried packages
    if args.device == "cpu":
        env.update(CUDA_VISIBLE_DEVICES="", JAX_PLATFORMS="cpu")
    log = out / f"{name}.log"
    label = "the reference's step" if name == "reference" else f"tflm, {backend}"
    with open(log, "w") as f:
        try:
            code = subprocess.run(cmd, cwd=REPO, env=env, stdout=f, stderr=subprocess.STDOUT,
                                  timeout=args.timeout).returncode
        except subprocess.TimeoutExpired:
            code = f"timed out after {args.timeout} s"
    if code:
        tail = log.read_text(errors="replace").strip().splitlines()[-1:]
        return {"system": label, "error": f"exit {code}: {tail} (log {log})"}
    return json.loads((out / name / "result.json").read_text())


def _ms(value, digits=2):
    return "-" if value is None else f"{value:,.{digits}f}"


def report(rows, args):
    lines = ["| system | device | wall ms/step (median) | device-busy ms/step | idle/host share "
             "| kernels (CPU: ops)/step | tokens/step | words/s | profiled ms | peak memory MiB |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['system']} | failed: {r['error']} |" + " |" * 8)
            continue
        share = "-" if r["idle_share"] is None else f"{100 * r['idle_share']:.0f} %"
        lines.append(
            f"| {r['system']} | {r['device']} | {_ms(r['wall_ms'])} | {_ms(r['busy_ms'])} | "
            f"{share} | {r['kernels_per_step']:,.0f} | {r['tokens_per_step']:,} | "
            f"{r['words_per_s']:,.0f} | {_ms(r['profiled_ms'])} | "
            f"{_ms(r['peak_memory_mib'], 0)} ({r['memory_kind']}) |")
    ok = [r for r in rows if "error" not in r]
    padded = "".join(f"; {r['system']} pads them to {r['padded_to']} as zoo.train does"
                     for r in ok if r["padded_to"] != r["bptt"])
    lines += ["", f"{args.steps} timed steps after {args.warmup} warm-up steps, then "
              f"{args.steps} profiled ones, on fixed windows of bptt random tokens out of "
              f"{args.vocab:,} words{padded}. Busy: the union of the kernels' (CPU: ops') "
              "intervals in the profiled steps; idle/host share = 1 - busy / their mean wall; "
              "profiled ms: their median. Read from: "
              + "; ".join(f"{r['system']}: {r['source']}" for r in ok) + "."]
    for r in ok:
        lines += ["", f"Top {TOP} of {r['system']} (own time per step, share of "
                      f"{_ms(r['op_ms'])} ms):", "", "| kernel / op | ms/step | share |",
                  "| --- | ---: | ---: |"]
        lines += [f"| `{t['name'][:90]}` | {t['ms_per_step']:.3f} | {100 * t['share']:.1f} % |"
                  for t in r["top"]]
    return "\n".join(lines) + "\n"


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reference", help="a salesforce/awd-lstm-lm checkout (its row)")
    p.add_argument("--preset", default="awd_lstm_ptb")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--backends", default=os.environ.get("KERAS_BACKEND", "jax"),
                   help="tflm's Keras backends, comma-separated; empty: the reference only")
    p.add_argument("--vocab", type=int, default=10000, help="vocabulary size (PTB's)")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--device", choices=("gpu", "cpu"), default="gpu")
    p.add_argument("--out", help="folder for step_profile.json, traces, logs (default: new)")
    p.add_argument("--timeout", type=int, default=1800, help="seconds per system")
    p.add_argument("--no-publish", action="store_true")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup < 1:
        p.error("--steps and --warmup must be >= 1 (the warm-up compiles)")
    if args.reference and not args.child:
        from bench.reproductions.reference_programs import check_checkout, reference_program
        from zoo.runs.config import resolve_config
        try:  # the preset's program: salesforce's main.py, or zihangdai/mos's for MoS
            check_checkout(args.reference, reference_program(
                resolve_config(args.preset, list(args.set))))
        except SystemExit as refused:
            p.error(str(refused))
    if "tensorflow" in args.backends.split(","):
        p.error("--backends: jax or torch (no profile is read for TensorFlow)")
    if args.child:
        return child(args)
    out = pathlib.Path(args.out or tempfile.mkdtemp(prefix="step-profile-")).resolve()
    out.mkdir(parents=True, exist_ok=True)
    systems = [("tflm-" + b, b) for b in filter(None, args.backends.split(","))]
    systems += [("reference", "torch")] if args.reference else []
    if not systems:
        p.error("nothing to run: give --backends or --reference")
    rows = []
    for name, backend in systems:
        rows.append(run_child(args, name, backend, out))
        print(f"{rows[-1]['system']}: " + (rows[-1].get("error") or
                                          f"{rows[-1]['wall_ms']:.2f} ms/step"), flush=True)
    (out / "step_profile.json").write_text(json.dumps(
        {"settings": {k: v for k, v in vars(args).items() if k != "child"}, "rows": rows},
        indent=1))
    words = [a if a != args.reference else "AWD_LSTM_LM_CHECKOUT"
             for a in (sys.argv[1:] if argv is None else argv)]
    publish(f"Where a training step's time goes: {args.preset}, on the {args.device.upper()}",
            report(rows, args),
            None if args.no_publish else results_path(__file__, "step_profile.md"),
            "python -m bench.training.step_profile " + shlex.join(words))
    print(f"figures: {out / 'step_profile.json'}")
    return 0 if all("error" not in r for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
