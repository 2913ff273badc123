"""What a preset's `model` part means before any family is imported: the family a part
without `kind` names, and the `training` fields a model owns (its constructor takes them:
the step's bptt scaling, clipping, weight decay, seed, flooding, loss reduction). Read by
the run settings (`zoo.runs.settings`) and by `from_preset` with a preset name
(`zoo.models.preset_folder`), so both build the same model from a preset."""

DEFAULT_KIND = "awd_lstm"
MODEL_OWNED_TRAINING = ("bptt", "clip_norm", "weight_decay", "seed", "flooding_level",
                        "loss_reduction")
