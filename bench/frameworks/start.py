"""The same start for every backend: the data, its windows and the initial weights.

One process (a Keras backend, TensorFlow when installed) loads the corpus the preset names
(`zoo.corpora`), batchifies it, cuts the windows of every epoch with
`tflm.data.window_starts` (the rule `lm_windows` and `lm_dataset` follow), builds the
preset's model (`zoo.builders`) and saves its weights by role (`bench.frameworks.roles`)
and the data as .npz files. The runners load those files, so every backend sees the same
weights and the same windows in the same order.
"""

import numpy as np


def training_settings(config):
    """The training fields every runner needs, with `python -m zoo.train`'s defaults."""
    training = config["training"]
    return {
        "batch_size": int(training.get("batch_size", 20)),
        "eval_batch_size": int(training.get("eval_batch_size", 10)),
        "bptt": int(training.get("bptt", 70)),
        "lr": float(training.get("lr", 30.0)),
        "clip_norm": training.get("clip_norm", 0.25),
        "weight_decay": float(training.get("weight_decay", 0.0)),
        "seed": int(training.get("seed", 0)),
        "max_len": training.get("max_seq_len"),
        # the PTB tutorial's semantics (`zoo.ZarembaLSTM`'s defaults when its preset is one)
        "fixed_windows": bool(training.get("fixed_windows", False)),
        "loss_reduction": training.get("loss_reduction", "token_mean"),
        "scale_by_window": bool(config["model"].get(
            "scale_by_window", config["model"].get("kind") != "zaremba")),
    }


def window_rule(spec, settings, epoch):
    """The `tflm.data` window arguments of one training epoch of the comparison."""
    return {"train": (spec.get("window_lengths", "variable") == "variable"
                      and not settings.get("fixed_windows", False)),
            "seed": settings["seed"], "epoch": epoch, "max_len": settings["max_len"]}


def make_start(spec):
    """Write the shared data (`spec["data_path"]`) and initial weights
    (`spec["weights_path"]`); returns the `init` result."""
    import keras

    from bench.frameworks.roles import export_keras_roles
    from tflm import data
    from zoo.builders import build_model
    from zoo.corpora import load_data

    config = spec["config"]
    s = training_settings(config)
    corpus, optimal = load_data(config["corpus"], spec.get("data_dir"))
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
    model = build_model(config, vocab_size)
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
