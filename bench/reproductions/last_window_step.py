"""main.py's last window of an epoch, measured: the validation perplexity after the step
salesforce/awd-lstm-lm's `main.py` takes there, against the step tflm takes.

    python -m bench.reproductions.last_window_step --reference CHECKOUT --run RUN_DIR \\
        [--remainders 3 10 30] [--masks 8]

main.py draws each window's length, sets the learning rate to lr x drawn / bptt, and cuts
the window at the end of the data (`get_batch`: min(seq_len, len - 1 - i)). The last window
of every epoch so trains on its few remaining positions at about the full rate, and the
epoch's validation follows at once. tflm scales every window by its real length
(`tflm.LanguageModel.window_scale`), the last one included.

From the weights of RUN_DIR (a `zoo.train` run of an AWD-LSTM softmax preset on a folder
of text, e.g. one of `reference_curves`' tflm-SEED runs), this takes main.py's training
step (its own model and criterion; the lines of its loop: AR, TAR, clipping, SGD with
weight decay) on the last r positions of the training streams, with the state the
preceding window leaves, at both rates and with `--masks` dropout draws each, and then runs
main.py's `evaluate()` on the validation text. Writes results/last_window_step.md.
"""

import argparse
import copy
import json
import pathlib
import sys

import numpy as np

from bench.harness import publish, results_path
from bench.reproductions.reference_curves import reference_constructor, salesforce_arrays
from bench.reproductions.reference_launcher import reference_model, use_checkout


def last_window(num_rows, remainder):
    """(start, stop) rows of the inputs of an epoch's last window of `remainder` positions
    in a (rows, streams) training matrix (targets: one row later)."""
    if not 1 <= remainder < num_rows - 1:
        raise ValueError(f"remainder must be in [1, {num_rows - 2}]; got {remainder}")
    return num_rows - 1 - remainder, num_rows - 1


def summary(before, after, bptt):
    """The markdown table: per remainder r, the validation perplexity after main.py's step
    (rate x bptt / bptt: the drawn length, taken as bptt) and after tflm's (x r / bptt),
    mean and range over the dropout draws. `after`: {(r, "main.py" | "tflm"): [ppl, ...]}."""
    lines = [f"Validation perplexity before the step: {before:.1f}.", "",
             "| positions left (r) | rate | mean | min | max | change of the mean |",
             "| --- | --- | --- | --- | --- | --- |"]
    for r in sorted({r for r, _ in after}):
        for rule, rate in (("main.py", f"lr x {bptt} / {bptt} (drawn)"),
                           ("tflm", f"lr x {r} / {bptt} (real)")):
            values = after[r, rule]
            lines.append(f"| {r} | {rule}: {rate} | {np.mean(values):.1f} | {min(values):.1f} "
                         f"| {max(values):.1f} | {100 * (np.mean(values) / before - 1):+.1f} % |")
    return "\n".join(lines) + "\n"


def _ids(folder, split, vocabulary):
    index = {w: i for i, w in enumerate(vocabulary)}
    text = (folder / f"{split}.txt").read_text(encoding="utf-8").splitlines()
    return np.array([index[w] for line in text for w in [*line.split(), "<eos>"]])


def measure(checkout, run, remainders, masks):
    use_checkout(checkout)
    import torch  # deferred: after the checkout's shims
    from splitcross import SplitCrossEntropyLoss  # deferred: the checkout's module

    from zoo.models.saving import load_model  # deferred: Keras after the arguments

    config = json.loads((run / "config.json").read_text())
    model, training = config["model"], config["training"]
    text = pathlib.Path(config["corpus"]["name"])
    vocabulary = (text / "vocab.txt").read_text(encoding="utf-8").split("\n")[:-1]
    base = reference_model(salesforce_arrays(load_model(run / "final.keras")),
                           reference_constructor(config, len(vocabulary)))
    criterion = SplitCrossEntropyLoss(int(model["embed_dim"]), splits=[], verbose=False)
    batch, bptt, lr = int(training["batch_size"]), int(training["bptt"]), float(training["lr"])

    def matrix(ids, streams):  # main.py's batchify: (rows, streams)
        rows = len(ids) // streams
        return torch.as_tensor(ids[:rows * streams].reshape(streams, rows).T.copy())

    train = matrix(_ids(text, "train", vocabulary), batch)
    valid = matrix(_ids(text, "valid", vocabulary), 10)

    def evaluate(net):  # main.py's evaluate(): batch 10, windows of bptt, / len(data)
        net.eval()
        hidden, total = net.init_hidden(10), 0.0
        with torch.no_grad():
            for i in range(0, valid.size(0) - 1, bptt):
                n = min(bptt, valid.size(0) - 1 - i)
                output, hidden = net(valid[i:i + n], hidden)
                total += n * float(criterion(net.decoder.weight, net.decoder.bias, output,
                                             valid[i + 1:i + 1 + n].reshape(-1)))
        return float(np.exp(total / len(valid)))

    before, after = evaluate(base), {}
    for r in remainders:
        start, stop = last_window(train.size(0), r)
        base.eval()
        with torch.no_grad():  # the state the window before leaves
            _, hidden = base(train[start - bptt:start], base.init_hidden(batch))
        for rule, scale in (("main.py", 1.0), ("tflm", r / bptt)):
            after[r, rule] = []
            for draw in range(masks):
                torch.manual_seed(draw)
                net = copy.deepcopy(base)
                net.train()
                params = list(net.parameters()) + list(criterion.parameters())
                optimizer = torch.optim.SGD(params, lr=lr * scale,
                                            weight_decay=float(training["weight_decay"]))
                output, _, raw, dropped = net(train[start:stop], hidden, return_h=True)
                loss = (criterion(net.decoder.weight, net.decoder.bias, output,
                                  train[start + 1:stop + 1].reshape(-1))
                        + float(model["alpha"]) * dropped[-1].pow(2).mean()
                        + float(model["beta"]) * (raw[-1][1:] - raw[-1][:-1]).pow(2).mean())
                optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, float(training["clip_norm"]))
                optimizer.step()
                after[r, rule].append(evaluate(net))
            print(f"r={r} {rule}: {np.round(after[r, rule], 1)}", flush=True)
    return before, after, bptt


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reference", required=True, type=pathlib.Path,
                   help="a salesforce/awd-lstm-lm checkout")
    p.add_argument("--run", required=True, type=pathlib.Path,
                   help="a zoo.train run of an AWD-LSTM softmax preset on a text folder")
    p.add_argument("--remainders", type=int, nargs="+", default=[3, 10, 30])
    p.add_argument("--masks", type=int, default=8)
    p.add_argument("--results", default=str(results_path(__file__, "last_window_step.md")))
    args = p.parse_args(argv)
    if not (args.reference / "main.py").is_file():
        p.error(f"--reference {args.reference}: no main.py there")
    if not (args.run / "final.keras").is_file():
        p.error(f"--run {args.run}: no final.keras there; give a finished zoo.train run")
    before, after, bptt = measure(args.reference, args.run, args.remainders,
                                  args.masks)
    publish("main.py's last window of an epoch: validation after its step",
            f"Weights: {args.run}/final.keras; {args.masks} dropout draws per cell.\n\n"
            + summary(before, after, bptt), args.results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
