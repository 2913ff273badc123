"""What a preset's reference command sets, and where the preset differs from it.

A reproduction preset records, in its `reference` part, the repository it mirrors and the
exact command lines of that repository's README (`train`, and `finetune` where there is one).
`implied_settings(preset)` reads those command lines the way the reference's `argparse` does
(flags not given take the reference's defaults, listed below from its `main.py`; an unambiguous
prefix such as `--epoch` means `--epochs`) and says what our preset fields must then be;
`differences(preset)` lists every field where they disagree. The thesis presets have no
published command: their `reference.table` names Parthiban 2020 Table 4.3 and
`implied_settings` uses that table (the lmkit code's defaults fill the rest).

    python -m zoo.presets.reference            # every preset: OK or the differing fields

Defaults as read in the reference code (argparse `default=` of main.py at the commits named):
salesforce/awd-lstm-lm 1d466ec, zihangdai/mos 9c0c608, nttcslab-nlp/doc_lm bd0d76f,
ChengyueGongR/Frequency-Agnostic cfb024a (`mos-lm/main.py`),
quettabit/awd-lstm-lmkit 6510d06 (`utils/cli_parser.py`, `base_models/args/dai.py`,
`top_models/*/args`). All three AWD-LSTM-family scripts validate at batch 10 and test at
batch 1 (`eval_batch_size = 10`, `test_batch_size = 1`), scale the learning rate by
seq_len / bptt, clip, and switch to `torch.optim.ASGD(t0=0, lambd=0)` on the non-monotonic
rule; MoS and DOC cap the window at bptt + max_seq_len_delta, salesforce does not cap it.
Only salesforce's main.py has `--optimizer` (sgd: SGD, then ASGD on the non-monotonic rule;
adam: Adam, never averaged) and `--when` (nargs="+", default [-1] = never: the learning rate
divided by 10 after each listed epoch; our `training.when`, `tflm.step_decay`).

The Zhang 2018 presets (`zaremba_*`, `model.kind` "zaremba") mirror TensorFlow's PTB tutorial
(tensorflow/models tutorials/rnn/ptb/ptb_word_lm.py, `--model=small|medium|large`: its
SmallConfig / MediumConfig / LargeConfig, = the thesis' Table A.1) with the thesis' changes
in `reference.changes` (tutorial config names, plus `num_components` K for MoS,
`tie_weights`, `output_bias`, `output_rank`); `--model=zhang_random_search` names the
thesis' Table A.2 result, the base of its BM / BMLG models (not a tutorial config).

The Mogrifier presets (`mogrifier_*`, `model.kind` "mogrifier") mirror a tuned deepmind/lamb
configuration (`experiment/mogrifier/config/<study>/trial_<n>/config`, run by
`experiment/mogrifier/train_<corpus>.sh`): `reference.config` copies the entries of that
file our model and training read, and `lamb_settings` derives what lamb derives from them,
as lamb/lamb_flags.py does: the hidden size is the largest whose parameter count fits
`num_params` (`lamb_hidden_size`, with `lamb_parameter_count` transcribing the model lamb
builds: tied embedding + softmax bias, the LSTMs' W, U and per-gate biases, the mogrifier
matrices or factors with their biases, MoS' projection with bias and its prior without),
the embedding `round(input_embedding_ratio * hidden)`, the epochs that hold `turns *
steps_per_turn` optimization steps, and lamb's evaluation batch size min(batch_size,
lines // min_non_episodic_eval_examples_per_stripe) (`reference.valid_lines`, `test_lines`).
"""

import argparse
import shlex

from zoo.errors import ConfigError
from zoo.presets import list_presets, load_preset

_AWD = {"emsize": 400, "nhid": 1150, "nlayers": 3, "lr": 30.0, "clip": 0.25, "epochs": 8000,
        "batch_size": 80, "bptt": 70, "dropout": 0.4, "dropouth": 0.3, "dropouti": 0.65,
        "dropoute": 0.1, "wdrop": 0.5, "seed": 1111, "nonmono": 5, "alpha": 2.0, "beta": 1.0,
        "wdecay": 1.2e-6}
# salesforce main.py only (the other references have neither flag).
_SALESFORCE = dict(_AWD, optimizer="sgd", when=[-1])
_MOS = dict(_AWD, batch_size=20, nhidlast=-1, dropoutl=-0.2, n_experts=10,
            max_seq_len_delta=40)
_DOC = dict(_MOS, var=0.0, num4embed=0, num4first=0, num4second=0)
# ChengyueGongR/advsoft d401637 mos-awd-lstm-lm/main.py: MoS' flags plus the switch epoch to
# ASGD (its only trigger), AdvSoft's epsilon and the embedding noise. Its README's AWD-LSTM
# commands name an `awd-lstm-lm` folder the repository does not contain: for those, the
# salesforce defaults with the same three flags (stated in those presets).
_ADVSOFT = {"switch": 180, "epsilon": 0.005, "gaussian": 0.15}
# ChengyueGongR/Frequency-Agnostic cfb024a mos-lm/main.py (FRAGE on MoS): MoS' flags, the
# switch epoch to ASGD (its only trigger), the embedding noise, and FRAGE's: --moment
# (store_true) with --moment_split / --moment_lambda. --adv is store_false (giving it turns
# the discriminator off) and main.py sets args.adv = False before training in any case, so
# the --adv_* flags change nothing; --epsilon reaches the model, whose forward does not read
# it. Booleans are store_true / store_false flags (`parse_command`).
_FRAGE_MOS = {"switch": 200, "epsilon": 0.005, "gaussian": 0.0, "moment": False,
              "moment_split": 2000, "moment_lambda": 0.01, "adv": True, "adv_bias": 1000,
              "adv_lambda": 0.02, "adv_lr": 0.01, "adv_wdecay": 1.2e-6,
              "mmd_kernel_alpha": 0.5, "mmd_lambda": 0.1, "continue_train": False}

REFERENCE_DEFAULTS = {
    "salesforce/awd-lstm-lm": _SALESFORCE,
    "zihangdai/mos": _MOS,
    "nttcslab-nlp/doc_lm": _DOC,
    "ChengyueGongR/advsoft": dict(_MOS, **_ADVSOFT),
    "ChengyueGongR/advsoft:awd-lstm-lm": dict(_SALESFORCE, **_ADVSOFT),
    "ChengyueGongR/Frequency-Agnostic": dict(_MOS, **_FRAGE_MOS),
}

# Flags that change nothing our presets describe: paths, devices, logging, and MoS' gradient
# accumulation over small batches (the same update, less memory).
_IGNORED = {"data", "save", "single_gpu", "cuda", "log-interval", "small_batch_size"}

# Parthiban 2020 thesis Table 4.3 (the fair-comparison protocol of quettabit/awd-lstm-lmkit);
# the rest as in §4.3.2: dropconnect 0.5, embedding dropout 0.1, L2 1.2e-6, AR 2, TAR 1,
# output dropout 0.4, 1,000 epochs, ET-ASGD at epoch 200, MoS/MoC latent dropout 0.29 and
# K = 15, PLIF K = 1e5 on [-20, 20] with its own learning rate 0.02.
THESIS_TABLE_4_3 = {
    ("softmax", "ptb"): {"dropouti": 0.4, "dropouth": 0.3, "lr": 20.0, "batch_size": 20,
                         "seed": 141, "emsize": 400, "nhid": 1150, "nhidlast": 400},
    ("softmax", "wikitext-2"): {"dropouti": 0.65, "dropouth": 0.2, "lr": 30.0,
                                "batch_size": 80, "seed": 1881, "emsize": 400, "nhid": 1150,
                                "nhidlast": 400},
    ("mos", "ptb"): {"dropouti": 0.4, "dropouth": 0.225, "lr": 20.0, "batch_size": 12,
                     "seed": 28, "emsize": 280, "nhid": 960, "nhidlast": 620},
    ("mos", "wikitext-2"): {"dropouti": 0.55, "dropouth": 0.2, "lr": 15.0, "batch_size": 15,
                            "seed": 1881, "emsize": 300, "nhid": 1150, "nhidlast": 650},
}
_THESIS_COMMON = dict(_AWD, epochs=1000, dropoutl=0.29, n_experts=15, switch_epoch=200,
                      max_seq_len_delta=40)  # lmkit's cli_parser default, applied to every model


# ptb_word_lm.py's configs (and Zhang 2018 Table A.2's random-search result): init_scale,
# learning_rate, max_grad_norm, num_layers, num_steps, hidden_size, max_epoch,
# max_max_epoch, keep_prob, lr_decay, batch_size.
_TUTORIAL_KEYS = ("init_scale", "learning_rate", "max_grad_norm", "num_layers", "num_steps",
                  "hidden_size", "max_epoch", "max_max_epoch", "keep_prob", "lr_decay",
                  "batch_size")
TUTORIAL_CONFIGS = {
    "small": dict(zip(_TUTORIAL_KEYS, (0.1, 1.0, 5.0, 2, 20, 200, 4, 13, 1.0, 0.5, 20))),
    "medium": dict(zip(_TUTORIAL_KEYS, (0.05, 1.0, 5.0, 2, 35, 650, 6, 39, 0.5, 0.8, 20))),
    "large": dict(zip(_TUTORIAL_KEYS, (0.04, 1.0, 10.0, 2, 35, 1500, 14, 55, 0.35, 1 / 1.15,
                                       20))),
    "zhang_random_search": dict(zip(_TUTORIAL_KEYS, (0.02, 1.0, 7.2919, 3, 40, 900, 51, 100,
                                                     0.4411, 0.8, 28)), num_components=14),
}


def _tutorial_settings(preset):
    """What ptb_word_lm.py `--model=NAME` (+ the thesis' `reference.changes`) sets."""
    ref = preset["reference"]
    words = dict(w[2:].split("=", 1) for w in shlex.split(ref["train"]) if w.startswith("--")
                 and "=" in w)
    name = words.get("model", "small")
    if name not in TUTORIAL_CONFIGS:
        raise ConfigError(f"reference command: --model={name}; known: "
                          f"{', '.join(TUTORIAL_CONFIGS)}")
    flags = dict(TUTORIAL_CONFIGS[name])
    flags.update(ref.get("changes", {}))
    k = int(flags.get("num_components", 0))
    out = {"model.kind": "zaremba", "model.hidden_dim": flags["hidden_size"],
           "model.num_layers": flags["num_layers"], "model.dropout": 1.0 - flags["keep_prob"],
           "model.init_scale": flags["init_scale"],
           "model.tie_weights": bool(flags.get("tie_weights", False)),
           "model.head.type": "mos" if k else "softmax",
           "model.head.output_rank": flags.get("output_rank"),
           "training.optimizer": "sgd", "training.lr": flags["learning_rate"],
           "training.clip_norm": flags["max_grad_norm"],
           "training.batch_size": flags["batch_size"], "training.bptt": flags["num_steps"],
           "training.epochs": flags["max_max_epoch"],
           "training.decay_after": flags["max_epoch"], "training.lr_decay": flags["lr_decay"],
           # the tutorial validates with the training config, tests at batch 1
           "training.eval_batch_size": flags["batch_size"], "training.test_batch_size": 1,
           "training.loss_reduction": "sum_over_time", "training.fixed_windows": True}
    if flags.get("tie_weights"):
        out["model.output_bias"] = bool(flags.get("output_bias", True))
    if k:
        out.update({"model.head.num_experts": k, "model.head.prior_bias": True})
    return out


def lamb_parameter_count(config, hidden, vocab_size):
    """The trainable parameters of the model deepmind/lamb builds for `config` (a lamb
    config's entries) with `hidden` units per layer and `vocab_size` words: what lamb's
    num_params budget counts (tied embeddings, word-level LSTM, lamb/lm.py and
    lamb/cell.py; untied output, output projections and RHN / NAS cells are not
    transcribed)."""
    if not config["share_input_and_output_embeddings"]:
        raise ConfigError("lamb_parameter_count: only tied embeddings are transcribed")
    embed = max(1, int(round(config["input_embedding_ratio"] * hidden)))
    rounds, rank = config["feature_mask_rounds"], config["feature_mask_rank"]
    k = config["mos_num_components"]
    if not k and embed != hidden:
        raise ConfigError("lamb_parameter_count: the softmax' down-projection is not "
                          "transcribed")
    total = vocab_size * embed + vocab_size  # embedding (= softmax weights) + softmax bias
    for layer in range(config["num_layers"]):
        inputs = embed if layer == 0 else hidden
        total += 4 * hidden * (inputs + hidden) + 4 * hidden  # W_x, W_h, B per gate
        for j in range(rounds):  # round j gates x (inputs) when even, h when odd
            out = inputs if j % 2 == 0 else hidden
            rows = hidden if j % 2 == 0 else inputs
            total += (rank * (rows + out) if rank else rows * out) + out  # + its bias
    if k:  # utils.mixture_of_softmaxes: projection (with bias) to k x embed, prior (none)
        total += hidden * k * embed + k * embed + hidden * k
    return total


def lamb_hidden_size(config, vocab_size):
    """The largest hidden size whose `lamb_parameter_count` is at most `num_params`
    (lamb_flags._budget_hidden_size; the count grows with the size, so a plain search)."""
    budget = config["num_params"]
    low, high = 1, 2
    while lamb_parameter_count(config, high, vocab_size) <= budget:
        low, high = high, 2 * high
    while high - low > 1:
        middle = (low + high) // 2
        if lamb_parameter_count(config, middle, vocab_size) <= budget:
            low = middle
        else:
            high = middle
    return low


def lamb_settings(preset):
    """{dotted preset field: value} that the preset's deepmind/lamb config implies."""
    ref = preset["reference"]
    c = ref["config"]
    for key, wanted in (("model", "lstm"), ("tie_forget_and_input_gates", False),
                        ("update_dropout", 0.0), ("token_dropout", 0.0),
                        ("embedding_dropout", 0.0), ("activation_norm_penalty", 0.0),
                        ("num_training_samples", 1), ("eval_method", "deterministic"),
                        ("rmsprop_beta2", 0.999), ("rmsprop_epsilon", 1e-8),
                        ("cell_init_factor", 1.0), ("embedding_init_factor", 1.0)):
        if c.get(key, wanted) != wanted:
            raise ConfigError(f"lamb config {key}={c[key]!r}: only {wanted!r} is built")
    if c["optimizer_type"] not in ("rmsprop", "adam"):
        raise ConfigError(f"lamb config optimizer_type={c['optimizer_type']!r}: rmsprop "
                          "(Adam with beta1 = 0) or adam")
    # lamb's vocabulary: the corpus' words (ours count <eos>), its own <UNK> and eos
    vocab = preset["corpus"]["vocab_size"] + 1
    hidden = lamb_hidden_size(c, vocab)
    k = c["mos_num_components"]
    downprojected = c["downprojected_output_dropout"]
    batch, bptt = c["batch_size"], c["max_time_steps"]
    windows = -(-(ref["train_tokens"] // batch - 1) // bptt)  # fixed windows of one pass
    per_stripe = c["min_non_episodic_eval_examples_per_stripe"]
    out = {"model.kind": "mogrifier", "model.hidden_dim": hidden,
           "model.embed_dim": max(1, int(round(c["input_embedding_ratio"] * hidden))),
           "model.num_layers": c["num_layers"], "model.rounds": c["feature_mask_rounds"],
           "model.rank": c["feature_mask_rank"],  # 0: full matrices, in both
           "model.input_dropout": c["input_dropout"],
           "model.inter_layer_dropout": (c["input_dropout"] if c["inter_layer_dropout"] < 0
                                         else c["inter_layer_dropout"]),
           "model.state_dropout": c["state_dropout"],
           "model.output_dropout": c["output_dropout"],
           "model.shared_mask_dropout": c["shared_mask_dropout"],
           "model.skip_connections": c["lstm_skip_connection"],
           "model.cap_input_gate": c["cap_input_gate"], "model.forget_bias": c["forget_bias"],
           "model.tie_weights": c["share_input_and_output_embeddings"],
           "model.init": "lamb", "model.head.type": "mos" if k else "softmax",
           "training.optimizer": "adam",
           "training.adam_beta_1": (0.0 if c["optimizer_type"] == "rmsprop"
                                    else c["adam_beta1"]),
           "training.lr": c["learning_rate"], "training.weight_decay": c["l2_penalty"],
           "training.clip_norm": c["max_grad_norm"], "training.batch_size": batch,
           "training.bptt": bptt, "training.seed": c["seed"],
           "training.loss_reduction": "sum_over_time", "training.fixed_windows": True,
           "training.epochs": round(c["turns"] * c["steps_per_turn"] / windows),
           "training.eval_batch_size": max(1, min(batch, ref["valid_lines"] // per_stripe)),
           "training.test_batch_size": max(1, min(batch, ref["test_lines"] // per_stripe))}
    if k:
        out.update({"model.head.num_experts": k,
                    "model.head.latent_dropout": (c["output_dropout"] if downprojected < 0
                                                  else downprojected)})
    return out


def parse_command(command, defaults):
    """The flag values of `command` (a `python main.py --flag value ...` line) over
    `defaults`, as argparse reads them (unique prefixes allowed; a flag whose default is a
    list takes every value up to the next flag, as `nargs="+"`). Unknown flags raise."""
    words = shlex.split(command)
    values = dict(defaults)
    names = list(defaults) + sorted(_IGNORED)
    i = next((j for j, w in enumerate(words) if w.startswith("--")), len(words))
    while i < len(words):
        word = words[i]
        if not word.startswith("--"):
            raise ConfigError(f"reference command: unexpected {word!r} in {command!r}")
        flag = word[2:]
        matches = [n for n in names if n == flag] or [n for n in names if n.startswith(flag)]
        if len(matches) != 1:
            raise ConfigError(f"reference command: unknown or ambiguous flag --{flag} in "
                              f"{command!r}")
        name = matches[0]
        takes_value = i + 1 < len(words) and not words[i + 1].startswith("--")
        if name in _IGNORED:
            i += 2 if takes_value else 1
            continue
        if isinstance(defaults[name], bool):  # store_true / store_false: the other value
            values[name] = not defaults[name]
            i += 1
            continue
        if isinstance(defaults[name], list):  # nargs="+": --when 300 400
            end = next((j for j in range(i + 1, len(words)) if words[j].startswith("--")),
                       len(words))
            if end == i + 1:
                raise ConfigError(f"reference command: --{flag} needs values in {command!r}")
            kind = type(defaults[name][0])
            values[name] = [kind(w) for w in words[i + 1:end]]
            i = end
            continue
        values[name] = type(defaults[name])(words[i + 1])
        i += 2
    return values


def _model_and_training(flags, capped):
    last = flags.get("nhidlast", -1)
    latent = flags.get("dropoutl", -1)
    model = {"embed_dim": flags["emsize"], "hidden_dim": flags["nhid"],
             "num_layers": flags["nlayers"], "last_dim": flags["emsize"] if last < 0 else last,
             "tie_weights": True, "dropout": flags["dropout"], "dropout_h": flags["dropouth"],
             "dropout_i": flags["dropouti"], "dropout_e": flags["dropoute"],
             "weight_dropout": flags["wdrop"], "alpha": flags["alpha"], "beta": flags["beta"],
             # torch.nn.LSTM / nn.Linear: two trained LSTM biases, PyTorch's initialisation
             "init": "pytorch", "lstm_biases": 2}
    optimizer = flags.get("optimizer", "sgd")
    if optimizer not in ("sgd", "adam"):
        raise ConfigError(f"reference command: --optimizer {optimizer!r} (sgd or adam)")
    training = {"lr": flags["lr"], "clip_norm": flags["clip"], "epochs": flags["epochs"],
                "batch_size": flags["batch_size"], "bptt": flags["bptt"], "seed": flags["seed"],
                "weight_decay": flags["wdecay"], "eval_batch_size": 10, "test_batch_size": 1,
                # the reference's sgd is SGD that switches to ASGD: our asgd with a trigger
                "optimizer": "asgd" if optimizer == "sgd" else "adam",
                # `if epoch in args.when`: epochs < 1 never occur (the default [-1])
                "when": sorted({e for e in flags.get("when", [-1]) if e >= 1}),
                "max_seq_len": flags["bptt"] + flags["max_seq_len_delta"] if capped else None}
    return model, training, latent if latent >= 0 else flags["dropouth"]


def _head_family(preset):
    """(the head type the reference's flags describe, the preset field holding its options):
    a flow on a base head (`cnf`, Andonov 2019 Tables 7.5 / 7.6) trains with its base's
    command, whose MoS / DOC flags describe `model.head.base`."""
    spec = preset["model"].get("head", {})
    if spec.get("type") == "cnf":
        base = spec.get("base", "softmax")
        return (base if isinstance(base, str) else base.get("type", "softmax"),
                "model.head.base")
    return spec.get("type", "softmax"), "model.head"


def implied_settings(preset):
    """{dotted preset field: value} that the preset's reference sets; {} without one."""
    ref = preset.get("reference")
    if not ref:
        return {}
    if "table" in ref:
        return _thesis_settings(preset)
    if ref.get("code") == "tensorflow/models":
        return _tutorial_settings(preset)
    if ref.get("code") == "deepmind/lamb":
        return lamb_settings(preset)
    code = ref["code"]
    if code not in REFERENCE_DEFAULTS:
        raise ConfigError(f"reference.code {code!r}: no defaults recorded for it; known: "
                          f"{', '.join(REFERENCE_DEFAULTS)}")
    defaults = REFERENCE_DEFAULTS[code]
    flags = parse_command(ref["train"], defaults)
    capped = code not in ("salesforce/awd-lstm-lm", "ChengyueGongR/advsoft:awd-lstm-lm")
    model, training, latent = _model_and_training(flags, capped=capped)
    if training["optimizer"] == "asgd":  # Adam never switches (main.py: `args.optimizer == 'sgd'`)
        training.update(switch="nonmono", nonmono=flags["nonmono"])
    head, prefix = _head_family(preset)
    out = {f"model.{k}": v for k, v in model.items()}
    out.update({f"training.{k}": v for k, v in training.items()})
    if code.startswith("ChengyueGongR/advsoft"):  # ASGD from epoch --switch, AdvSoft, noise
        out.update({"training.switch": "epoch", "training.switch_epoch": flags["switch"],
                    "model.head.adversarial_alpha": flags["epsilon"],
                    "model.embedding_noise": flags["gaussian"]})
    if code == "ChengyueGongR/Frequency-Agnostic":  # ASGD from epoch --switch, noise, FRAGE
        out.update({"training.switch": "epoch", "training.switch_epoch": flags["switch"],
                    "model.embedding_noise": flags["gaussian"],
                    "model.frage": ({"method": "moments", "popular": flags["moment_split"],
                                     "coefficient": flags["moment_lambda"]}
                                    if flags["moment"] else None)})
    if head in ("mos", "moc"):
        out.update({f"{prefix}.num_experts": flags["n_experts"],
                    f"{prefix}.latent_dropout": latent})
    if head == "doc":
        if flags["num4embed"]:
            raise ConfigError("DOC components from the embedding (--num4embed) are not built")
        out.update({f"{prefix}.num_components_per_layer":
                    [flags["num4first"], flags["num4second"], flags["n_experts"]],
                    f"{prefix}.latent_dropout": latent,
                    f"{prefix}.cv_regularization": flags["var"]})
    if "evaluate" in ref:  # DOC's published figures: cal_ppl.py, batch 1 for both splits
        bptt = parse_command(ref["evaluate"], {"bptt": 5000})["bptt"]
        out.update({"training.final_evaluation": {"valid_batch_size": 1, "test_batch_size": 1,
                                                  "bptt": bptt}})
    if "past_decode" in ref:  # lambda_PDR: a regularizer on top of the cited command
        out["model.past_decode"] = ref["past_decode"]
    if "finetune" in ref:
        tune = parse_command(ref["finetune"], defaults)
        out.update({"finetune.lr": tune["lr"], "finetune.epochs": tune["epochs"],
                    "finetune.nonmono": tune["nonmono"]})
    return out


def _thesis_settings(preset):
    head = preset["model"].get("head", {}).get("type", "softmax")
    corpus = preset.get("corpus", {}).get("name")
    family = "mos" if head in ("mos", "moc") else "softmax"
    if (family, corpus) not in THESIS_TABLE_4_3:
        raise ConfigError(f"thesis Table 4.3 has no column for {head} on {corpus}")
    flags = dict(_THESIS_COMMON, **THESIS_TABLE_4_3[(family, corpus)])
    # The appendix ablation (Tables A.1-A.3) changes the trigger, AdvSoft, the embedding
    # noise and (WikiText-2) dropouti of this protocol: `reference.ablation` names them.
    ablation = preset["reference"].get("ablation", {})
    flags.update({k: v for k, v in ablation.items() if k in flags})
    model, training, _ = _model_and_training(flags, capped=True)  # lmkit always caps
    if ablation.get("switch", "epoch") == "epoch":
        training.update(switch="epoch", switch_epoch=flags["switch_epoch"])
    else:
        training.update(switch="nonmono", nonmono=flags["nonmono"])
    out = {f"model.{k}": v for k, v in model.items()}
    out.update({f"training.{k}": v for k, v in training.items()})
    if "adversarial_alpha" in ablation:
        out["model.head.adversarial_alpha"] = ablation["adversarial_alpha"]
    if "embedding_noise" in ablation:
        out["model.embedding_noise"] = ablation["embedding_noise"]
    if family == "mos":
        out.update({"model.head.num_experts": flags["n_experts"],
                    "model.head.latent_dropout": flags["dropoutl"]})
    if head == "plif":  # top_models/smax/args/plif_smax.py: --plif_smax_k, _t, _w_variance, _lr
        out.update({"model.head.num_intervals": 100_000, "model.head.bound": 20.0,
                    "model.head.init_scale": 1.0,  # used as the standard deviation
                    "training.learning_rate_multipliers.plif": 0.02 / flags["lr"]})
    return out


def preset_value(preset, dotted):
    """The value of a dotted field as the preset trains with it (derived fields resolved:
    `model.last_dim` defaults to the embedding size, `finetune.*` is the training value
    after `finetune_overrides`)."""
    training = preset.get("training", {})
    if dotted.startswith("finetune."):
        key = dotted.split(".", 1)[1]
        return training.get("finetune_overrides", {}).get(key, training.get(key))
    if dotted == "model.last_dim":
        return preset["model"].get("last_dim", preset["model"]["embed_dim"])
    if dotted == "training.when":  # absent or null: no division
        return training.get("when") or []
    node = preset
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def differences(preset):
    """[(field, preset value, reference value)] where the preset departs from its reference."""
    out = []
    for field, expected in implied_settings(preset).items():
        actual = preset_value(preset, field)
        same = (actual == expected if not isinstance(expected, float) or actual is None
                else abs(float(actual) - expected) <= 1e-12 * max(1.0, abs(expected)))
        if not same:
            out.append((field, actual, expected))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("presets", nargs="*", help="preset names (default: all)")
    names = parser.parse_args(argv).presets or list_presets()
    bad = 0
    for name in names:
        preset = load_preset(name)
        if not preset.get("reference"):
            print(f"{name}: no reference")
            continue
        diffs = differences(preset)
        bad += bool(diffs)
        print(f"{name}: " + ("matches its reference" if not diffs else "; ".join(
            f"{f} is {a!r}, reference {e!r}" for f, a, e in diffs)))
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
