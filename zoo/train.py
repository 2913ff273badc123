"""`python -m zoo.train`: train a preset, evaluate it, report perplexity, log to TensorBoard.

With no arguments it makes the default synthetic high-rank language, trains the tiny
`synthetic` preset on it (minutes on a laptop CPU) and prints train / valid / test
perplexity next to the language's optimal perplexity. The outputs are those of
`zoo.runs.training.run` (config.json, vocab.txt, best.keras, final.keras, checkpoint/,
metrics.json, logs/). This module is the command line only: the configuration is
`zoo.runs.config` (checked into `zoo.runs.settings`), the corpus `zoo.runs.corpora`, model /
optimizer / trigger `zoo.runs.builders`, the training loop with its checkpoints
`zoo.runs.training`.
"""

import argparse
import json
import logging
import os
import pathlib
import shlex
import sys
import time

from zoo.errors import UserError
from zoo.runtime.command import imports_done, run_command, start_command
from zoo.runtime.user_errors import check_output_dir, one_line_errors


def build_parser():
    """The argument parser of `python -m zoo.train` (every flag with its help text)."""
    # deferred: a command's frameworks import after start_command (zoo.runtime.command)
    from zoo.models.heads import head_names
    from zoo.presets import list_presets
    from zoo.runs.settings import PRECISIONS
    p = argparse.ArgumentParser(
        prog="python -m zoo.train", description=__doc__.split("\n")[0],
        epilog=f"presets: {', '.join(list_presets())}. Examples: python -m zoo.train; "
               "python -m zoo.train --preset awd_lstm_ptb; python -m zoo.train --resume "
               "RUN_DIR --epochs 1000.")
    p.add_argument("--preset", help="preset name (one of the presets listed below) or a "
                                    "preset JSON file; default synthetic")
    p.add_argument("--corpus", help="synthetic, ptb, wikitext-2 or a directory with "
                                    "train.txt, valid.txt, test.txt; default: the preset's")
    p.add_argument("--data-dir", help="where named corpora lie (default $TFLM_DATA_DIR, else "
                                      "~/.cache/tflm/data)")
    p.add_argument("--head", help=f"output head: {', '.join(head_names())}; default: the "
                                  "preset's")
    p.add_argument("--epochs", type=int, metavar="N",
                   help="number of training epochs (training.epochs); with --resume, the "
                        "new total: more epochs extend a run")
    p.add_argument("--batch-size", type=int, dest="batch_size", metavar="B",
                   help="training batch size, the number of parallel streams "
                        "(training.batch_size)")
    p.add_argument("--seed", type=int, metavar="S",
                   help="random seed of initialisation, dropout and window lengths "
                        "(training.seed)")
    p.add_argument("--out", help="output directory (default runs/<preset>-<time>); must not "
                                 "hold a run already")
    p.add_argument("--init-from", metavar="MODEL.keras",
                   help="start from the weights of a saved .keras model (same vocabulary "
                        "and backbone; a different head keeps its new weights at their "
                        "initialisation)")
    p.add_argument("--resume", metavar="RUN_DIR",
                   help="continue a killed run from its last epoch checkpoint, with its own "
                        "configuration (only --epochs, --data-dir, --strategy, "
                        "--export-preset, --quiet may be given with it)")
    p.add_argument("--finetune", metavar="RUN_DIR",
                   help="finetune the averaged best model of RUN_DIR (restart averaging, stop "
                        "on the non-monotonic rule); writes into --out")
    p.add_argument("--strategy", default="default",
                   choices=["default", "mirrored", "multi-worker", "data-parallel"],
                   help="mirrored / multi-worker: a tf.distribute strategy (TensorFlow); "
                        "data-parallel: keras.distribution.DataParallel over every device "
                        "(JAX)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="override any preset field, e.g. --set model.dropout=0.3 (repeatable; "
                        "values are JSON when they parse as JSON)")
    p.add_argument("--precision", choices=PRECISIONS,
                   help="Keras dtype policy of the model (training.precision; default "
                        "float32): mixed_bfloat16 / mixed_float16 compute the layers in 16 "
                        "bits with the variables, the carried state, the softmax and the "
                        "perplexity in float32")
    p.add_argument("--export-preset", metavar="DIR", dest="export_preset",
                   help="also write the best model as a preset folder in KerasHub's layout "
                        "(config, weights, vocabulary, metadata with the run's provenance); "
                        "load it with zoo.AWDLSTM.from_preset(DIR)")
    p.add_argument("--quiet", action="store_true",
                   help="no progress bar: one short line per epoch (loss, perplexity, valid "
                        "perplexity, seconds)")
    return p


def summary_table(results):
    rows = [("corpus", results["corpus"]), ("parameters", f"{results['parameters']:,}"),
            ("best epoch", results["best_epoch"]),
            ("train perplexity",
             "- (the model finetuned from was kept)" if results["train_perplexity"] is None
             else f"{results['train_perplexity']:.2f} (dropout on)"),
            ("valid perplexity", f"{results['valid_perplexity']:.2f}"),
            ("test perplexity", f"{results['test_perplexity']:.2f}")]
    if "test_bpc" in results:  # a character-level corpus
        rows += [("valid bpc", f"{results['valid_bpc']:.3f}"),
                 ("test bpc", f"{results['test_bpc']:.3f}")]
    if results.get("optimal_perplexity"):
        rows.append(("optimal perplexity", f"{results['optimal_perplexity']:.2f} "
                     "(the language's entropy rate)"))
    rows.append(("training words/s", words_per_second_line(results)))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def words_per_second_line(results):
    """The summary's throughput: the whole run's (every epoch's training tokens over their
    training-loop seconds, a resumed run's earlier epochs included: `run_words_per_second`),
    and the last epoch's where it differs."""
    whole, last = results.get("run_words_per_second"), results.get("words_per_second")
    if whole is None:
        return "-" if last is None else f"{last:,.0f} (the last epoch)"
    epochs = len(results.get("history", ()))
    text = f"{whole:,.0f} (the run's {epochs} epoch{'s' * (epochs != 1)}, training loop only"
    return text + (f"; the last epoch: {last:,.0f})" if last and round(last) != round(whole)
                   else ")")


def finetune_config(args):
    """The configuration of a finetuning run: RUN_DIR's config with the preset's
    `finetune_overrides`, then the command line's flags and `--set` overrides."""
    # deferred: a command's frameworks import after start_command (zoo.runtime.command)
    from zoo.runs.config import apply_override
    path = pathlib.Path(args.finetune) / "config.json"
    if not path.exists():
        raise UserError(f"--finetune {args.finetune}: no config.json there.")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as err:
        raise UserError(f"--finetune {args.finetune}: {path} is not valid JSON ({err}).") from err
    if not isinstance(config, dict) or not isinstance(config.get("training"), dict):
        raise UserError(f"--finetune {args.finetune}: {path} is not a run's configuration "
                        "(no training part).")
    config["finetune"] = {"from": str(args.finetune)}
    config["training"].update(config["training"].get("finetune_overrides", {}))
    for key, value in (("epochs", args.epochs), ("batch_size", args.batch_size),
                       ("seed", args.seed), ("precision", args.precision)):
        if value is not None:
            config["training"][key] = value
    for assignment in args.set:
        apply_override(config, assignment)
    return config


def output_dir(args):
    """The run directory the command writes into: --resume's, --out, a finetune's
    RUN_DIR/finetune, else runs/<preset>-<time>."""
    if args.resume:
        return args.resume
    if args.finetune:
        return args.out or str(pathlib.Path(args.finetune) / "finetune")
    return args.out or os.path.join("runs", f"{pathlib.Path(args.preset or 'synthetic').stem}-"
                                    f"{time.strftime('%Y%m%d-%H%M%S')}")


def interrupted_message(out, args):
    """The one line a Ctrl-C prints: where the last epoch checkpoint is and the command that
    continues the run, or that nothing was kept (a new run's folder is removed when no
    epoch finished: `zoo.runs.run_dir`)."""
    # deferred: a command's frameworks import after start_command (zoo.runtime.command)
    from zoo.runs.checkpoint import CheckpointError, read_state
    out = pathlib.Path(out)
    if not (out / "checkpoint" / "state.json").exists():
        left = (f"{out} holds no checkpoint" if out.exists()
                else f"no run folder is left at {out}")
        return f"interrupted before the first epoch finished, so nothing was kept ({left})."
    try:
        done = f"epoch {read_state(out)['epoch']}"
    except (CheckpointError, KeyError, OSError):
        done = "the last finished epoch"
    command = ["python", "-m", "zoo.train", "--resume", str(out)]
    for flag, value in (("--epochs", args.epochs if args.resume else None),
                        ("--data-dir", args.data_dir),
                        ("--strategy", None if args.strategy == "default" else args.strategy)):
        if value is not None:
            command += [flag, str(value)]
    command += ["--quiet"] if args.quiet else []
    return (f"interrupted; the checkpoint of {done} is kept in {out / 'checkpoint'}; "
            f"continue the run with: {shlex.join(command)}")


@one_line_errors("zoo.train")
def main(argv=None):
    """Run the command line; returns the exit code: 0, 2 for an error the user fixes by
    changing the command (a one-line message; `zoo.runtime.user_errors`), 3 when training
    diverged, 130 on Ctrl-C (a one-line message saying how to continue)."""
    start_command()  # before the parser, whose help lists the heads (Keras)
    args = out = None
    try:
        args = build_parser().parse_args(argv)
        args.argv = list(sys.argv[1:] if argv is None else argv)  # the command, for a preset
        out = output_dir(args)
        return _main(args, out)
    except KeyboardInterrupt:
        # The command ends here. A Ctrl-C during tracing leaves half-built graphs whose
        # TensorArrays log "Object was never used" errors when freed: noise, not for the user.
        logging.getLogger("tensorflow").setLevel(logging.CRITICAL)
        if out is None:
            print("zoo.train: interrupted before the run started; nothing was written.",
                  file=sys.stderr)
            return 130
        if not args.quiet:
            print(flush=True)  # end the progress bar's line
        print(f"zoo.train: {interrupted_message(out, args)}", file=sys.stderr)
        return 130


def missing_base_message(base):
    """What to run first for a preset that starts from a pre-trained model (its `base`)."""
    steps = f"python -m zoo.train --preset {base['preset']} --out BASE"
    if base.get("finetuned"):
        steps += ", then python -m zoo.train --finetune BASE --out TUNED"
    where = "TUNED" if base.get("finetuned") else "BASE"
    return (f"this preset puts a new head on a pre-trained {base['preset']} model"
            f"{' (finetuned)' if base.get('finetuned') else ''}: train it first ({steps}) "
            f"and pass --init-from {where}/best.keras.")


def _main(args, out):
    """`main` after the start: train into `out`, or print the one-line error."""
    # deferred: a command's frameworks import after start_command (zoo.runtime.command)
    from tflm.callbacks import TrainingDiverged
    from tflm.data import CorpusNotFoundError
    from zoo.runs.checkpoint import CheckpointError
    from zoo.runs.config import resolve_config
    from zoo.models.heads import head_names
    from zoo.models.saving import check_model_file
    from zoo.runs.preset_export import check_target as check_export_target
    from zoo.runs.resume import is_finished, refuse_fixed_flags
    from zoo.runs.training import run
    imports_done()  # the frameworks' objects: no full GC walks them
    try:
        if args.head is not None and args.head not in head_names():
            raise UserError(f"unknown head {args.head!r}; choose one of "
                            f"{', '.join(head_names())}.")
        if args.resume:
            refuse_fixed_flags(args)
            if args.export_preset and is_finished(args.resume, args.epochs):
                return _export(args, args.resume)  # nothing to train: the preset folder only
            config = None
        elif args.finetune:
            config = finetune_config(args)
        else:
            config = resolve_config(args.preset or "synthetic", args.set, corpus=args.corpus,
                                    head=args.head, epochs=args.epochs,
                                    batch_size=args.batch_size, seed=args.seed,
                                    precision=args.precision)
        if config is not None and config.get("base") and not args.init_from:
            raise UserError(missing_base_message(config["base"]))
        if args.init_from:  # before anything is made, not after the model is built
            check_model_file(args.init_from, "--init-from")
        if not args.resume:
            check_output_dir(out, "--out")
        if args.export_preset:
            check_export_target(args.export_preset)
        results = run(config, out, data_dir=args.data_dir, init_from=args.init_from,
                      verbose=2 if args.quiet else 1, resume=bool(args.resume),
                      strategy_name=args.strategy, finetune_from=args.finetune,
                      epochs=args.epochs if args.resume else None)
    except (UserError, CorpusNotFoundError, TrainingDiverged, CheckpointError) as err:
        if isinstance(err, TrainingDiverged) and not args.quiet:
            print(flush=True)  # end the progress bar's line
        print(f"zoo.train: error: {err}", file=sys.stderr)
        return 2 if not isinstance(err, TrainingDiverged) else 3
    print(summary_table(results))
    print(f"outputs in {out}")
    return _export(args, out) if args.export_preset else 0


def _export(args, out):
    """`--export-preset`: the best model of the run in `out` as a preset folder."""
    # deferred: a command's frameworks import after start_command (zoo.runtime.command)
    from zoo.runs.atomic_files import failing_in_one_line
    from zoo.runs.preset_export import export_run
    with failing_in_one_line(args.export_preset, f"the run's outputs in {out}",
                             f"rerun with --resume {out} --export-preset DIR"):
        family = export_run(out, args.export_preset,
                            command=shlex.join(["python", "-m", "zoo.train", *args.argv]))
    print(f"preset folder: {args.export_preset} (load it with "
          f"zoo.{family}.from_preset({str(args.export_preset)!r}))")
    return 0


if __name__ == "__main__":
    run_command(main)
