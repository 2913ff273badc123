"""A trial's run folder as a killed worker leaves it, for the engine's resume tests."""

import pytest


def kill_after_first_checkpoint(monkeypatch, name, config, path):
    """Run `zoo.studies.engine.train_trial` for trial `name` in-process, its worker dying
    right after the first epoch checkpoint is written: `path` then holds that checkpoint
    and no results."""
    from zoo.runs import checkpoint
    from zoo.studies import engine
    save = checkpoint.save_checkpoint

    def save_then_stop(*args, **kwargs):
        save(*args, **kwargs)
        raise RuntimeError("the worker died")

    with monkeypatch.context() as patch:
        patch.setattr(checkpoint, "save_checkpoint", save_then_stop)
        with pytest.raises(RuntimeError, match="worker died"):
            engine.train_trial({"trial": name}, {name: (config, str(path))}, None)
