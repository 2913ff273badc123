"""The training settings every runner reads, and the comparison's window rule.

Read from the resolved configuration through `zoo.runs.settings` (`python -m zoo.train`'s
defaults and checks); no framework is imported here, so the native peer's runner reads them
without Keras.
"""

from zoo.runs.settings import RunSettings


def training_settings(config):
    """The training fields every runner needs (a JSON-able dict), as `python -m zoo.train`
    reads them from `config`."""
    settings = RunSettings.from_config(config)
    training, model = settings.training, settings.model
    return {
        "batch_size": training.batch_size, "eval_batch_size": training.eval_batch_size,
        "bptt": training.bptt, "lr": float(training.lr), "clip_norm": training.clip_norm,
        "weight_decay": float(training.weight_decay), "seed": training.seed,
        "max_len": training.max_seq_len,
        # the PTB tutorial's semantics (`zoo.ZarembaLSTM`'s defaults when its preset is one)
        "fixed_windows": training.fixed_windows, "loss_reduction": training.loss_reduction,
        "scale_by_window": bool(model.arguments.get("scale_by_window",
                                                    model.kind != "zaremba")),
    }


def window_rule(spec, settings, epoch):
    """The `tflm.data` window arguments of one training epoch of the comparison."""
    return {"train": (spec.get("window_lengths", "variable") == "variable"
                      and not settings.get("fixed_windows", False)),
            "seed": settings["seed"], "epoch": epoch, "max_len": settings["max_len"]}
