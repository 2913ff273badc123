"""tools.qmatrix.export_q: rows, perplexity equal to evaluate, bounded streaming, errors."""

import json

import numpy as np
import pytest

from tests import peak_rss
from tests.conftest import REPO
from tflm import data
from tflm.data.vocabulary import Vocabulary
from tools.qmatrix import VocabularyMismatchError, export_q, main
from zoo.models.awd_lstm.awd_lstm_lm import AWDLSTM


@pytest.fixture(scope="module")
def corpus():
    lang = data.synthetic.markov_language(30, seed=3)
    return lang.to_corpus(train_tokens=500, valid_tokens=300, test_tokens=257, seed=4)


def _model(vocab=30):
    m = AWDLSTM(vocab, embed_dim=6, hidden_dim=10, num_layers=2, seed=0)
    m.compile(optimizer="sgd")
    return m


def test_export_rows_and_perplexity_equal_evaluate_at_batch_1(corpus, tmp_path):
    model = _model()
    meta = export_q(model, corpus, "test", tmp_path / "q.npy", bptt=20)
    q = np.load(tmp_path / "q.npy", mmap_mode="r")
    assert q.shape == (256, 30) and q.dtype == np.float32
    np.testing.assert_allclose(np.exp(q).sum(1), 1.0, atol=1e-5)
    ds = data.lm_dataset(corpus.test, 1, 20, train=False)
    ppl = model.evaluate(ds, verbose=0, return_dict=True)["perplexity"]
    assert meta["perplexity"] == pytest.approx(ppl, rel=1e-5)
    side = json.loads((tmp_path / "q.npy.json").read_text())
    assert side["shape"] == [256, 30] and side["split"] == "test"
    # Rows do not depend on the window length (state is carried across windows).
    export_q(model, corpus, "test", tmp_path / "q7.npy", bptt=7)
    np.testing.assert_allclose(np.load(tmp_path / "q7.npy"), q, atol=1e-5)


def test_export_max_rows_and_dtype(corpus, tmp_path):
    meta = export_q(_model(), corpus, "valid", tmp_path / "q.npy", max_rows=50, dtype="float64")
    q = np.load(tmp_path / "q.npy")
    assert q.shape == (50, 30) and q.dtype == np.float64 and meta["shape"] == [50, 30]
    assert not (tmp_path / "q.npy.partial").exists()


def test_vocabulary_mismatch_is_a_clear_error(corpus, tmp_path):
    with pytest.raises(VocabularyMismatchError, match="31 words.*30"):
        export_q(_model(31), corpus, "test", tmp_path / "q.npy")
    assert not (tmp_path / "q.npy").exists()


def test_cli_exports_a_saved_model(corpus, tmp_path, capsys):
    model = _model()
    model.build()
    path = tmp_path / "m.keras"
    model.save(path)
    corpus_dir = corpus.language.write(tmp_path / "corpus", train_tokens=400, valid_tokens=100,
                                       test_tokens=120, seed=1)
    code = main([str(path), "--corpus", str(corpus_dir), "--split", "test",
                 "--out", str(tmp_path / "cli.npy")])
    assert code == 0
    assert np.load(tmp_path / "cli.npy").shape == (119, 30)
    code = main([str(path), "--corpus", str(tmp_path / "missing"), "--out", str(tmp_path / "x.npy")])
    assert code == 2 and "error" in capsys.readouterr().err


def test_cli_refuses_a_corpus_with_the_model_size_but_another_word_order(corpus, tmp_path,
                                                                          capsys):
    """The run's vocab.txt beside the model is compared word by word: a permuted corpus
    vocabulary (same size) is refused before any row is written."""
    from tflm.data import load_corpus
    corpus_dir = corpus.language.write(tmp_path / "corpus", train_tokens=400, valid_tokens=100,
                                       test_tokens=120, seed=1)
    words = list(load_corpus(str(corpus_dir)).vocabulary)
    model = _model(len(words))
    model.build()
    run = tmp_path / "run"
    run.mkdir()
    model.save(run / "best.keras")
    args = [str(run / "best.keras"), "--corpus", str(corpus_dir), "--split", "test"]
    assert main(args + ["--out", str(tmp_path / "none.npy")]) == 0
    assert "only the vocabulary size was checked" in capsys.readouterr().err
    (run / "vocab.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
    assert main(args + ["--out", str(tmp_path / "same.npy")]) == 0
    assert "warning" not in capsys.readouterr().err
    permuted = words[1:2] + words[:1] + words[2:]
    (run / "vocab.txt").write_text("\n".join(permuted) + "\n", encoding="utf-8")
    assert main(args + ["--out", str(tmp_path / "permuted.npy")]) == 2
    err = capsys.readouterr().err
    assert "first difference at id 0" in err and repr(permuted[0]) in err
    assert not (tmp_path / "permuted.npy").exists()


EXPORT_ON_BACKEND = '''
import tempfile, pathlib
import numpy as np
from tflm import backends, data
from tools.qmatrix import export_q
from zoo.models.awd_lstm.awd_lstm_lm import AWDLSTM
from keras.ops import convert_to_numpy as to_np
lang = data.synthetic.markov_language(30, seed=3)
corpus = lang.to_corpus(train_tokens=500, valid_tokens=300, test_tokens=257, seed=4)
model = AWDLSTM(30, embed_dim=6, hidden_dim=10, num_layers=2, seed=0)
model.build()
ids = np.asarray(corpus.test, np.int32)
# The compiled window forward equals the eager one, state carried across windows.
fast, slow = None, None
for start, length in ((0, 20), (20, 20), (40, 7)):
    x = ids[None, start:start + length]
    a, fast = backends.current().window_log_probs(model, x, fast)
    b, slow = model.forward_with_state(x, slow, training=False)
    np.testing.assert_allclose(to_np(a), to_np(b), atol=1e-5)
# The export's rows are the eager forward's over the whole split at once.
out = pathlib.Path(tempfile.mkdtemp()) / "q.npy"
meta = export_q(model, corpus, "test", out, bptt=20)
full, _ = model.forward_with_state(ids[None, :-1], None, training=False)
full = to_np(full)[0]
np.testing.assert_allclose(np.load(out), full, atol=1e-5)
nll = -full[np.arange(len(ids) - 1), ids[1:]].mean()
assert abs(meta["perplexity"] / np.exp(nll) - 1) < 1e-5
print("ok")
'''


@pytest.mark.parametrize("backend", ["jax", "torch"])
def test_export_on_other_backends_equals_the_eager_forward(backend):
    from tests.backends import run_in_backend
    assert run_in_backend(backend, EXPORT_ON_BACKEND).split()[-1] == "ok"


_EXPORT_RSS_SNIPPET = """
import json, sys, numpy as np
from tflm import data
from tflm.data.vocabulary import Vocabulary
from tools.qmatrix import export_q
from zoo.models.awd_lstm.awd_lstm_lm import AWDLSTM
""" + peak_rss.HELPERS + """
V, rows = 20_000, 2_100
ids = np.random.default_rng(0).integers(0, V, rows + 1)
corpus = data.Corpus(Vocabulary(f"w{i}" for i in range(V)), test=ids, name="wide")
model = AWDLSTM(V, embed_dim=4, hidden_dim=6, num_layers=1, seed=0)
export_q(model, corpus, "test", sys.argv[1] + "/warm.npy", max_rows=140)  # traces, warm-up
base = reset_peak()
export_q(model, corpus, "test", sys.argv[1] + "/q.npy")
growth = status("VmHWM") - base
base = reset_peak()
whole = np.load(sys.argv[1] + "/q.npy")  # control: the measurement does see a full load
control = status("VmHWM") - base
print(json.dumps({"growth_mib": growth, "control_mib": control, "shape": whole.shape}))
"""


def test_export_memory_stays_at_a_few_windows_whatever_the_matrix_size(tmp_path):
    """A 168 MB Q (2,100 x 20,000 float32) exported in 70-row windows (11 MB each as
    float64): rows written through a memmap stayed resident (19.3 GB of RSS for WikiText-2's
    32.7 GB matrix); written to the file they must not."""
    import os
    import subprocess
    import sys
    import textwrap
    if not os.path.exists("/proc/self/clear_refs"):
        pytest.skip("needs Linux /proc to measure a process's own peak memory")
    repo = REPO
    env = dict(os.environ, PYTHONPATH=str(repo), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent(_EXPORT_RSS_SNIPPET),
                           str(tmp_path)], cwd=repo, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["shape"] == [2_100, 20_000]
    assert out["control_mib"] > 150, out  # loading all 160 MiB is visible
    assert out["growth_mib"] < 80, out


def _windows_against_eager(model, ids, windows=((0, 20), (20, 20), (40, 7))):
    """The backend's window forward against the eager forward, state carried across."""
    from keras.ops import convert_to_numpy as to_np

    from tflm import backends
    fast = slow = None
    for start, length in windows:
        x = ids[None, start:start + length]
        a, fast = backends.current().window_log_probs(model, x, fast)
        b, slow = model.forward_with_state(x, slow, training=False)
        np.testing.assert_allclose(to_np(a), to_np(b), rtol=1e-5, atol=2e-5)
        for (h, c), (h2, c2) in zip(fast, slow):
            np.testing.assert_allclose(to_np(h), to_np(h2), atol=2e-5)
            np.testing.assert_allclose(to_np(c), to_np(c2), atol=2e-5)


@pytest.mark.parametrize("head", __import__("zoo.models.heads", fromlist=["x"]).head_names())
def test_tensorflow_window_forward_equals_the_eager_forward_for_every_head(corpus, head):
    """TensorFlow compiles the export's window forward with XLA where it can (and falls
    back to the graph function where it cannot); either way every head's rows and final
    states are the eager forward's."""
    import keras
    if keras.backend.backend() != "tensorflow":
        pytest.skip("the other backends: test_export_on_other_backends_equals_the_eager_forward")
    spec = {"type": head}
    if head in ("mos", "moc"):
        spec["num_experts"] = 3
    if head == "doc":
        spec["num_components_per_layer"] = [2, 3]
    model = AWDLSTM(30, embed_dim=6, hidden_dim=10, num_layers=2, seed=0, head=spec)
    model.build()
    rng = np.random.default_rng(1)
    for w in model.weights:  # far from a fresh model's near-uniform rows
        w.assign(rng.normal(0, 0.5, w.shape).astype(w.dtype))
    _windows_against_eager(model, np.asarray(corpus.test, np.int32))


def test_tensorflow_window_forward_falls_back_where_xla_cannot_compile(corpus):
    """A forward with an op XLA does not know (a Python function) is exported through the
    plain graph function, with the same rows."""
    import keras
    import tensorflow as tf
    if keras.backend.backend() != "tensorflow":
        pytest.skip("XLA fallback is TensorFlow's")
    model = _model()
    model.build()
    plain = model.forward_with_state

    def with_python_op(tokens, states=None, training=False, targets=None):
        log_probs, new_states = plain(tokens, states, training=training)
        through = tf.py_function(lambda t: t, [log_probs], log_probs.dtype)
        through.set_shape(log_probs.shape)
        return through, new_states

    ids = np.asarray(corpus.test, np.int32)
    reference = [plain(ids[None, :20], None, training=False)[0]]
    model.forward_with_state = with_python_op
    from keras.ops import convert_to_numpy as to_np

    from tflm import backends
    log_probs, _ = backends.current().window_log_probs(model, ids[None, :20], None)
    np.testing.assert_allclose(to_np(log_probs), to_np(reference[0]), atol=1e-6)
