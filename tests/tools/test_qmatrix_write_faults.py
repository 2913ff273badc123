"""tools.qmatrix.export_q under write failures: Q and its sidecar are replaced whole or not
at all (a full disk, a Ctrl-C, a broken model at any row), and no partial file stays."""

import errno
import json
import os

import numpy as np
import pytest

from tflm import data
from tools.qmatrix import export_q, main
from zoo.models.awd_lstm.awd_lstm_lm import AWDLSTM
from zoo.runs import atomic_files


@pytest.fixture(scope="module")
def corpus():
    lang = data.synthetic.markov_language(30, seed=3)
    return lang.to_corpus(train_tokens=500, valid_tokens=300, test_tokens=257, seed=4)


def _model():
    model = AWDLSTM(30, embed_dim=6, hidden_dim=10, num_layers=2, seed=0)
    model.compile(optimizer="sgd")
    return model


class _FailingFile:
    """`open` for the export's rows: the `fail_after`-th write raises `error`."""

    def __init__(self, monkeypatch, fail_after, error):
        self.count, self.fail_after, self.error = 0, fail_after, error
        real_open = open

        def failing_open(path, mode="r", *args, **kwargs):
            handle = real_open(path, mode, *args, **kwargs)
            if mode != "r+b":
                return handle
            write = handle.write

            def counted(data):
                self.count += 1
                if self.count == self.fail_after:
                    write(bytes(data)[:len(bytes(data)) // 2])
                    raise self.error
                return write(data)
            handle.write = counted
            return handle

        monkeypatch.setattr("builtins.open", failing_open)


@pytest.mark.parametrize("error", [OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)),
                                   KeyboardInterrupt()])
@pytest.mark.parametrize("fail_after", [1, 3])
def test_a_failed_export_keeps_the_previous_matrix_and_sidecar(corpus, tmp_path, monkeypatch,
                                                               error, fail_after):
    out = tmp_path / "q.npy"
    model = _model()
    export_q(model, corpus, "test", out, bptt=50)
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    assert sorted(before) == ["q.npy", "q.npy.json"]
    with monkeypatch.context() as patch:
        _FailingFile(patch, fail_after, error)
        expected = atomic_files.WriteError if isinstance(error, OSError) else KeyboardInterrupt
        with pytest.raises(expected) as failed:
            export_q(model, corpus, "valid", out, bptt=50)
    if isinstance(error, OSError):
        assert str(failed.value) == (f"cannot write {out} (No space left on device); the "
                                     "previous q.npy is intact; free space (or choose another "
                                     "--out) and export again")
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before
    assert json.loads(before["q.npy.json"])["split"] == "test"


def test_a_broken_model_leaves_no_partial_file(corpus, tmp_path):
    model = _model()
    model.build()
    model.set_weights([np.full_like(w, np.nan) for w in model.get_weights()])
    with pytest.raises(FloatingPointError, match="row 0 of Q"):
        export_q(model, corpus, "test", tmp_path / "q.npy")
    assert list(tmp_path.iterdir()) == []


def test_the_command_line_reports_a_failed_write_in_one_line(corpus, tmp_path, capsys,
                                                             monkeypatch):
    model = _model()
    model.build()
    model.save(tmp_path / "m.keras")
    corpus_dir = corpus.language.write(tmp_path / "corpus", train_tokens=400, valid_tokens=100,
                                       test_tokens=120, seed=1)
    words = data.load_corpus(str(corpus_dir)).vocabulary
    (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
    _FailingFile(monkeypatch, 1, OSError(errno.EFBIG, os.strerror(errno.EFBIG)))
    code = main([str(tmp_path / "m.keras"), "--corpus", str(corpus_dir),
                 "--out", str(tmp_path / "q.npy")])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1, err
    assert err[0] == (f"tools.qmatrix: error: cannot write {tmp_path / 'q.npy'} (File too "
                      "large); no partial file was left; free space (or choose another --out) "
                      "and export again")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus", "m.keras", "vocab.txt"]
