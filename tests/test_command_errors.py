"""Every command line meets bad input with one line on stderr and exit status 2, never a
traceback (`zoo.runtime.user_errors`), before it writes anything; a result computed before
a late failure is printed, not lost. Driven in-process (`main([...])`) where possible."""

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO, TINY_RUN_FLAGS, without_native_log_lines


def _one_line(capsys, code, *fragments):
    """The command's stderr: exactly one line, no traceback, exit status 2, holding every
    fragment. Returns (that line, stdout)."""
    captured = capsys.readouterr()
    err = without_native_log_lines(captured.err).strip()
    assert code == 2, (code, err)
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for fragment in fragments:
        assert fragment in err, err
    return err, captured.out


@pytest.fixture(scope="module")
def bad_files(tiny_run, tmp_path_factory):
    """A truncated and a bit-flipped copy of a run's best.keras, a malformed preset, a run
    folder whose config.json is malformed, and a plain file where a folder is expected."""
    folder = tmp_path_factory.mktemp("bad")
    data = (tiny_run / "best.keras").read_bytes()
    (folder / "truncated.keras").write_bytes(data[:len(data) // 2])
    flipped = bytearray(data)
    for i in range(len(data) // 2, len(data) // 2 + 64):
        flipped[i] ^= 0xFF
    (folder / "flipped.keras").write_bytes(bytes(flipped))
    (folder / "bad.json").write_text('{"corpus": {"name": "synthetic",')
    (folder / "list.json").write_text('["corpus"]')
    (folder / "a_file").write_text("not a folder")
    broken_run = folder / "broken_run"
    broken_run.mkdir()
    (broken_run / "config.json").write_text("{not json")
    (broken_run / "best.keras").write_bytes(data)
    return folder


# --- zoo.train -------------------------------------------------------------------------

@pytest.mark.parametrize("args, fragments", [
    (["--init-from", "{bad}/missing.keras"], ["--init-from", "missing.keras: no such file"]),
    (["--init-from", "{bad}/truncated.keras"], ["unreadable as a Keras model (truncated or "
                                                "corrupt: not a complete .keras zip"]),
    (["--init-from", "{bad}/flipped.keras"], ["flipped.keras is unreadable as a Keras model"]),
    (["--init-from", "{bad}"], ["is a folder, not a .keras model file"]),
    (["--preset", "{bad}/bad.json"], ["bad.json is not valid JSON", "line 1 column 33"]),
    (["--preset", "{bad}/list.json"], ["holds a JSON list, not an object"]),
    (["--set", "training.epoch=1"], ["unknown setting training.epoch; did you mean "
                                     "training.epochs?"]),
    (["--set", "training.lrr=3"], ["did you mean training.lr?"]),
    (["--set", "corpus.max_train_token=100"], ["did you mean corpus.max_train_tokens?"]),
    (["--set", "model.hidden_dim=2.5"], ["model.hidden_dim must be an integer; got 2.5."]),
    (["--set", "model.hidden_dim=big"], ["model.hidden_dim must be an integer; got 'big'."]),
])
def test_zoo_train_refuses_bad_input_in_one_line(args, fragments, bad_files, tmp_path,
                                                 capsys):
    from zoo import train
    out = tmp_path / "runs" / "r"
    args = [a.replace("{bad}", str(bad_files)) for a in args]
    code = train.main(["--epochs", "1", "--out", str(out), *TINY_RUN_FLAGS, *args])
    _one_line(capsys, code, "zoo.train: error: ", *fragments)
    assert not (tmp_path / "runs").exists(), "nothing may be written"


def test_zoo_train_refuses_an_out_it_cannot_make(bad_files, capsys):
    from zoo import train
    code = train.main(["--epochs", "1", "--out", str(bad_files / "a_file" / "run"),
                       *TINY_RUN_FLAGS])
    _one_line(capsys, code, "--out", "a_file is a file, not a folder; choose another place")


def test_zoo_train_refuses_a_finetune_run_with_a_malformed_config(bad_files, tmp_path,
                                                                  capsys):
    from zoo import train
    code = train.main(["--finetune", str(bad_files / "broken_run"), "--out",
                       str(tmp_path / "tuned"), "--quiet"])
    _one_line(capsys, code, "config.json is not valid JSON")
    assert not (tmp_path / "tuned").exists()


def test_a_command_line_process_exits_2_with_one_line(tmp_path):
    # The real process: start-up noise filtered, run_command's exit status.
    out = tmp_path / "r"
    proc = subprocess.run([sys.executable, "-m", "zoo.train", "--out", str(out), "--set",
                           "training.epoch=1"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300, env=dict(os.environ, PYTHONPATH=str(REPO)))
    err = without_native_log_lines(proc.stderr).strip()
    assert proc.returncode == 2, proc.stderr
    assert err == ("zoo.train: error: unknown setting training.epoch; did you mean "
                   "training.epochs?"), proc.stderr
    assert not out.exists()


# --- the evaluation commands -------------------------------------------------------------

@pytest.mark.parametrize("module", ["evaluate", "dynamic_eval", "cache_pointer"])
def test_a_json_into_a_missing_folder_is_refused_before_the_pass(module, tiny_run, tmp_path,
                                                                 capsys, monkeypatch):
    import importlib
    command = importlib.import_module(f"zoo.{module}")
    monkeypatch.setattr("zoo.runs.saved_run.open_run", lambda *a, **k: pytest.fail(
        "the model was opened before --json was checked"))
    code = command.main([str(tiny_run), "--quiet", "--json", str(tmp_path / "no" / "r.json")])
    _one_line(capsys, code, f"zoo.{module}: error: --json", "there is no folder")


@pytest.mark.parametrize("module", ["evaluate", "dynamic_eval", "cache_pointer", "generate"])
@pytest.mark.parametrize("name, fragment", [("truncated.keras", "(truncated or corrupt"),
                                            ("flipped.keras", "unreadable as a Keras model")])
def test_a_damaged_model_is_named_in_one_line(module, name, fragment, bad_files, capsys):
    import importlib
    command = importlib.import_module(f"zoo.{module}")
    args = [str(bad_files / name), "--corpus", "ptb"] if module != "generate" else \
        [str(bad_files / name)]
    code = command.main([*args, "--quiet"] if module != "generate" else args)
    err, _ = _one_line(capsys, code, fragment, name)
    assert "File not found" not in err


def test_a_result_computed_before_a_late_failure_is_printed(tiny_run, tmp_path, capsys,
                                                            monkeypatch):
    import shutil

    from zoo import evaluate as ev
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    folder = tmp_path / "results"
    folder.mkdir()
    evaluate = ev.evaluate

    def evaluate_then_lose_the_folder(*args, **kwargs):
        result = evaluate(*args, **kwargs)
        folder.rmdir()  # the --json folder vanishes during the pass
        return result

    monkeypatch.setattr(ev, "evaluate", evaluate_then_lose_the_folder)
    code = ev.main([str(run), "--quiet", "--json", str(folder / "r.json")])
    _, out = _one_line(capsys, code, "zoo.evaluate: error: ", "r.json")
    assert "test perplexity" in out, "the result must be printed before the failure"
    assert json.loads((run / "evaluations.json").read_text())[-1]["split"] == "test"


def test_zoo_search_refuses_an_out_it_cannot_make(bad_files, capsys):
    from zoo import search
    code = search.main(["--preset", "synthetic", "--space", "zhang2018_mos", "--trials", "1",
                        "--out", str(bad_files / "a_file" / "search")])
    _one_line(capsys, code, "zoo.search: error: --out", "is a file, not a folder")


# --- tools -------------------------------------------------------------------------------

def test_qmatrix_takes_a_run_directory(tiny_run, tmp_path, capsys):
    from tools import qmatrix
    out = tmp_path / "q" / "q.npy"
    assert qmatrix.main([str(tiny_run), "--corpus", "run", "--out", str(out)]) == 0
    meta = json.loads(capsys.readouterr().out)  # no progress bar when stdout is no terminal
    assert out.exists() and meta["shape"][1] == 40


@pytest.mark.parametrize("target, args, fragments", [
    ("{bad}/flipped.keras", [], ["tools.qmatrix: error: the model", "flipped.keras is "
                                 "unreadable as a Keras model (corrupt: "]),
    ("{bad}/truncated.keras", [], ["truncated.keras is unreadable as a Keras model (truncated "
                                   "or corrupt"]),
    ("{bad}/missing.keras", [], ["no such run directory or model file"]),
    ("{run}", ["--bptt", "0"], ["--bptt must be >= 1; got 0."]),
    ("{run}", ["--out", "{bad}/a_file/q.npy"], ["--out", "is a file, not a folder"]),
    ("{run}", ["--out", "{bad}"], ["it is a folder; name the .npy file"]),
])
def test_qmatrix_refuses_bad_input_in_one_line(target, args, fragments, tiny_run, bad_files,
                                               tmp_path, capsys):
    from tools import qmatrix

    def fill(text):
        return text.replace("{bad}", str(bad_files)).replace("{run}", str(tiny_run))
    args = ["--out", str(tmp_path / "q.npy"), *args]  # a later --out wins
    code = qmatrix.main([fill(target), "--corpus", "run", *map(fill, args)])
    _one_line(capsys, code, *map(fill, fragments))
    assert not (tmp_path / "q.npy").exists()


def test_qmatrix_corpus_run_needs_the_runs_config(tiny_run, tmp_path, capsys):
    import shutil

    from tools import qmatrix
    lone = tmp_path / "lone"
    lone.mkdir()
    shutil.copy(tiny_run / "best.keras", lone / "best.keras")
    code = qmatrix.main([str(lone), "--corpus", "run", "--out", str(tmp_path / "q.npy")])
    _one_line(capsys, code, "--corpus run reads the run's corpus from", "does not exist")


def test_rank_refuses_bad_input_in_one_line(bad_files, tmp_path, capsys):
    import numpy as np

    from tools import rank
    _one_line(capsys, rank.main([str(tmp_path / "missing.npy")]), "tools.rank: error: ")
    q = tmp_path / "q.npy"
    np.save(q, np.log(np.random.default_rng(0).dirichlet(np.ones(5), 20)).astype("float32"))
    _one_line(capsys, rank.main([str(q), "--json", str(bad_files / "a_file" / "r.json")]),
              "--json", "is a file, not a folder")
    _one_line(capsys, rank.main([str(q), "--json", str(tmp_path)]), "it is a folder")


def test_the_other_tools_refuse_bad_input_in_one_line(bad_files, tmp_path, capsys):
    from tools import bottleneck_demo, embeddings, noise_robustness
    from tools.frameworks import compare
    _one_line(capsys, embeddings.main([str(bad_files / "truncated.keras"), "--out",
                                       str(tmp_path / "e")]), "tools.embeddings: error: ",
              "(truncated or corrupt")
    _one_line(capsys, noise_robustness.main(["--synthetic", "--out",
                                             str(bad_files / "a_file" / "n")]),
              "tools.noise_robustness: error: --out")
    _one_line(capsys, bottleneck_demo.main(["--epochs", "0"]), "--epochs must be >= 1")
    _one_line(capsys, compare.main(["--preset", "synthetic", "--backends", "tensorflow",
                                    "--out", str(bad_files / "a_file" / "cmp")]),
              "compare_frameworks: error: --out", "is a file, not a folder")
    _one_line(capsys, compare.main(["--preset", str(bad_files / "bad.json"), "--backends",
                                    "tensorflow", "--out", str(tmp_path / "cmp")]),
              "is not valid JSON")
