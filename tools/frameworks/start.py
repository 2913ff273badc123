"""The same start for every backend: the data, its windows and the initial weights.

One process (a Keras backend, TensorFlow when installed) loads the corpus the preset names
(`zoo.runs.corpora`), batchifies it, cuts the windows of every epoch with
`tflm.data.window_starts` (the rule `lm_windows` and `lm_dataset` follow), builds the
preset's model (`zoo.runs.builders`) and saves its weights by role (`tools.frameworks.roles`)
and the data as .npz files. The runners load those files, so every backend sees the same
weights and the same windows in the same order. Only the `init` worker imports this module.
"""

import keras
import numpy as np

from tflm import data
from tools.frameworks.roles import export_keras_roles
from tools.frameworks.settings import training_settings, window_rule
from zoo.runs.builders import build_model
from zoo.runs.corpora import load_data
from zoo.runs.settings import RunSettings


def make_start(spec):
    """Write the shared data (`spec["data_path"]`) and initial weights
    (`spec["weights_path"]`); returns the `init` result."""
    config = spec["config"]
    settings = RunSettings.from_config(config)
    s = training_settings(config)
    corpus, optimal = load_data(settings.corpus, spec.get("data_dir"))
    vocab_size = len(corpus.vocabulary)
    train = data.batchify(corpus.train, s["batch_size"])
    valid = data.batchify(corpus.valid, s["eval_batch_size"])
    arrays = {"train_streams": train, "valid_streams": valid}
    epochs = max(1, int(spec.get("epochs", 0)))
    for epoch in range(epochs):
        starts, lengths = data.window_starts(train, s["batch_size"], s["bptt"],
                                             **window_rule(spec, s, epoch))
        arrays[f"train_windows_{epoch}"] = np.stack([starts, lengths], 1).astype(np.int64)
    starts, lengths = data.window_starts(valid, s["eval_batch_size"], s["bptt"], train=False)
    arrays["valid_windows"] = np.stack([starts, lengths], 1).astype(np.int64)
    np.savez(spec["data_path"], **arrays)

    keras.utils.set_random_seed(s["seed"])
    model = build_model(settings, vocab_size)
    model.build()
    weights = export_keras_roles(model)
    np.savez(spec["weights_path"], **weights)
    return {"status": "ok", "vocab_size": vocab_size, "optimal_perplexity": optimal,
            "corpus": corpus.name, "params": int(model.count_params()),
            "roles": {k: list(v.shape) for k, v in weights.items()},
            "keras_paths": [v.path for v in model.trainable_weights],
            "train_tokens": int(len(corpus.train)), "valid_tokens": int(len(corpus.valid)),
            "windows_per_epoch": [int(len(arrays[f"train_windows_{e}"]))
                                  for e in range(epochs)],
            "init_backend": keras.backend.backend()}
