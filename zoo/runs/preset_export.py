"""A finished run's best model as a KerasHub-style preset folder (`python -m zoo.train
--export-preset DIR`), with the run's provenance in its metadata.json:

    preset, command, backend, corpus (name, vocabulary size, `corpus_sha256`: the token
    ids the run read), epochs (run / of the schedule), best_epoch, valid_perplexity,
    test_perplexity (and bpc for a character corpus), published (the preset's figures)

Load it with `zoo.AWDLSTM.from_preset(DIR)` (or the class of its family): the weights,
`model.vocabulary` and `model.preset_metadata` (`zoo.models.preset_folder`).
"""

import json
import pathlib

from zoo.models import preset_folder
from zoo.models.saving import load_model
from zoo.models.vocabulary import VOCAB_FILE

METRIC_KEYS = ("best_epoch", "valid_perplexity", "test_perplexity", "valid_bpc", "test_bpc",
               "backend", "corpus_sha256")


def check_target(path):
    """`UserError` now, before a run trains for hours, when `path` cannot become a preset
    folder (a file, or a folder holding something else): `preset_folder.check_target`."""
    preset_folder.check_target(path, "--export-preset ")


def provenance(run_dir, command=None):
    """metadata.json's entries for the run in `run_dir` (its config.json and metrics.json)."""
    run_dir = pathlib.Path(run_dir)
    config = json.loads((run_dir / "config.json").read_text(encoding="utf-8"))
    metrics = json.loads((run_dir / "metrics.json").read_text(encoding="utf-8"))
    corpus = config.get("corpus", {})
    entries = {"preset": config.get("preset"), "command": command,
               "corpus": {"name": corpus.get("name"), "vocabulary_size": metrics.get("vocab_size")},
               "epochs": {"run": len(metrics.get("history", [])),
                          "of": config.get("training", {}).get("epochs")},
               "published": config.get("published")}
    entries.update({k: metrics[k] for k in METRIC_KEYS if k in metrics})
    if "corpus_sha256" in entries:
        entries["corpus"]["sha256"] = entries.pop("corpus_sha256")
    return {k: v for k, v in entries.items() if v is not None}


def export_run(run_dir, preset_dir, command=None):
    """Write RUN_DIR's best.keras with its vocab.txt and `provenance` as a preset folder;
    returns the model's class name."""
    run_dir = pathlib.Path(run_dir)
    model = load_model(run_dir / "best.keras")
    words = (run_dir / VOCAB_FILE).read_text(encoding="utf-8").splitlines()
    preset_folder.save_to_preset(model, preset_dir, vocabulary=words,
                                 metadata=provenance(run_dir, command))
    return type(model).__name__
