"""`python -m zoo.evaluate`: the figures of metrics.json reproduced from a saved run, what it
writes, and its one-line errors."""

import json
import shutil

import pytest

from tests.backends import run_in_backend
from zoo import evaluate as ev


def _copy(tiny_run, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    return run


def test_reproduces_the_runs_figures(tiny_run, tmp_path):
    metrics = json.loads((tiny_run / "metrics.json").read_text())
    config = json.loads((tiny_run / "config.json").read_text())
    from zoo.runs.saved_run import open_run
    run = open_run(tiny_run)
    protocol = metrics["evaluation"]  # the synthetic preset tests at batch 10
    test = ev.evaluate(run, "test", batch_size=protocol["test_batch_size"])
    assert test["bptt"] == protocol["bptt"] == config["training"]["bptt"]
    assert test["perplexity"] == pytest.approx(metrics["test_perplexity"], rel=1e-6)
    valid = ev.evaluate(run, "valid", batch_size=protocol["valid_batch_size"])
    assert valid["perplexity"] == pytest.approx(metrics["valid_perplexity"], rel=1e-6)
    one = ev.evaluate(run, "test")  # the default: batch 1, every token after the first
    assert one["batch_size"] == 1 and one["tokens"] == len(run.corpus.split("test")) - 1
    from tools.qmatrix import export_q
    meta = export_q(run.model, run.corpus, "test", tmp_path / "q.npy")  # batch-1 semantics
    assert one["perplexity"] == pytest.approx(meta["perplexity"], rel=1e-5)


def test_command_line_writes_the_result(tiny_run, tmp_path, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    run = _copy(tiny_run, tmp_path)
    assert ev.main([str(run), "--quiet", "--json", str(tmp_path / "r.json")]) == 0
    assert ev.main([str(run / "final.keras"), "--split", "valid", "--batch-size", "4",
                    "--bptt", "7", "--quiet"]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("test perplexity ") and "(batch 1, bptt 10," in printed[0]
    assert printed[1].startswith("valid perplexity ") and "(batch 4, bptt 7," in printed[1]
    entries = json.loads((run / ev.EVALUATIONS_FILE).read_text())
    assert [(e["split"], e["batch_size"], e["bptt"]) for e in entries] == [
        ("test", 1, 10), ("valid", 4, 7)]
    assert entries[1]["model"].endswith("final.keras")
    assert json.loads((tmp_path / "r.json").read_text()) == entries[0]
    acc = EventAccumulator(str(run / "logs" / "evaluation"))
    acc.Reload()
    assert {"evaluate/test_perplexity", "evaluate/valid_perplexity"} <= set(
        acc.Tags()["tensors"])


def _one_line_error(capsys, argv, message):
    assert ev.main([*argv, "--quiet"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("zoo.evaluate: error: ") and message in err[0], err


def test_bad_input_is_a_one_line_error_and_changes_nothing(tiny_run, tmp_path, capsys):
    run = _copy(tiny_run, tmp_path)
    _one_line_error(capsys, [str(tmp_path / "missing")], "no such run directory")
    empty = tmp_path / "empty"
    empty.mkdir()
    _one_line_error(capsys, [str(empty)], "has no best.keras")
    words = (run / "vocab.txt").read_text().splitlines()
    words[3], words[4] = words[4], words[3]
    (run / "vocab.txt").write_text("\n".join(words) + "\n")
    _one_line_error(capsys, [str(run)], "first difference at id 3")
    _one_line_error(capsys, [str(tiny_run), "--batch-size", "600"], "needs at least 1200")
    lone = tmp_path / "lone"
    lone.mkdir()
    shutil.copy(tiny_run / "best.keras", lone / "best.keras")
    _one_line_error(capsys, [str(lone)], "name the corpus it was trained on with --corpus")
    broken = tmp_path / "broken"
    shutil.copytree(tiny_run, broken)
    (broken / "best.keras").write_bytes((tiny_run / "best.keras").read_bytes()[:500])
    _one_line_error(capsys, [str(broken)], "unreadable as a Keras model")
    assert not (run / ev.EVALUATIONS_FILE).exists()
    assert (broken / "best.keras").stat().st_size == 500


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_other_backends_reproduce_the_figures(tiny_run, backend):
    out = run_in_backend(backend, f"""
        from zoo.evaluate import evaluate
        from zoo.runs.saved_run import open_run
        print("PPL", evaluate(open_run({str(tiny_run)!r}), "test", 10)["perplexity"])
    """)
    metrics = json.loads((tiny_run / "metrics.json").read_text())
    assert float(out.split("PPL")[1]) == pytest.approx(metrics["test_perplexity"], rel=1e-5)
