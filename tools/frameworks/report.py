"""The comparison's report: the arithmetic floor, agreement, the table, markdown, a figure.

- **Floor.** FLOPs per token from the layer sizes (matmul parameters P touched per token:
  4n(in + n) per LSTM layer, V d for a tied softmax, d K L + d K + K V L for MoS), training
  = 6 P, evaluation = 2 P; floor words/s = the device's measured GEMM rate (float32 n^3 GEMM
  in each worker: NumPy on a CPU, torch on a GPU) / FLOPs per token.
- **Agreement.** Parameter counts, and the first step's loss on every backend (with every
  dropout off all backends compute the same function, so it must agree to float
  tolerance).
"""

import math
import pathlib

from zoo.runs import atomic_files
from zoo.runs.settings import TrainingSettings


def _head_spec(model_cfg):
    head = model_cfg.get("head", "softmax")
    if isinstance(head, str):
        return head.lower(), {}
    head = dict(head)
    return str(head.pop("type", "softmax")).lower(), head


def flops_per_token(config, vocab_size):
    """Matmul parameters touched per token and the FLOPs of a training / evaluation token.

    P = sum over LSTM layers 4 n (in + n) + head, head = V d (tied softmax), d K L + d K +
    K V L (MoS, MoC without the K V L), with d the last layer's size and L the embedding size
    (tied). Forward = 2 P FLOPs per token, training (forward + backward) = 6 P.
    """
    m = config["model"]
    zaremba = m.get("kind") == "zaremba"  # embedding = hidden size, untied by default
    embed, hidden = int(m.get("embed_dim", 400)), int(m.get("hidden_dim", 1150))
    if zaremba:
        hidden = int(m.get("hidden_dim", 200))
        embed = hidden
    layers = int(m.get("num_layers", 2 if zaremba else 3))
    tied = bool(m.get("tie_weights", not zaremba))
    last = int(m.get("last_dim") or (embed if tied else hidden))
    lstm = 0
    for i in range(layers):
        size_in = embed if i == 0 else hidden
        n = last if i == layers - 1 else hidden
        lstm += 4 * n * (size_in + n)
    name, opts = _head_spec(m)
    latent = embed if tied else last
    v = int(vocab_size)
    rank = opts.get("output_rank")  # a factorized decoder: V r + r L instead of V L
    decoder = v * latent if not rank else int(rank) * (v + latent)
    if name in ("mos", "moc"):
        k = int(opts.get("num_experts", 15))
        head = last * k * latent + last * k + (k * decoder if name == "mos" else decoder)
    elif name == "doc":
        head = None
    else:
        head = decoder
    if head is None:
        return {"lstm_params": lstm, "head_params": None, "params_per_token": None,
                "train_flops_per_token": None, "eval_flops_per_token": None,
                "note": f"no FLOP model for head {name!r}"}
    p = lstm + head
    return {"lstm_params": lstm, "head_params": head, "params_per_token": p,
            "train_flops_per_token": 6 * p, "eval_flops_per_token": 2 * p}


def agreement(rows, init=None):
    """Parameter counts and first-step losses across the backends that ran."""
    ok = [r for r in rows if r.get("status") == "ok"]
    params = {r["backend"]: r.get("params") for r in ok}
    if init is not None:
        params = {"init (Keras)": init.get("params"), **params}
    first = {r["backend"]: r.get("first_step_loss") for r in ok
             if r.get("first_step_loss") is not None}
    out = {"params": params, "params_agree": len(set(params.values())) <= 1,
           "first_step_loss": first}
    if first:
        values = list(first.values())
        ref = values[0]
        out["first_step_loss_max_rel_diff"] = max(abs(v - ref) / abs(ref) for v in values)
    return out


def _fmt(value, spec=",.0f", none="-"):
    if value is None:
        return none
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return format(value, spec)


COLUMNS = ("backend", "status", "train words/s", "steady words/s", "end-to-end words/s",
           "eval words/s", "valid ppl", "first-step loss", "params", "peak MiB",
           "LSTM kernel", "cuDNN", "jit", "pad", "traces", "floor train w/s", "of floor",
           "train vs native")


def table_rows(results):
    rows = []
    for r in results["backends"]:
        if r.get("status") != "ok":
            reason = " ".join(str(r.get("reason", "")).split())
            if len(reason) > 160:
                reason = reason[:157] + "..."
            rows.append([r["backend"], f"{r.get('status')}: {reason}"]
                        + [""] * (len(COLUMNS) - 2))
            continue
        traced = r.get("train_traces")
        rows.append([
            r["backend"], "ok", _fmt(r.get("train_words_per_s")),
            _fmt(r.get("train_words_per_s_steady")),
            _fmt(r.get("train_words_per_s_end_to_end")), _fmt(r.get("eval_words_per_s")),
            _fmt(r.get("valid_perplexity_after_steps"), ".3f"),
            _fmt(r.get("first_step_loss"), ".6f"), _fmt(r.get("params"), ","),
            f"{_fmt(r.get('peak_memory_mib'))} ({r.get('memory_kind', '')}"
            + (f"; run +{_fmt(r['peak_rss_added_mib'])}" if r.get("memory_kind") == "peak RSS"
               and r.get("peak_rss_added_mib") is not None else "") + ")",
            r.get("lstm_kernel", "-"), r.get("cudnn", "-"), r.get("jit", "-"), str(r.get("pad_to_multiple", 1)),
            "eager" if traced is None else str(traced),
            _fmt(r.get("floor_train_words_per_s")),
            _fmt(r.get("fraction_of_floor"), ".1%"),
            _fmt(r.get("train_words_per_s_vs_native"), ".2f") + (
                "x" if r.get("train_words_per_s_vs_native") else ""),
        ])
    return rows


def format_table(results):
    """A plain-text table (what the CLI prints)."""
    rows = [list(COLUMNS)] + table_rows(results)
    widths = [max(len(str(row[i])) for row in rows) for i in range(len(COLUMNS))]
    lines = ["  ".join(str(c).ljust(w) for c, w in zip(row, widths)).rstrip() for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _md_table(header, rows):
    out = ["| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    out += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(out)


def markdown(results):
    """The markdown report: command, machine, settings, the table, epochs, agreement."""
    s, m, f = results["settings"], results["machine"], results["flops"]
    init = results["init"]
    model = results["config"]["model"]
    training = TrainingSettings.from_dict(results["config"]["training"])
    versions = {}
    for r in results["backends"]:
        versions.update(r.get("versions") or {})
    lines = [
        f"### compare_frameworks: {results['preset']} ({results['date'][:10]})", "",
        f"`{results['command']}`", "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m.get('memory_gib')} GiB; device "
        f"{s['device']}; load average at start {m.get('load_average_start')}, at end "
        f"{m.get('load_average_end')}.",
        f"Versions: {', '.join(f'{k} {v}' for k, v in sorted(versions.items()))}.",
        f"Model: V={init['vocab_size']:,}, embed {model.get('embed_dim')}, hidden "
        f"{model.get('hidden_dim')} x {model.get('num_layers')} layers, last "
        f"{model.get('last_dim') or model.get('embed_dim')}, head {model.get('head')}; "
        f"batch {training.batch_size}, bptt {training.bptt} "
        f"({s['window_lengths']} lengths), eval batch {training.eval_batch_size}; "
        f"corpus {init.get('corpus')} ({init.get('train_tokens'):,} train tokens); "
        f"precision {s['precision']}; dropout {'off' if s['no_dropout'] else 'on'}; "
        f"CPU threads per framework: {s.get('threads') or 'framework default'}; glibc "
        f"malloc: {s.get('malloc', 'system')}.",
        f"Steps: {s['steps']} (median over steps after {s['warmup']} warm-up steps); "
        f"evaluation over {s['eval_windows'] or 'all'} validation windows.",
    ]
    if f.get("train_flops_per_token"):
        lines.append(
            f"Arithmetic: {f['params_per_token']:,} matmul parameters per token (LSTM "
            f"{f['lstm_params']:,}, head {f['head_params']:,}) = "
            f"{f['train_flops_per_token'] / 1e6:,.1f} MFLOP per training token, "
            f"{f['eval_flops_per_token'] / 1e6:,.1f} MFLOP per evaluation token; floor = "
            "measured float32 GEMM rate / FLOPs per token.")
    rates = {r["backend"]: r.get("matmul_flops") for r in results["backends"]
             if r.get("matmul_flops")}
    if rates:
        lines.append("Measured GEMM rate (GFLOP/s, per worker): " + ", ".join(
            f"{k} {v / 1e9:,.0f}" for k, v in rates.items()) + ".")
    lines += ["", _md_table(COLUMNS, table_rows(results))]
    curves = [r for r in results["backends"] if r.get("epochs")]
    if curves:
        lines += ["", "Epochs (validation perplexity after each epoch; training wall time, "
                  "compiles included, evaluation excluded):", ""]
        header = ["epoch"] + [f"{r['backend']} val ppl (time s)" for r in curves]
        n = max(len(r["epochs"]) for r in curves)
        rows = []
        for i in range(n):
            row = [str(i)]
            for r in curves:
                if i < len(r["epochs"]):
                    e = r["epochs"][i]
                    row.append(f"{e['val_perplexity']:.3f} ({e['train_time_s']:.1f})")
                else:
                    row.append("")
            rows.append(row)
        lines.append(_md_table(header, rows))
    a = results["agreement"]
    lines += ["", f"Parameter counts agree: {'yes' if a['params_agree'] else 'NO'} "
              f"({', '.join(f'{k} {v:,}' for k, v in a['params'].items() if v)})."]
    if a.get("first_step_loss"):
        lines.append("First-step loss: " + ", ".join(
            f"{k} {v:.7f}" for k, v in a["first_step_loss"].items())
            + f" (max relative difference {a['first_step_loss_max_rel_diff']:.2e}).")
        if not s["no_dropout"]:
            lines.append(
                "Dropout is on: every backend draws its masks from its own random stream "
                "(keras.random SeedGenerator: TF stateless Philox, JAX threefry, torch "
                "generator; torch-native: one torch.Generator), so losses and perplexities "
                "agree only statistically. Run with --no-dropout for the exact check.")
    return "\n".join(lines) + "\n"


def plot_curves(results, path):
    """Validation perplexity against training wall time, one line per backend."""
    try:
        import matplotlib  # deferred: only --plot needs it, and it may be missing
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # deferred: as above
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    drawn = 0
    for r in results["backends"]:
        if r.get("epochs"):
            ax.plot([e["train_time_s"] for e in r["epochs"]],
                    [e["val_perplexity"] for e in r["epochs"]], marker="o", label=r["backend"])
            drawn += 1
    if not drawn:
        plt.close(fig)
        return None
    ax.set_xlabel("training wall time (s)")
    ax.set_ylabel("validation perplexity")
    ax.set_yscale("log")
    ax.set_title(f"{results['preset']} ({results['settings']['device']})")
    ax.legend()
    fig.tight_layout()
    with atomic_files.replacing(path) as tmp:
        fig.savefig(tmp, dpi=120, format=pathlib.Path(path).suffix.lstrip(".") or "png")
    plt.close(fig)
    return str(path)
