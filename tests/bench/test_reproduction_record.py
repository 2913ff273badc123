"""The record of reproductions (`python -m bench.reproductions.record`): one entry per run
(finished or partway), the page written from the record alone, and a command that
reproduces the run's configuration."""

import json
import shlex
import shutil

from bench.reproductions import record
from tests.conftest import TINY_RUN_FLAGS
from zoo.runs.config import resolve_config


def test_a_finished_and_a_partial_run_are_recorded_as_such(tiny_run, tmp_path):
    partial = tmp_path / "partial"
    shutil.copytree(tiny_run, partial)
    (partial / "metrics.json").unlink()  # killed after its checkpoint, before its results
    config = json.loads((partial / "config.json").read_text())
    config["training"]["epochs"] = 5  # the schedule had 5 epochs; 1 was done
    (partial / "config.json").write_text(json.dumps(config))
    path = tmp_path / "record.json"
    assert record.main([str(tiny_run), "--record", str(path), "--hardware", "test box"]) == 0
    assert record.main([str(partial), "--record", str(path), "--hardware", "other box"]) == 0
    entries = json.loads(path.read_text())
    assert [(e["hardware"], e["complete"], e["epochs_run"], e["epochs_total"])
            for e in entries] == [("test box", True, 1, 1), ("other box", False, 1, 5)]
    metrics = json.loads((tiny_run / "metrics.json").read_text())
    done, cut = entries
    assert done["valid"] == metrics["valid_perplexity"]
    assert done["test"] == metrics["test_perplexity"]
    assert done["backend"] == metrics["backend"] == "tensorflow"
    assert cut["test"] is None and cut["valid"] == metrics["history"][0]["val_perplexity"]
    page = (tmp_path / "record.md").read_text()
    assert "| 1 of 1 |" in page and "| partial: 1 of 5 |" in page
    assert (tmp_path / "record_synthetic.png").stat().st_size > 0
    # a run recorded again replaces its entry; the page is rewritten from the record
    assert record.main([str(tiny_run), "--record", str(path), "--hardware", "test box"]) == 0
    assert len(json.loads(path.read_text())) == 2


def test_the_recorded_command_resolves_to_the_run_configuration(tiny_run):
    config = json.loads((tiny_run / "config.json").read_text())
    words = shlex.split(record.train_command(config))
    assert words[:5] == ["python", "-m", "zoo.train", "--preset", "synthetic"]
    sets = [words[i + 1] for i, w in enumerate(words) if w == "--set"]
    flags = dict(zip(words[5::2], words[6::2]))
    again = resolve_config("synthetic", sets, epochs=int(flags["--epochs"]),
                           seed=int(flags["--seed"]))
    for section in ("corpus", "model", "training"):
        assert again[section] == config[section]
    assert "--batch-size" in TINY_RUN_FLAGS  # the fixture set it: the command carries it
    assert "training.batch_size=8" in sets


def test_the_readme_quotes_the_record():
    """Every finished run in the record has its figures in the README's "Reproducing the
    papers" section, as the record holds them (numbers only from runs that were made)."""
    from tests.conftest import REPO
    entries = json.loads(record.RECORD.read_text())
    readme = (REPO / "README.md").read_text()
    section = readme[readme.index("## Reproducing the papers"):]
    finished = [e for e in entries if e["complete"]]
    assert finished
    for e in finished:
        assert f"`{e['preset']}` ({e['epochs_run']} of {e['epochs_total']} epochs" in section
        assert f"{e['valid']:.2f}" in section and f"{e['test']:.2f}" in section
