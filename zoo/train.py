"""`python -m zoo.train`: train a preset, evaluate it, report perplexity, log to TensorBoard.

With no arguments it makes the default synthetic high-rank language, trains the tiny
`synthetic` preset on it (minutes on a laptop CPU) and prints train / valid / test
perplexity next to the language's optimal perplexity.

Writes into `--out` (default `runs/<preset>-<time>`):
  config.json     the fully resolved configuration
  vocab.txt       the vocabulary (one token per line, in id order)
  best.keras      the model with the best validation perplexity so far (averaged weights
                  once averaged SGD has switched)
  final.keras     the model after the last epoch (averaged weights likewise)
  checkpoint/     the last epoch's checkpoint, for --resume
  metrics.json    per-epoch history and the final train/valid/test figures
  logs/           TensorBoard: loss, perplexity, learning rate, averaging, words/s, gradient
                  norm per epoch; embedding projector; top-5 predictions text
"""

import argparse
import json
import os
import pathlib
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


class UserError(Exception):
    """An error the user fixes by changing the command; printed as one line."""


def build_parser():
    from zoo.heads import head_names
    p = argparse.ArgumentParser(prog="python -m zoo.train", description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="synthetic", help="preset name or JSON path")
    p.add_argument("--corpus", help="synthetic, ptb, wikitext-2 or a directory")
    p.add_argument("--data-dir", help="corpus directory (default $TFLM_DATA_DIR or cache)")
    p.add_argument("--head", help=f"output head: {', '.join(head_names())}")
    p.add_argument("--epochs", type=int)
    p.add_argument("--batch-size", type=int, dest="batch_size")
    p.add_argument("--seed", type=int)
    p.add_argument("--out", help="output directory (default runs/<preset>-<time>)")
    p.add_argument("--init-from", help="start from the weights of a saved .keras model")
    p.add_argument("--resume", metavar="RUN_DIR",
                   help="continue a killed run from its last epoch checkpoint")
    p.add_argument("--finetune", metavar="RUN_DIR",
                   help="finetune the averaged best model of RUN_DIR (restart averaging, stop "
                        "on the non-monotonic rule); writes into --out")
    p.add_argument("--strategy", default="default", choices=["default", "mirrored",
                                                             "multi-worker"],
                   help="tf.distribute strategy (TensorFlow backend)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override any preset field, e.g. --set model.dropout=0.3")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def load_data(corpus_cfg, data_dir):
    """(Corpus, optimal perplexity or None) for the configured corpus.

    Named corpora accept `max_train_tokens` / `max_valid_tokens` / `max_test_tokens` to keep
    only the first tokens of a split (shortened reproductions on small machines)."""
    from tflm import data
    cfg = dict(corpus_cfg)
    name = cfg.pop("name", "synthetic")
    if name == "synthetic":
        kind = cfg.pop("kind", "markov")
        makers = {"markov": data.synthetic.markov_language,
                  "mixture": data.synthetic.mixture_markov_language}
        if kind not in makers:
            raise UserError(f"unknown synthetic corpus kind {kind!r}; use markov or mixture.")
        sizes = {k: cfg.pop(k) for k in ("train_tokens", "valid_tokens", "test_tokens")
                 if k in cfg}
        try:
            language = makers[kind](**cfg)
        except TypeError as err:
            raise UserError(f"bad synthetic corpus settings: {err}") from err
        corpus = language.to_corpus(seed=language.seed + 1, **sizes)
        return corpus, float(language.optimal_perplexity)
    limits = {split: cfg.pop(f"max_{split}_tokens", None) for split in ("train", "valid", "test")}
    corpus = data.load_corpus(name, data_dir=data_dir)
    for split, limit in limits.items():
        if limit is not None:  # a shortened run: the first `limit` tokens of the split
            setattr(corpus, split, corpus.split(split)[:int(limit)])
    return corpus, None


def make_optimizer(training):
    """SGD, averaged SGD (NT-/ET-ASGD) or Adam from the preset's `training` part."""
    import keras

    from tflm import optimizers
    name = str(training.get("optimizer", "sgd")).lower()
    lr = float(training.get("lr", 30.0))
    multipliers = training.get("learning_rate_multipliers")
    if name == "sgd":
        return optimizers.SGD(lr, learning_rate_multipliers=multipliers)
    if name == "asgd":
        return optimizers.AveragedSGD(lr, learning_rate_multipliers=multipliers)
    if name == "adam":
        return keras.optimizers.Adam(learning_rate=lr)
    raise UserError(f"unknown optimizer {name!r} in training.optimizer; use sgd, asgd or adam.")


def make_trigger(training, finetune=False):
    """The averaging trigger: `switch` = "nonmono" (NT-ASGD, `nonmono` epochs), "epoch"
    (ET-ASGD at `switch_epoch`) or None; finetuning stops on the non-monotonic rule."""
    from tflm.triggers import EpochTrigger, NonMonotonicTrigger
    if str(training.get("optimizer", "sgd")).lower() != "asgd":
        return None
    if finetune:
        return NonMonotonicTrigger(int(training.get("nonmono", 5)), on_trigger="stop",
                                   verbose=0)
    switch = training.get("switch", "nonmono")
    if switch == "nonmono":
        return NonMonotonicTrigger(int(training.get("nonmono", 5)), verbose=0)
    if switch == "epoch":
        return EpochTrigger(int(training.get("switch_epoch", 200)), verbose=0)
    if switch in (None, "none"):
        return None
    raise UserError(f"unknown training.switch {switch!r}; use nonmono, epoch or none.")


def build_model(config, vocab_size):
    from zoo.awd_lstm import AWDLSTM
    training = config["training"]
    kwargs = dict(config["model"])
    for key in ("bptt", "clip_norm", "weight_decay", "seed", "flooding_level"):
        if key in training:
            kwargs.setdefault(key, training[key])
    kwargs.pop("vocab_size", None)
    try:
        return AWDLSTM(vocab_size=vocab_size, **kwargs)
    except (TypeError, ValueError) as err:
        raise UserError(f"bad model configuration: {err}") from err


def check_init_model(path, model, vocabulary):
    import keras
    src = keras.saving.load_model(path)
    if getattr(src, "vocab_size", None) != model.vocab_size:
        raise UserError(
            f"--init-from {path}: the checkpoint has a vocabulary of "
            f"{getattr(src, 'vocab_size', '?')} words but the corpus has {model.vocab_size}; "
            "train on the corpus the checkpoint was made with.")
    vocab_file = pathlib.Path(path).parent / "vocab.txt"
    if vocab_file.exists():
        saved = vocab_file.read_text(encoding="utf-8").splitlines()
        if saved != list(vocabulary):
            raise UserError(f"--init-from {path}: its vocab.txt differs from the corpus "
                            "vocabulary (same size, different words or order).")
    model.set_weights(src.get_weights())


def _load_for_finetune(model, run_dir, vocabulary):
    """Start from RUN_DIR's averaged best model and restart averaging from it."""
    import keras

    from tflm.optimizers import find_averaged_optimizer, start_finetune
    path = pathlib.Path(run_dir) / "best.keras"
    if not path.exists():
        raise UserError(f"--finetune {run_dir}: no best.keras there; finetune a finished or "
                        "checkpointed run directory.")
    check_init_model(path, model, vocabulary)
    if find_averaged_optimizer(model.optimizer) is None:
        raise UserError("--finetune needs training.optimizer=asgd (averaged SGD).")
    model.optimizer.build(model.trainable_variables)
    start_finetune(model)


def _fixed_contexts(ids, count=3, length=20):
    """A few fixed validation contexts (evenly spaced) for the top-5 predictions text."""
    starts = [int(i * (len(ids) - length) / count) for i in range(count)]
    return [ids[s:s + length] for s in starts]


def _prepare_run_dir(out, config, vocabulary, resume):
    if resume:
        return
    if (out / "metrics.json").exists():
        raise UserError(f"{out} already holds a finished run (metrics.json); choose another "
                        "--out so nothing of it is overwritten.")
    if (out / "checkpoint").exists():
        raise UserError(f"{out} holds an unfinished run; continue it with --resume {out} or "
                        "choose another --out.")
    out.mkdir(parents=True, exist_ok=True)
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "vocab.txt").write_text("\n".join(vocabulary) + "\n", encoding="utf-8")


def run(config, out_dir, data_dir=None, init_from=None, verbose=1, resume=False,
        strategy_name="default", finetune_from=None):
    """Train, checkpoint every epoch, evaluate the best model; returns the metrics dict.

    With `resume=True`, `config` is read from `out_dir/config.json` and training continues
    after the last checkpointed epoch with the same data order and random state, so the
    result equals an uninterrupted run's. With `finetune_from=RUN_DIR` the averaged
    `best.keras` of that run restarts averaging and training stops on the non-monotonic
    rule (salesforce/awd-lstm-lm finetune.py).
    """
    import keras

    from tflm import data, distribute
    from tflm.callbacks import StopOnNaN, WordsPerSecond
    from tflm.optimizers import averaged_weights
    from tflm.tensorboard import EmbeddingProjector, TopPredictionsText
    from zoo.checkpoint import fingerprint, load_checkpoint, read_state, save_checkpoint

    out = pathlib.Path(out_dir)
    strategy = distribute.get_strategy(strategy_name) if strategy_name != "default" else None
    if resume:
        read_state(out)  # fail early on a missing or corrupt checkpoint
        config = json.loads((out / "config.json").read_text())
    training = config["training"]
    seed = int(training.get("seed", 0))
    keras.utils.set_random_seed(seed)
    corpus, optimal = load_data(config["corpus"], data_dir)
    vocabulary = list(corpus.vocabulary)
    print_ = fingerprint(config, vocabulary)
    _prepare_run_dir(out, config, vocabulary, resume)

    scope = strategy.scope() if strategy is not None else keras.name_scope("run")
    with scope:
        if resume:
            model, state = load_checkpoint(out, print_)
        else:
            model = build_model(config, len(vocabulary))
            model.compile(optimizer=make_optimizer(training))
            model.build((None, None))
            state = {"epoch": 0, "history": [], "best": None, "fingerprint": print_}
            if init_from:
                check_init_model(init_from, model, vocabulary)
            if finetune_from:
                _load_for_finetune(model, finetune_from, vocabulary)
    trigger = make_trigger(training, finetune=bool(finetune_from or config.get("finetune")))
    if trigger is not None and state.get("trigger"):
        trigger.set_state(state["trigger"])

    bptt = int(training.get("bptt", 70))
    batch = int(training.get("batch_size", 20))
    eval_batch = int(training.get("eval_batch_size", 10))
    test_batch = int(training.get("test_batch_size", 1))
    max_len = training.get("max_seq_len")
    epochs = int(training.get("epochs", 1))
    pad = pad_to_multiple(training)
    valid_ds = distribute.lm_dataset_for(strategy, corpus.valid, eval_batch, bptt, train=False,
                                         pad_to_multiple=pad)
    positions = (len(corpus.train) // batch) - 1
    speed = WordsPerSecond(tokens_per_epoch=batch * positions)
    board = keras.callbacks.TensorBoard(log_dir=str(out / "logs"),
                                        histogram_freq=int(training.get("histograms", 0)))
    extras = [] if trigger is None else [trigger]
    extras += [EmbeddingProjector(out / "logs", vocabulary),
              TopPredictionsText(out / "logs", _fixed_contexts(corpus.valid), vocabulary)]
    history, best = state["history"], state["best"]
    for epoch in range(state["epoch"], epochs):
        train_ds = distribute.lm_dataset_for(strategy, corpus.train, batch, bptt, train=True,
                                             seed=seed, epoch=epoch, max_len=max_len,
                                             pad_to_multiple=pad)
        hist = model.fit(train_ds, validation_data=valid_ds, initial_epoch=epoch,
                         epochs=epoch + 1, verbose=verbose,
                         callbacks=[StopOnNaN(), speed, *extras[:1], board, *extras[1:]])
        logs = {k: float(v[-1]) for k, v in hist.history.items()}
        logs["epoch"] = epoch + 1
        logs["learning_rate"] = float(keras.ops.convert_to_numpy(model.optimizer.learning_rate))
        history.append(logs)
        if best is None or logs["val_perplexity"] < best["val_perplexity"]:
            best = logs
            with averaged_weights(model):  # the averaged model, once averaging has started
                model.save(out / "best.keras")
        save_checkpoint(out, model, {
            "epoch": epoch + 1, "history": history, "best": best, "fingerprint": print_,
            "trigger": None if trigger is None else trigger.get_state()})
        if os.environ.get("TFLM_FAULT_KILL_AFTER_EPOCH") == str(epoch + 1):
            os._exit(137)  # fault injection for the resume test: die like a killed process
        if getattr(trigger, "stopped", False):
            break
    with averaged_weights(model):
        model.save(out / "final.keras")

    best_model = keras.saving.load_model(out / "best.keras")
    results = {"preset": config.get("preset"), "corpus": corpus.name,
               "vocab_size": len(vocabulary), "parameters": int(model.count_params()),
               "optimal_perplexity": optimal, "best_epoch": best["epoch"],
               "words_per_second": speed.last or best.get("words_per_second"),
               "history": history}
    results["train_perplexity"] = best["perplexity"]
    results["train_perplexity_note"] = "with dropout, averaged over the training epoch"
    for split, size in (("valid", eval_batch), ("test", test_batch)):
        ds = data.lm_dataset(corpus.split(split), size, bptt, train=False, pad_to_multiple=pad)
        results[f"{split}_perplexity"] = float(
            best_model.evaluate(ds, verbose=0, return_dict=True)["perplexity"])
    (out / "metrics.json").write_text(json.dumps(results, indent=2))
    return results


def pad_to_multiple(training):
    """`training.pad_to_multiple`, default `tflm.data.default_pad_to_multiple`: 4 on JAX
    (one compiled step per padded window length instead of one per length), 1 (no padding)
    on TensorFlow and PyTorch, whose steps take any length."""
    import keras

    from tflm import data
    value = training.get("pad_to_multiple")
    if value is None:
        return data.default_pad_to_multiple(keras.backend.backend())
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UserError(f"training.pad_to_multiple must be a positive integer (4 suits JAX, "
                        f"1 turns padding off); got {value!r}.")
    return value


def summary_table(results):
    rows = [("corpus", results["corpus"]), ("parameters", f"{results['parameters']:,}"),
            ("best epoch", results["best_epoch"]),
            ("train perplexity", f"{results['train_perplexity']:.2f} (dropout on)"),
            ("valid perplexity", f"{results['valid_perplexity']:.2f}"),
            ("test perplexity", f"{results['test_perplexity']:.2f}")]
    if results.get("optimal_perplexity"):
        rows.append(("optimal perplexity", f"{results['optimal_perplexity']:.2f} "
                     "(the language's entropy rate)"))
    rows.append(("training words/s", f"{results['words_per_second']:,.0f}"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def finetune_config(args):
    """The configuration of a finetuning run: RUN_DIR's config with the preset's
    `finetune_overrides`, then the command line's flags and `--set` overrides."""
    from zoo.config import apply_override
    path = pathlib.Path(args.finetune) / "config.json"
    if not path.exists():
        raise UserError(f"--finetune {args.finetune}: no config.json there.")
    config = json.loads(path.read_text())
    config["finetune"] = {"from": str(args.finetune)}
    config["training"].update(config["training"].get("finetune_overrides", {}))
    for key, value in (("epochs", args.epochs), ("batch_size", args.batch_size),
                       ("seed", args.seed)):
        if value is not None:
            config["training"][key] = value
    for assignment in args.set:
        apply_override(config, assignment)
    return config


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        from tflm.callbacks import TrainingDiverged
        from tflm.data import CorpusNotFoundError
        from zoo.checkpoint import CheckpointError
        from zoo.config import ConfigError, resolve_config
        from zoo.heads import head_names
        if args.head is not None and args.head not in head_names():
            raise UserError(f"unknown head {args.head!r}; choose one of "
                            f"{', '.join(head_names())}.")
        if args.resume:
            config, out = None, args.resume
        elif args.finetune:
            config = finetune_config(args)
            out = args.out or str(pathlib.Path(args.finetune) / "finetune")
        else:
            config = resolve_config(args.preset, args.set, corpus=args.corpus, head=args.head,
                                    epochs=args.epochs, batch_size=args.batch_size,
                                    seed=args.seed)
            out = args.out or os.path.join("runs", f"{pathlib.Path(args.preset).stem}-"
                                           f"{time.strftime('%Y%m%d-%H%M%S')}")
        results = run(config, out, data_dir=args.data_dir, init_from=args.init_from,
                      verbose=0 if args.quiet else 1, resume=bool(args.resume),
                      strategy_name=args.strategy, finetune_from=args.finetune)
    except (UserError, ConfigError, CorpusNotFoundError, TrainingDiverged,
            CheckpointError) as err:
        print(f"zoo.train: error: {err}", file=sys.stderr)
        return 2 if not isinstance(err, TrainingDiverged) else 3
    except ValueError as err:
        if "preset" in str(err) or "head" in str(err):
            print(f"zoo.train: error: {err}", file=sys.stderr)
            return 2
        raise
    print(summary_table(results))
    print(f"outputs in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
