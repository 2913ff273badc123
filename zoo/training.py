"""A whole training run: train, checkpoint every epoch, evaluate the best model, report.

`run(config, out_dir)` is what `python -m zoo.train` calls; it writes into `out_dir`:

  config.json     the fully resolved configuration
  vocab.txt       the vocabulary (one token per line, in id order)
  best.keras      the model with the best validation perplexity so far (averaged weights
                  once averaged SGD has switched)
  final.keras     the model after the last epoch (averaged weights likewise)
  checkpoint/     the last epoch's checkpoint, for `resume=True` (`zoo.checkpoint`)
  metrics.json    per-epoch history (with where each epoch's time went), the final
                  train/valid/test figures and `seconds`: wall time per phase of the run
  logs/           TensorBoard: loss, perplexity, learning rate, averaging, words/s, gradient
                  norm per epoch; embedding projector; top-5 predictions text

Nothing silently wrong: the configuration and the corpus are checked before the directory
is created, a start that fails removes what it created (`zoo.rundir`), and a loss or
perplexity that stops being finite ends the run (`TrainingDiverged`) with the last good
checkpoint and best.keras kept and no final.keras or metrics.json written.
"""

import json
import math
import pathlib

from zoo import allocator, checkpoint, compilation_cache, interrupt, python_gc, xla_flags
from zoo.builders import (build_model, make_lr_schedule, make_optimizer, make_trigger,
                          pad_to_multiple, set_window_shapes)
from zoo.config import check_config
from zoo.corpora import check_split_sizes, load_data
from zoo.errors import UserError
from zoo.eval_window import window_for_run
from zoo.phase_timer import PhaseTimer
from zoo.resume import resume_config
from zoo.rundir import NewRunDir, prepare_run_dir


def check_init_model(path, model, vocabulary):
    """Copy the weights of the saved model `path` into `model`, after checking that it was
    made with the same vocabulary (size, and words when a vocab.txt lies beside it:
    `zoo.model_vocabulary`). Its head may differ from `model`'s (a NeuralODE head on a
    pre-trained softmax model): `zoo.transfer.transfer_weights`."""
    from zoo.model_vocabulary import check_model_vocabulary
    from zoo.saving import load_model
    src = load_model(path)
    size = getattr(src, "vocab_size", None)
    if size is None:
        raise UserError(f"--init-from {path}: not a zoo language model (no vocab_size).")
    check_model_vocabulary(path, size, vocabulary)
    from zoo.transfer import transfer_weights
    fresh = transfer_weights(src, model, source_name=f"--init-from {path}")
    if fresh:
        print(f"--init-from {path}: {type(src.head).__name__} head -> "
              f"{type(model.head).__name__}; at their initialisation: {', '.join(fresh)}")


def set_sampling_proposal(model, train_ids, vocab_size):
    """A head trained by importance sampling (`num_samples`) draws its noise words from the
    training split's unigram distribution, as the reference CNF code (Andonov 2019 §6.6.3).
    The proposal is saved with the model, so a resumed run keeps it."""
    import numpy as np
    sampler = getattr(model.head, "sampler", None)
    if sampler is not None:
        sampler.set_proposal(np.bincount(np.asarray(train_ids), minlength=vocab_size))


def load_for_finetune(model, run_dir, vocabulary):
    """Start from RUN_DIR's averaged best model and restart averaging from it."""
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


def finetune_baseline(model, out, valid):
    """The model a finetune starts from is its first best: evaluate it on the validation
    dataset `valid` (fit's) and save it as `best.keras`, so that an epoch is kept only when
    it beats it (both references' finetune.py start `stored_loss` from
    `evaluate(val_data)`)."""
    logs = model.evaluate(valid, verbose=0, return_dict=True)
    model.save(out / "best.keras")
    return {"epoch": 0, "val_perplexity": float(logs["perplexity"]),
            "val_loss": float(logs["loss"])}


def fixed_contexts(ids, count=3, length=20):
    """A few fixed validation contexts (evenly spaced) for the top-5 predictions text."""
    starts = [int(i * (len(ids) - length) / count) for i in range(count)]
    return [ids[s:s + length] for s in starts]


XLA_MIN_WINDOWS = 500
"""`training.xla_evaluation: "auto"` compiles an evaluation pass with XLA (TensorFlow) from
this many windows: a compile costs ~2-4 s on the CPU of bench/RESULTS.md and saves
~3-4 ms per batch-1 window there (the PTB test split: 2,355 windows, 30 -> 20-22 s)."""


def xla_pays(setting, ids, batch, bptt):
    """`model.xla_evaluation` for a pass over `ids` at `batch` x `bptt`: `setting` true or
    false as given, "auto" when the pass has at least `XLA_MIN_WINDOWS` windows of `bptt`
    (the protocol's: XLA pays per time step, whatever window `zoo.eval_window` computes
    with; at 700-token windows the PTB test pass took 19.7 s op by op and 15.4 s under XLA,
    one CPU)."""
    if setting != "auto":
        return bool(setting)
    return len(ids) // max(batch * bptt, 1) >= XLA_MIN_WINDOWS


def epoch_line(logs, epochs):
    """The one line `--quiet` prints per epoch: epoch, train loss and perplexity, validation
    perplexity, seconds (and "averaging" once averaged SGD has switched)."""
    bpc = f"valid bpc {logs['val_bpc']:.3f}  " if "val_bpc" in logs else ""
    line = (f"epoch {logs['epoch']}/{epochs}  loss {logs.get('loss', math.nan):.4f}  "
            f"ppl {logs.get('perplexity', math.nan):.2f}  valid ppl "
            f"{logs.get('val_perplexity', math.nan):.2f}  {bpc}"
            f"{logs.get('epoch_seconds', math.nan):.1f}s")
    return line + ("  averaging" if logs.get("averaging") else "")


def diverged(err, out, history, best):
    """`err` (a `TrainingDiverged`) with what was kept and how to go on."""
    from tflm.callbacks import TrainingDiverged
    if not history:
        return TrainingDiverged(f"{err} No epoch had finished, so nothing was kept.")
    return TrainingDiverged(
        f"{err} The last good checkpoint (epoch {len(history)}) is kept in "
        f"{out / 'checkpoint'} and the best model (epoch {best['epoch']}) in "
        f"{out / 'best.keras'}; no results were written. To go on, start a new run from it "
        f"with a lower training.lr: --init-from {out / 'best.keras'}.")


def run(config, out_dir, data_dir=None, init_from=None, verbose=1, resume=False,
        strategy_name="default", finetune_from=None, epochs=None):
    """Train, checkpoint every epoch, evaluate the best model; returns the metrics dict.

    With `resume=True`, `config` is read from `out_dir/config.json` and training continues
    after the last checkpointed epoch with the same data order and random state, so the
    result equals an uninterrupted run's; `epochs` then sets a new total number of epochs
    (written into config.json; `zoo.resume` says what a resume may change). With
    `finetune_from=RUN_DIR` the averaged `best.keras` of that run restarts averaging and
    training stops on the non-monotonic rule (salesforce/awd-lstm-lm finetune.py).
    `verbose`: 1 = Keras' progress bar ("Epoch k/N" over the whole run), 2 = one short
    line per epoch (`epoch_line`), 0 = silent.
    """
    out = pathlib.Path(out_dir)
    timer = PhaseTimer()
    state, changed = None, False
    if resume:
        config, state, changed = resume_config(out, epochs)
    check_config(config)
    training = config["training"]
    with timer.phase("load_data"):
        corpus, optimal = load_data(config["corpus"], data_dir)
    check_split_sizes(corpus, training)
    trigger = make_trigger(training, finetune=bool(finetune_from or config.get("finetune")))
    schedule = make_lr_schedule(training)  # training.when: lr / 10 after the listed epochs
    with NewRunDir(out) as run_dir:
        if resume:
            run_dir.keep()  # an existing run: a failed resume removes nothing of it
        else:
            prepare_run_dir(out, config, list(corpus.vocabulary))
        with interrupt.deferring():  # a Ctrl-C stops at the next batch, not inside TF
            return _train(config, out, run_dir, corpus, optimal, trigger, schedule,
                          verbose=verbose,
                          state=state, rewrite_config=changed,
                          init_from=init_from, strategy_name=strategy_name,
                          finetune_from=finetune_from, timer=timer)


def _train(config, out, run_dir, corpus, optimal, trigger, schedule, verbose, state,
           rewrite_config, init_from, strategy_name, finetune_from, timer):
    """`run` after its checks: build or load the model, train the remaining epochs with a
    checkpoint after each (`run_dir.keep()` after the first), write the outputs. The
    trigger's and the learning-rate schedule's states travel in the checkpoint."""
    import keras

    from tflm import data, distribute
    from tflm.callbacks import (BitsPerCharacter, EpochProgbar, StopOnNaN, TrainingDiverged,
                                WordsPerSecond)
    from tflm.optimizers import averaged_weights
    from tflm.tensorboard import AsyncSafeTensorBoard, EmbeddingProjector, TopPredictionsText
    from zoo.saving import load_model

    strategy = distribute.get_strategy(strategy_name) if strategy_name != "default" else None
    jax_cache = compilation_cache.enable()  # JAX: a rerun skips the step compiles
    training = config["training"]
    seed = int(training.get("seed", 0))
    keras.utils.set_random_seed(seed)
    vocabulary = list(corpus.vocabulary)
    print_ = checkpoint.fingerprint(config, vocabulary)
    resume = state is not None

    scope = strategy.scope() if strategy is not None else keras.name_scope("run")
    with timer.phase("build"), scope:
        if resume:
            model, state = checkpoint.load_checkpoint(out, print_)
        else:
            model = build_model(config, len(vocabulary))
            model.compile(optimizer=make_optimizer(training))
            model.build((None, None))
            set_sampling_proposal(model, corpus.train, len(vocabulary))
            state = {"epoch": 0, "history": [], "best": None, "fingerprint": print_}
            if init_from:
                check_init_model(init_from, model, vocabulary)
            if finetune_from:
                load_for_finetune(model, finetune_from, vocabulary)
    # TensorFlow: evaluation (fit's validation, the final passes) under XLA, also on a CPU,
    # where the pass is long enough to repay the compiles
    xla_evaluation = training.get("xla_evaluation", "auto")
    model.xla_evaluation = xla_pays(xla_evaluation, corpus.valid, int(
        training.get("eval_batch_size", 10)), int(training.get("bptt", 70)))
    if rewrite_config:  # a resume with a new --epochs: config.json records the new total
        (out / "config.json").write_text(json.dumps(config, indent=2))
    if trigger is not None and state.get("trigger"):
        trigger.set_state(state["trigger"])
    if schedule is not None and state.get("lr_schedule"):
        schedule.set_state(state["lr_schedule"])

    bptt = int(training.get("bptt", 70))
    batch = int(training.get("batch_size", 20))
    eval_batch = int(training.get("eval_batch_size", 10))
    test_batch = int(training.get("test_batch_size", 1))
    max_len = training.get("max_seq_len")
    epochs = int(training.get("epochs", 1))
    pad = pad_to_multiple(training)
    # JAX: windows padded to lengths compiled already, one training program for nearly
    # every random window; elsewhere unpadded windows run the mask-free LSTM loop
    pad_to_compiled = set_window_shapes(model, training, pad)
    # Evaluation windows longer than bptt where the perplexity is the same (zoo.eval_window)
    def eval_window(bptt_, batch_):
        return window_for_run(config, bptt_, batch_, len(vocabulary),
                              getattr(model, "carry_state", True))

    valid_ds = distribute.lm_dataset_for(strategy, corpus.valid, eval_batch,
                                         eval_window(bptt, eval_batch), train=False,
                                         pad_to_multiple=pad)
    if finetune_from and not resume:
        state["best"] = finetune_baseline(model, out, valid_ds)
    positions = (len(corpus.train) // batch) - 1
    speed = WordsPerSecond(tokens_per_epoch=batch * positions)
    # Async-safe like every callback of this fit: on JAX and PyTorch, Keras then runs the
    # batch-end hooks on a worker thread and dispatches a step before the last one ended
    board = AsyncSafeTensorBoard(log_dir=str(out / "logs"),
                                 histogram_freq=int(training.get("histograms", 0)))
    # The trigger first (an EpochTrigger starts averaging at epoch begin), then the schedule
    # (which divides only while not averaging), both before TensorBoard.
    before = [c for c in (trigger, schedule) if c is not None]
    if getattr(corpus, "level", "word") == "char":  # bpc / val_bpc in the logs, TensorBoard
        before.append(BitsPerCharacter())
    after = [EmbeddingProjector(out / "logs", vocabulary),
             TopPredictionsText(out / "logs", fixed_contexts(corpus.valid), vocabulary)]
    progress = [EpochProgbar(epochs)] if verbose == 1 else []
    history, best = state["history"], state["best"]
    python_gc.freeze_long_lived()  # the model and the datasets: the epochs' GCs skip them
    best_validated_as_saved = False  # best.keras holds the weights fit validated (below)
    for epoch in range(state["epoch"], epochs):
        if getattr(trigger, "stopped", False):  # the non-monotonic rule ended finetuning
            break
        train_ids = corpus.train
        if training.get("partial_shuffle"):  # Press 2019: new stream offsets every epoch
            train_ids = data.partial_shuffle(data.batchify(corpus.train, batch), seed, epoch)
        # fixed_windows: every training window is bptt long (TensorFlow's PTB tutorial),
        # else the AWD-LSTM family's random lengths
        train_ds = distribute.lm_dataset_for(strategy, train_ids, batch, bptt,
                                             train=not training.get("fixed_windows", False),
                                             seed=seed, epoch=epoch, max_len=max_len,
                                             pad_to_multiple=pad)
        try:
            with timer.phase("fit"):
                hist = model.fit(train_ds, validation_data=valid_ds, initial_epoch=epoch,
                                 epochs=epoch + 1, verbose=1 if verbose == 1 else 0,
                                 callbacks=[interrupt.CheckCtrlC(), StopOnNaN(), speed,
                                            *before, board, *after, *progress])
        except TrainingDiverged as err:
            raise diverged(err, out, history, best) from err
        logs = {k: float(v[-1]) for k, v in hist.history.items()}
        logs["epoch"] = epoch + 1
        logs["learning_rate"] = float(keras.ops.convert_to_numpy(model.optimizer.learning_rate))
        history.append(logs)
        with timer.phase("save"):
            if best is None or logs["val_perplexity"] < best["val_perplexity"]:
                best = logs
                with averaged_weights(model) as averaged:  # once averaging started
                    model.save(out / "best.keras")
                # Raw weights saved: fit validated these very weights (averages, once
                # made, are never dropped during fit). With averages the validation may
                # predate the switch to averaging, so the final evaluation is rerun.
                best_validated_as_saved = not averaged
            checkpoint.save_checkpoint(out, model, {
                "epoch": epoch + 1, "history": history, "best": best, "fingerprint": print_,
                "trigger": None if trigger is None else trigger.get_state(),
                "lr_schedule": None if schedule is None else schedule.get_state()})
        run_dir.keep()
        if verbose == 2:
            print(epoch_line(logs, epochs), flush=True)
        interrupt.check()
    with timer.phase("save"), averaged_weights(model):
        model.save(out / "final.keras")

    with timer.phase("load_best"):
        best_model = load_model(out / "best.keras")
    results = {"preset": config.get("preset"), "corpus": corpus.name,
               "vocab_size": len(vocabulary), "parameters": model.parameter_count(),
               "optimal_perplexity": optimal, "best_epoch": best["epoch"],
               "words_per_second": speed.last or best.get("words_per_second"),
               "history": history}
    if jax_cache is not None:
        results["jax_compilation_cache"] = str(jax_cache)
    if allocator.settings_made():  # glibc malloc as zoo.train set it (zoo.allocator)
        results["allocator"] = allocator.settings_made()
    if xla_flags.flags_added():  # XLA_FLAGS as zoo.train set them (zoo.xla_flags)
        results["xla_flags"] = xla_flags.flags_added()
    if python_gc.frozen_counts():  # objects zoo.train froze (zoo.python_gc)
        results["gc_frozen"] = python_gc.frozen_counts()
    results["train_perplexity"] = best.get("perplexity")
    results["train_perplexity_note"] = ("with dropout, averaged over the training epoch" if
                                        best["epoch"] else "the finetuned-from model was kept")
    final = training.get("final_evaluation", {})
    final_bptt = int(final.get("bptt", bptt))
    results["evaluation"] = {"bptt": final_bptt, "windows": {}}
    for split, size in (("valid", int(final.get("valid_batch_size", eval_batch))),
                        ("test", int(final.get("test_batch_size", test_batch)))):
        results["evaluation"][f"{split}_batch_size"] = size
        window = eval_window(final_bptt, size)
        results["evaluation"]["windows"][split] = window
        if (split == "valid" and best_validated_as_saved and size == eval_batch
                and window == eval_window(bptt, eval_batch)
                and best.get("val_perplexity") is not None):
            # The same weights, data, batch size and windows as the best epoch's
            # validation: its figure is this evaluation's (the reference reports it too).
            results["valid_perplexity"] = float(best["val_perplexity"])
            results["evaluation"]["valid_from"] = f"epoch {best['epoch']}'s validation"
            continue
        ds = data.lm_dataset(corpus.split(split), size, window, train=False,
                             pad_to_multiple=pad)
        best_model.xla_evaluation = xla_pays(xla_evaluation, corpus.split(split), size,
                                             final_bptt)
        best_model.pad_to_compiled_lengths = pad_to_compiled
        best_model.make_test_function(force=True)  # XLA or not, per split
        with timer.phase(f"evaluate_{split}"):
            results[f"{split}_perplexity"] = float(best_model.evaluate(
                ds, verbose=0, return_dict=True,
                callbacks=[interrupt.CheckCtrlC()])["perplexity"])
    if getattr(corpus, "level", "word") == "char":  # bits per character = log2(perplexity)
        for split in ("valid", "test"):
            results[f"{split}_bpc"] = math.log2(results[f"{split}_perplexity"])
    results["seconds"] = timer.report()
    (out / "metrics.json").write_text(json.dumps(results, indent=2))
    return results
