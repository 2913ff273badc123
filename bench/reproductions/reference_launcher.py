"""Run salesforce/awd-lstm-lm's own `main.py` from a checkout on current PyTorch, with the two
documented shims and nothing else changed:

    python bench/reproductions/reference_launcher.py CHECKOUT [main.py's flags ...]

1. Weight drop in evaluation mode (the reference's issue #79, on every PyTorch since 1.0):
   `WeightDrop._setweights` hands the LSTM `dropout(raw, training=False)`, which is the raw
   `Parameter` itself, so the LSTM registers it as a parameter and the next training step's
   plain tensor is refused ("cannot assign ... as parameter"). The shim gives evaluation a
   plain tensor (`raw.detach()`); training is the reference's own line: `dropout(raw, p)`,
   through which the gradient reaches the raw weight. main.py never sets `variational`.
2. `torch.load` of the reference's own pickles (its corpus cache and the `[model, criterion,
   optimizer]` it saves and reloads for the test pass): PyTorch 2.6 made `weights_only=True`
   the default, which refuses them; the shim passes `weights_only=False` as earlier
   releases did.

`--real-length-rate` (after CHECKOUT) adds a third shim, an experiment and not one of the
documented ones: main.py sets the step's learning rate to lr x drawn / bptt before `get_batch`
cuts the epoch's last window at the end of the data; the shim scales that step's rate by
real / drawn, so every window trains at lr x real / bptt as tflm's do
(`tflm.LanguageModel.window_scale`). `reference_curves --reference-rate real` uses it to
show what the cut window alone does to the curves.

`--no-gc-collect` (after CHECKOUT, also with `--real-length-rate`) is a speed experiment,
not one of the documented shims either: zihangdai/mos's `train()` calls `gc.collect()` after
every small batch's backward pass, a full collection of the Python heap per step that does
no arithmetic; the shim makes `gc.collect` return at once, so the figure is the loop's
speed without it (`reference_curves --reference-gc off`). Nothing the model computes
changes.

Whatever the flags, the launcher counts main.py's training windows and target positions (its
`get_batch` calls from `train()`) and prints them at exit with the CUDA allocator's peak
(`torch.cuda.max_memory_allocated`), one line starting `reference_launcher:`; counting
changes nothing main.py computes.

`--initial-model OUT.pt WEIGHTS.npz CONSTRUCTOR.json` (after CHECKOUT) writes instead the file
main.py's `--resume` reads (`[model, criterion, optimizer]`: the checkout's own `RNNModel`,
built with the JSON's arguments, its parameters set from the arrays, named as
`named_parameters()` names them; no criterion, so main.py makes its own; an SGD optimizer,
whose learning rate main.py overwrites and which it replaces before training), so that
main.py starts from given weights: `reference_curves --same-init`.

The process runs from the caller's working folder (main.py writes its corpus cache and
model there), with the checkout first on `sys.path` so its `data`, `model`, `utils`,
`splitcross` and `weight_drop` modules are the ones imported.
"""

import atexit
import functools
import gc
import json
import pathlib
import runpy
import sys

TRAIN_FUNCTION = "train"  # main.py's training loop, in both checkouts


def apply_shims():
    import torch
    import weight_drop  # the checkout's module

    def set_weights(self):
        if self.variational:
            raise NotImplementedError("the launcher's shim covers main.py's WeightDrop "
                                      "(variational=False) only")
        for name in self.weights:
            raw = getattr(self.module, name + "_raw")
            weight = (torch.nn.functional.dropout(raw, p=self.dropout, training=True)
                      if self.training else raw.detach())
            setattr(self.module, name, weight)

    weight_drop.WeightDrop._setweights = set_weights
    torch.load = functools.partial(torch.load, weights_only=False)


def count_and_scale(real_length_rate):
    """Wrap the checkout's `utils.get_batch` (before main.py imports it by name): count the
    windows and target positions `train()` asks for, and with `real_length_rate` scale the
    learning rate main.py just set for a window that `get_batch` cuts by real / drawn.
    Returns the counts (a dict, updated as main.py runs) and the function that prints them
    with the CUDA allocator's peak."""
    import torch
    import utils  # the checkout's module

    counts = {"windows": 0, "targets": 0}
    get_batch = utils.get_batch

    def counted_get_batch(source, i, args, seq_len=None, **kwargs):
        caller = sys._getframe(1)
        if caller.f_code.co_name == TRAIN_FUNCTION:
            drawn = seq_len if seq_len else args.bptt
            real = min(drawn, len(source) - 1 - i)
            counts["windows"] += 1
            counts["targets"] += real * source.size(1)
            if real_length_rate and real < drawn:
                group = caller.f_globals["optimizer"].param_groups[0]
                group["lr"] *= real / drawn  # main.py restores lr2 after the step
        return get_batch(source, i, args, seq_len=seq_len, **kwargs)

    def report():
        peak = (f"{torch.cuda.max_memory_allocated() / 2 ** 20:.1f}"
                if torch.cuda.is_available() else "-")
        print(f"reference_launcher: train windows {counts['windows']}, target positions "
              f"{counts['targets']}, peak CUDA allocator MiB {peak}", flush=True)

    utils.get_batch = counted_get_batch
    return counts, report


def reference_model(weights, constructor):
    """The checkout's `RNNModel(**constructor)` with its parameters set from `weights`
    ({`named_parameters()` name: array}, each of them)."""
    import numpy as np
    import torch
    import model as reference_module  # the checkout's module

    net = reference_module.RNNModel(**constructor)
    params = dict(net.named_parameters())
    if set(params) != set(weights):
        raise SystemExit(f"the arrays name {sorted(weights)}, main.py's model has "
                         f"{sorted(params)}")
    with torch.no_grad():
        for name, value in weights.items():
            if tuple(params[name].shape) != tuple(np.shape(value)):
                raise SystemExit(f"{name} has shape {np.shape(value)}, main.py's model "
                                 f"{tuple(params[name].shape)}")
            params[name].copy_(torch.as_tensor(np.asarray(value, dtype=np.float32)))
    return net


def write_initial_model(out, weights, constructor):
    """main.py's `--resume` file at `out`: `reference_model(weights, constructor)`."""
    import torch

    net = reference_model(weights, constructor)
    with open(out, "wb") as f:
        torch.save([net, None, torch.optim.SGD(net.parameters(), lr=1.0)], f)


def use_checkout(checkout):
    """Make the checkout's modules (`model`, `splitcross`, `weight_drop`, ...) importable in
    this process, first on `sys.path`, with the shims applied. Returns its resolved path."""
    checkout = pathlib.Path(checkout).resolve()
    if not (checkout / "main.py").is_file():
        raise SystemExit(f"{checkout}: not a salesforce/awd-lstm-lm checkout (no main.py)")
    sys.path.insert(0, str(checkout))
    apply_shims()
    return checkout


def main(argv):
    checkout = use_checkout(argv[0])
    if argv[1:2] == ["--initial-model"]:
        import numpy as np
        out, arrays, constructor = argv[2:5]
        with np.load(arrays) as loaded:
            weights = dict(loaded)
        write_initial_model(out, weights, json.loads(pathlib.Path(constructor).read_text()))
        return
    flags, experiments = argv[1:], set()
    while flags[:1] in (["--real-length-rate"], ["--no-gc-collect"]):
        experiments.add(flags.pop(0))
    if "--no-gc-collect" in experiments:
        gc.collect = lambda generation=2: 0  # main.py looks `gc.collect` up at each call
    atexit.register(count_and_scale("--real-length-rate" in experiments)[1])
    sys.argv = [str(checkout / "main.py"), *flags]
    runpy.run_path(str(checkout / "main.py"), run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
