"""A whole training run: train, checkpoint every epoch, evaluate the best model, report.

`run(config, out_dir)` is what `python -m zoo.train` calls. It reads the configuration once
into `zoo.runs.settings.RunSettings`, and a `TrainingRun` trains from those settings; it
writes into `out_dir`:

  config.json     the fully resolved configuration
  vocab.txt       the vocabulary (one token per line, in id order)
  best.keras      the model with the best validation perplexity so far (averaged weights
                  once averaged SGD has switched)
  final.keras     the model after the last epoch (averaged weights likewise)
  checkpoint/     the last epoch's checkpoint, for `resume=True` (`zoo.runs.checkpoint`)
  metrics.json    per-epoch history (with where each epoch's time went), the final
                  train/valid/test figures and `seconds`: wall time per phase of the run
  logs/           TensorBoard: loss, perplexity, learning rate, averaging, words/s, gradient
                  norm per epoch; embedding projector; top-5 predictions text

Nothing silently wrong: the configuration and the corpus are checked before the directory
is created, a start that fails removes what it created (`zoo.runs.run_dir`), and a loss or
perplexity that stops being finite ends the run (`TrainingDiverged`) with the last good
checkpoint and best.keras kept and no final.keras or metrics.json written.
"""

import hashlib
import math
import pathlib

import keras
import numpy as np

from tflm import data, distribute
from tflm.callbacks import (BitsPerCharacter, EpochProgbar, StopOnNaN, TrainingDiverged,
                            WordsPerSecond)
from tflm.optimizers import averaged_weights
from tflm.tensorboard import EmbeddingProjector, TopPredictionsText, tensorboard_callback
from zoo.models.saving import load_model
from zoo.runs import checkpoint, run_outputs
from zoo.runs.builders import (build_model, make_lr_schedule, make_optimizer, make_trigger,
                               pad_to_multiple, set_window_shapes)
from zoo.runs.corpora import check_split_sizes, load_data
from zoo.runs.eval_window import window_for_run
from zoo.runs.final_evaluation import final_evaluation, xla_pays
from zoo.runs.initial_weights import (check_init_model, finetune_baseline, load_for_finetune,
                                      set_training_word_counts)
from zoo.runs.phase_timer import PhaseTimer
from zoo.runs.resume import recover_run, resume_config
from zoo.runs.run_dir import NewRunDir, prepare_run_dir
from zoo.runs.run_lock import RunLock
from zoo.runs.run_scalars import EVALUATION_DIR
from zoo.runs.settings import RunSettings
from zoo.runtime import (allocator, compilation_cache, device_memory, interrupt, progress,
                         python_gc, xla_flags)


def fixed_contexts(ids, count=3, length=20):
    """A few fixed validation contexts (evenly spaced) for the top-5 predictions text."""
    starts = [int(i * (len(ids) - length) / count) for i in range(count)]
    return [ids[s:s + length] for s in starts]


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
    (written into config.json; `zoo.runs.resume` says what a resume may change). With
    `finetune_from=RUN_DIR` the averaged `best.keras` of that run restarts averaging and
    training stops on the non-monotonic rule (salesforce/awd-lstm-lm finetune.py).
    `verbose`: 1 = Keras' progress bar ("Epoch k/N" over the whole run), 2 = one short
    line per epoch (`epoch_line`), 0 = silent.

    One process at a time writes into a run folder: the run holds its lock
    (`zoo.runs.run_lock`) from before a resume reads it, or from a new run's creating it,
    until the run ends; a resume first puts back the newest intact checkpoint
    (`zoo.runs.resume.recover_run`) and says which one it uses.
    """
    with RunLock(out_dir) as lock:
        return _run(lock, config, out_dir, data_dir, init_from, verbose, resume,
                    strategy_name, finetune_from, epochs)


def _run(lock, config, out_dir, data_dir, init_from, verbose, resume, strategy_name,
         finetune_from, epochs):
    """`run`, with the run folder's `lock` to take."""
    out = pathlib.Path(out_dir)
    timer = PhaseTimer()
    state, changed = None, False
    if resume:
        lock.acquire()  # a second process on the run is refused before anything is read
        recovered = recover_run(out)
        config, state, changed = resume_config(out, epochs)
        if verbose:
            print(recovered, flush=True)
    settings = RunSettings.from_config(config)  # checked once, before anything is created
    with timer.phase("load_data"):
        corpus, optimal = load_data(settings.corpus, data_dir)
    check_split_sizes(corpus, settings.training)
    job = TrainingRun(settings, out, corpus, optimal, timer, verbose,
                      finetune=bool(finetune_from or settings.finetuning))
    with NewRunDir(out) as run_dir:
        if resume:
            run_dir.keep()  # an existing run: a failed resume removes nothing of it
        else:
            prepare_run_dir(out, config, job.vocabulary, lock)
        with interrupt.deferring():  # a Ctrl-C stops at the next batch, not inside TF
            return job.train(run_dir, state, rewrite_config=changed, init_from=init_from,
                             strategy_name=strategy_name, finetune_from=finetune_from)


def corpus_digest(corpus):
    """SHA-256 of the token ids the run read (train, valid, test; int32, in order) and its
    vocabulary: which data a figure was made on, whatever the files' names or formats."""
    digest = hashlib.sha256()
    for ids in (corpus.train, corpus.valid, corpus.test):
        digest.update(np.ascontiguousarray(np.asarray(ids), dtype=np.int32).tobytes())
        digest.update(b"|")
    digest.update("\n".join(corpus.vocabulary).encode("utf-8"))
    return digest.hexdigest()


def run_words_per_second(history):
    """The whole run's training throughput: every epoch's training tokens over every
    epoch's training-loop seconds (`tflm.callbacks.WordsPerSecond`: validation excluded,
    the first epoch's tracing included), the epochs of earlier sessions of a resumed run
    too; None before any epoch. (`words_per_second` is the last epoch's alone.)"""
    timed = [h for h in history if h.get("words_per_second") and h.get("train_seconds")]
    seconds = sum(h["train_seconds"] for h in timed)
    tokens = sum(h["words_per_second"] * h["train_seconds"] for h in timed)
    return tokens / seconds if seconds > 0 else None


class TrainingRun:
    """One run of `run`, after its checks: build or load the model, train the remaining
    epochs with a checkpoint after each (`run_dir.keep()` after the first), evaluate the
    best model, write the outputs. The averaging trigger and the learning-rate schedule
    are made at construction (a bad one is refused before the run folder exists); their
    states travel in the checkpoint."""

    def __init__(self, settings, out, corpus, optimal, timer, verbose, finetune=False):
        self.settings, self.training = settings, settings.training
        self.out, self.corpus, self.optimal = out, corpus, optimal
        self.timer, self.verbose = timer, verbose
        self.vocabulary = list(corpus.vocabulary)
        self.trigger = make_trigger(self.training, finetune=finetune)
        self.schedule = make_lr_schedule(self.training)  # lr / 10 after `when`, or decay
        self.model = self.fingerprint = self.pad = self.pad_to_compiled = None

    def train(self, run_dir, state, rewrite_config, init_from, strategy_name, finetune_from):
        """Train from `state` (a checkpoint's, or None for a new run); returns the metrics
        dict, also written to metrics.json."""
        strategy, previous = None, keras.distribution.distribution()
        if strategy_name == distribute.DATA_PARALLEL:  # JAX: no strategy object, a global one
            distribute.data_parallel(batch_sizes=(self.training.batch_size,
                                                  self.training.eval_batch_size))
        elif strategy_name != "default":
            strategy = distribute.get_strategy(strategy_name)
        try:
            return self._train(run_dir, state, rewrite_config, init_from, strategy,
                               finetune_from, previous)
        finally:
            keras.distribution.set_distribution(previous)

    def _train(self, run_dir, state, rewrite_config, init_from, strategy, finetune_from,
               previous):
        """`train`'s run under `strategy` (tf.distribute) or the distribution it set (JAX),
        which the final passes leave for `previous`."""
        jax_cache = compilation_cache.enable()  # JAX: a rerun skips the step compiles
        keras.utils.set_random_seed(self.training.seed)
        resume = state is not None
        with self.timer.phase("build"), (strategy.scope() if strategy is not None
                                         else keras.name_scope("run")):
            state = self.build_model(state, init_from, finetune_from)
        if rewrite_config:  # a resume with a new --epochs: config.json records the new total
            run_outputs.rewrite_config(self.out, self.settings.config,
                                       (state.get("best") or {}).get("epoch"))
        for callback, key in ((self.trigger, "trigger"), (self.schedule, "lr_schedule")):
            if callback is not None and state.get(key):
                callback.set_state(state[key])
        valid_ds = self.set_windows(strategy)
        if finetune_from and not resume:
            state["best"] = finetune_baseline(self.model, self.out, valid_ds)
        history, best, speed, best_validated_as_saved = self.fit_epochs(
            state, strategy, valid_ds, run_dir)
        with self.timer.phase("save"), averaged_weights(self.model):
            run_outputs.save_final(self.model, self.out, best["epoch"])
        # the final passes run on one device: a test batch of one stream splits over none
        keras.distribution.set_distribution(previous)
        evaluated = self.training.final_evaluation.model  # "best" or "final"
        with self.timer.phase("load_best"):
            best_model = load_model(self.out / f"{evaluated}.keras")
        results = self.results(history, best, speed, jax_cache)
        results.update(final_evaluation(
            best_model, self.corpus, self.training, self.eval_window, self.pad,
            self.pad_to_compiled, best, best_validated_as_saved and evaluated == "best",
            self.timer))
        if evaluated == "final":
            results["evaluation"]["model"] = "final.keras"
        results["seconds"] = self.timer.report()
        run_outputs.write_metrics(self.out, results)
        return results

    def build_model(self, state, init_from, finetune_from):
        """`self.model`: the checkpoint's when resuming (returns its state), else a new
        model compiled with the run's optimizer, started from `init_from` or the run to
        finetune (returns a fresh state)."""
        self.fingerprint = fingerprint = checkpoint.fingerprint(self.settings.config,
                                                                self.vocabulary)
        if state is not None:
            self.model, state = checkpoint.load_checkpoint(self.out, fingerprint)
            return state
        self.model = model = build_model(self.settings, len(self.vocabulary))
        model.compile(optimizer=make_optimizer(self.training),
                      steps_per_execution=self.training.steps_per_execution,
                      jit_compile=self.training.jit_compile)
        model.build((None, None))
        set_training_word_counts(model, self.corpus.train, len(self.vocabulary))
        if init_from:
            check_init_model(init_from, model, self.vocabulary)
        if finetune_from:
            load_for_finetune(model, finetune_from, self.vocabulary)
        return {"epoch": 0, "history": [], "best": None, "fingerprint": fingerprint}

    def eval_window(self, bptt, batch):
        """The window an evaluation pass at `batch` x `bptt` computes with: longer than
        bptt where the perplexity is the same (`zoo.runs.eval_window`)."""
        return window_for_run(self.training, bptt, batch, len(self.vocabulary),
                              getattr(self.model, "carry_state", True))

    def set_windows(self, strategy):
        """The model's window shapes and evaluation compilation; returns fit's validation
        dataset."""
        training, model = self.training, self.model
        # TensorFlow: evaluation (fit's validation, the final passes) under XLA, also on a
        # CPU, where the pass is long enough to repay the compiles
        model.xla_evaluation = xla_pays(training.xla_evaluation, self.corpus.valid,
                                        training.eval_batch_size, training.bptt)
        self.pad = pad_to_multiple(training)
        # JAX: windows padded to lengths compiled already, one training program for nearly
        # every random window; elsewhere unpadded windows run the mask-free LSTM loop
        self.pad_to_compiled = set_window_shapes(model, training, self.pad)
        return distribute.lm_dataset_for(
            strategy, self.corpus.valid, training.eval_batch_size,
            self.eval_window(training.bptt, training.eval_batch_size), train=False,
            pad_to_multiple=self.pad)

    def callbacks(self, speed):
        """The callbacks every epoch's `fit` shares, in order: words/s, the trigger and
        schedule (+ bits per character), TensorBoard, the projector and predictions text,
        the progress bar."""
        logs = self.out / "logs"
        # Async-safe like every callback of this fit: on JAX and PyTorch, Keras then runs
        # the batch-end hooks on a worker thread and dispatches a step before the last ended
        board = tensorboard_callback(logs, histogram_freq=self.training.histograms)
        # The trigger first (an EpochTrigger starts averaging at epoch begin), then the
        # schedule (which divides only while not averaging), both before TensorBoard.
        before = [c for c in (self.trigger, self.schedule) if c is not None]
        if getattr(self.corpus, "level", "word") == "char":  # bpc / val_bpc in the logs
            before.append(BitsPerCharacter())
        after = [EmbeddingProjector(logs, self.vocabulary,
                                    runs=("train", "validation", EVALUATION_DIR)),
                 TopPredictionsText(logs, fixed_contexts(self.corpus.valid), self.vocabulary)]
        bar = [EpochProgbar(self.training.epochs)] if self.verbose == 1 else []
        return [speed, *before, board, *after, *bar]

    def fit_epochs(self, state, strategy, valid_ds, run_dir):
        """The remaining epochs, one `fit` each, a checkpoint after each. Returns (history,
        best epoch's logs, the words/s callback, whether best.keras holds the weights the
        best epoch validated)."""
        training, model, out = self.training, self.model, self.out
        batch, seed = training.batch_size, training.seed
        speed = WordsPerSecond(tokens_per_epoch=batch * ((len(self.corpus.train) // batch) - 1))
        callbacks = self.callbacks(speed)
        history, best = state["history"], state["best"]
        python_gc.freeze_long_lived()  # the model and the datasets: the epochs' GCs skip them
        best_validated_as_saved = False  # best.keras holds the weights fit validated (below)
        for epoch in range(state["epoch"], training.epochs):
            if getattr(self.trigger, "stopped", False):  # the non-monotonic rule ended a finetune
                break
            train_ids = self.corpus.train
            if training.partial_shuffle:  # Press 2019: new stream offsets every epoch
                train_ids = data.partial_shuffle(data.batchify(self.corpus.train, batch), seed,
                                                 epoch)
            # fixed_windows: every training window is bptt long (TensorFlow's PTB tutorial),
            # else the AWD-LSTM family's random lengths
            train_ds = distribute.lm_dataset_for(strategy, train_ids, batch, training.bptt,
                                                 train=not training.fixed_windows, seed=seed,
                                                 epoch=epoch, max_len=training.max_seq_len,
                                                 pad_to_multiple=self.pad)
            traced = model.traced_steps["train"]
            try:
                with self.timer.phase("fit"):
                    hist = model.fit(train_ds, validation_data=valid_ds, initial_epoch=epoch,
                                     epochs=epoch + 1,
                                     # the bar on a terminal, a line per epoch into a file
                                     verbose=progress.verbosity() if self.verbose == 1 else 0,
                                     callbacks=[interrupt.CheckCtrlC(), StopOnNaN(),
                                                *callbacks])
            except TrainingDiverged as err:
                raise diverged(err, out, history, best) from err
            logs = {k: float(v[-1]) for k, v in hist.history.items()}
            logs["epoch"] = epoch + 1
            if keras.backend.backend() != "torch":  # eager there: every step runs the Python
                # programs the train step traced (compiled) in this epoch: one per new shape
                logs["train_step_traces"] = model.traced_steps["train"] - traced
            logs["learning_rate"] = float(keras.ops.convert_to_numpy(model.optimizer.learning_rate))
            history.append(logs)
            with self.timer.phase("save"):
                if best is None or logs["val_perplexity"] < best["val_perplexity"]:
                    previous, best = best, logs
                    with averaged_weights(model) as averaged:  # once averaging started
                        run_outputs.save_best(model, out, previous and previous["epoch"])
                    # Raw weights saved: fit validated these very weights (averages, once
                    # made, are never dropped during fit). With averages the validation may
                    # predate the switch to averaging, so the final evaluation is rerun.
                    best_validated_as_saved = not averaged
                run_outputs.save_checkpoint(out, model, {
                    "epoch": epoch + 1, "history": history, "best": best,
                    "fingerprint": self.fingerprint,
                    "trigger": None if self.trigger is None else self.trigger.get_state(),
                    "lr_schedule": None if self.schedule is None else self.schedule.get_state()})
            run_dir.keep()
            if self.verbose == 2:
                print(epoch_line(logs, training.epochs), flush=True)
            interrupt.check()
        return history, best, speed, best_validated_as_saved

    def results(self, history, best, speed, jax_cache):
        """metrics.json before the final evaluation: the run, its history, how it ran."""
        results = {"preset": self.settings.preset, "corpus": self.corpus.name,
                   "backend": keras.backend.backend(),
                   "vocab_size": len(self.vocabulary),
                   "corpus_sha256": corpus_digest(self.corpus),
                   "parameters": self.model.parameter_count(),
                   "trainable_parameters": self.model.trainable_parameter_count(),
                   "optimal_perplexity": self.optimal, "best_epoch": best["epoch"],
                   "words_per_second": speed.last or best.get("words_per_second"),
                   "run_words_per_second": run_words_per_second(history),
                   "history": history}
        if jax_cache is not None:
            results["jax_compilation_cache"] = str(jax_cache)
        peak = device_memory.peak_mib()
        if peak is not None:  # on a GPU: the allocator's peak, for speed-and-memory tables
            results["device_memory_mib"] = round(peak, 1)
        if allocator.settings_made():  # glibc malloc as zoo.train set it (zoo.runtime.allocator)
            results["allocator"] = allocator.settings_made()
        if xla_flags.flags_added():  # XLA_FLAGS as zoo.train set them (zoo.runtime.xla_flags)
            results["xla_flags"] = xla_flags.flags_added()
        if python_gc.frozen_counts():  # objects zoo.train froze (zoo.runtime.python_gc)
            results["gc_frozen"] = python_gc.frozen_counts()
        results["train_perplexity"] = best.get("perplexity")
        results["train_perplexity_note"] = ("with dropout, averaged over the training epoch"
                                            if best["epoch"] else
                                            "the finetuned-from model was kept")
        return results
