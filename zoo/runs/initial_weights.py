"""Where a run's weights start: a saved model's (`--init-from`), a run's averaged best
model (`--finetune`), and the sampling proposal of an importance-sampled head."""

import pathlib

import numpy as np

from tflm.optimizers import find_averaged_optimizer, start_finetune
from zoo.errors import UserError
from zoo.models.saving import load_model_file
from zoo.models.transfer import transfer_weights
from zoo.models.vocabulary import check_model_vocabulary
from zoo.runs import run_outputs


def check_init_model(path, model, vocabulary, what="--init-from"):
    """Copy the weights of the saved model `path` into `model`, after checking that it was
    made with the same vocabulary (size, and words when a vocab.txt lies beside it:
    `zoo.models.vocabulary`). Its head may differ from `model`'s (a NeuralODE head on a
    pre-trained softmax model): `zoo.models.transfer.transfer_weights`. `what` names the
    file's flag in an error (a missing, truncated or corrupt file: `UserError`)."""
    src = load_model_file(path, what)  # missing, truncated, corrupt: one line
    size = getattr(src, "vocab_size", None)
    if size is None:
        raise UserError(f"--init-from {path}: not a zoo language model (no vocab_size).")
    check_model_vocabulary(path, size, vocabulary)
    fresh = transfer_weights(src, model, source_name=f"--init-from {path}")
    if fresh:
        print(f"--init-from {path}: {type(src.head).__name__} head -> "
              f"{type(model.head).__name__}; at their initialisation: {', '.join(fresh)}")


def set_training_word_counts(model, train_ids, vocab_size):
    """Give the parts of `model` that read the training split's word counts their counts:
    a head trained by importance sampling (`num_samples`) draws its noise words from the
    unigram distribution, as the reference CNF code (Andonov 2019 §6.6.3); FRAGE
    (`model.frage_layer`) calls the most frequent words popular. Both are saved with the
    model, so a resumed run keeps them."""
    sampler = getattr(model.head, "sampler", None)
    if sampler is not None:
        sampler.set_proposal(np.bincount(np.asarray(train_ids), minlength=vocab_size))
    frage = getattr(model, "frage_layer", None)
    if frage is not None:
        frage.set_word_counts(np.bincount(np.asarray(train_ids), minlength=vocab_size))


def load_for_finetune(model, run_dir, vocabulary):
    """Start from RUN_DIR's averaged best model and restart averaging from it."""
    path = pathlib.Path(run_dir) / "best.keras"
    if not path.exists():
        raise UserError(f"--finetune {run_dir}: no best.keras there; finetune a finished or "
                        "checkpointed run directory.")
    check_init_model(path, model, vocabulary, what=f"--finetune {run_dir}:")
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
    run_outputs.save_best(model, out, None)
    return {"epoch": 0, "val_perplexity": float(logs["perplexity"]),
            "val_loss": float(logs["loss"])}
