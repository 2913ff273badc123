"""tools.word_similarity: benchmark files, cosine + Spearman rho against NumPy, out-of-vocabulary
pairs, the PTB column of thesis Table 5.2, and the command line on a tiny zoo run."""

import json
import shutil

import numpy as np
import pytest

from tests.conftest import data_dir
from tools import word_similarity as ws
from zoo.errors import UserError


def average_ranks(values):
    """1-based ranks, tied values sharing the mean of their positions (NumPy only)."""
    values = np.asarray(values, dtype=np.float64)
    order = np.argsort(values, kind="stable")
    ranks = np.empty(values.size)
    ranks[order] = np.arange(1, values.size + 1)
    for v in np.unique(values):
        tied = values == v
        ranks[tied] = ranks[tied].mean()
    return ranks


def spearman_reference(x, y):
    """Pearson correlation of the average-rank vectors (thesis eq. 5.1)."""
    rx, ry = average_ranks(x), average_ranks(y)
    rx, ry = rx - rx.mean(), ry - ry.mean()
    return float((rx * ry).sum() / np.sqrt((rx ** 2).sum() * (ry ** 2).sum()))


def cosine_reference(e, a, b):
    return float(e[a] @ e[b] / (np.linalg.norm(e[a]) * np.linalg.norm(e[b])))


# ---------------------------------------------------------------- reading benchmark files

def test_reads_tabs_spaces_blank_lines_and_windows_line_ends(tmp_path):
    path = tmp_path / "EN-TOY-4.txt"
    path.write_bytes(b"tiger\tcat\t7.35\r\n\r\nLove  sex 6.77\n   \n"
                     b"\tbook \t paper\t 7.46\nA b -1e-1\n")
    bench = ws.read_benchmark(path)
    assert bench.name == "EN-TOY-4"
    assert bench.pairs == [("tiger", "cat", 7.35), ("Love", "sex", 6.77),
                           ("book", "paper", 7.46), ("A", "b", -0.1)]


@pytest.mark.parametrize("line, what", [
    ("tiger cat", "expected 3 fields"),
    ("tiger cat 7.3 extra", "expected 3 fields"),
    ("tiger cat high", "is not a finite number"),
    ("tiger cat nan", "is not a finite number"),
])
def test_a_malformed_line_names_the_file_and_line(tmp_path, line, what):
    path = tmp_path / "bad.txt"
    path.write_text(f"a b 1\n\nc d 2\n{line}\ne f 3\n", encoding="utf-8")
    with pytest.raises(UserError) as err:
        ws.read_benchmark(path)
    assert f"{path}:4:" in str(err.value)
    assert what in str(err.value)


def test_a_folder_is_its_txt_files_in_sorted_name_order(tmp_path):
    for name in ("EN-b.txt", "EN-A.txt", "EN-a.txt", "notes.md"):
        (tmp_path / name).write_text("x y 1\n", encoding="utf-8")
    assert [p.name for p in ws.benchmark_files(tmp_path)] == ["EN-A.txt", "EN-a.txt",
                                                               "EN-b.txt"]
    with pytest.raises(UserError, match="does not exist"):
        ws.benchmark_files(tmp_path / "missing")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(UserError, match="no \\*.txt files"):
        ws.benchmark_files(empty)


# ---------------------------------------------------------------- cosine and Spearman rho

@pytest.mark.parametrize("seed", [0, 1, 2])
def test_rho_is_spearman_of_cosines_with_average_ranks_for_ties(seed):
    rng = np.random.default_rng(seed)
    vocab = [f"w{i}" for i in range(30)]
    e = rng.normal(size=(30, 6))
    a, b = rng.integers(0, 30, size=40), rng.integers(0, 30, size=40)
    scores = rng.integers(0, 5, size=40).astype(float)  # many ties among the human scores
    bench = ws.Benchmark("toy", [(vocab[i], vocab[j], s) for i, j, s in zip(a, b, scores)])
    result = ws.evaluate_benchmark(e, vocab, bench)
    cosines = [cosine_reference(e, i, j) for i, j in zip(a, b)]
    np.testing.assert_allclose(ws.cosine_similarities(e, a, b), cosines, rtol=1e-12)
    assert result.pairs == result.scored == 40 and result.not_in_vocabulary == 0
    assert result.rho == pytest.approx(spearman_reference(scores, cosines), abs=1e-12)
    assert result.note is None


def test_spearman_with_ties_on_both_sides_matches_numpy():
    rng = np.random.default_rng(5)
    x, y = rng.integers(0, 4, size=25), rng.integers(0, 3, size=25)
    assert ws.spearman(x, y) == pytest.approx(spearman_reference(x, y), abs=1e-12)
    assert ws.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert np.isnan(ws.spearman([1.0], [2.0])) and np.isnan(ws.spearman([1, 1], [1, 2]))


def test_out_of_vocabulary_pairs_are_skipped_and_counted():
    rng = np.random.default_rng(3)
    vocab = ["a", "b", "c", "d", "e"]
    e = rng.normal(size=(5, 4))
    known = [("A", "b", 3.0), ("c", "D", 1.0), ("a", "e", 2.0), ("b", "d", 5.0)]
    unknown = [("a", "zebra", 9.0), ("Zebra", "b", 0.5), ("x", "y", 4.0)]
    bench = ws.Benchmark("toy", [known[0], unknown[0], known[1], unknown[1], known[2],
                                 unknown[2], known[3]])
    result = ws.evaluate_benchmark(e, vocab, bench)
    assert (result.pairs, result.not_in_vocabulary, result.scored) == (7, 3, 4)
    index = {w: i for i, w in enumerate(vocab)}
    cosines = [cosine_reference(e, index[p.lower()], index[q.lower()]) for p, q, _ in known]
    assert result.rho == pytest.approx(spearman_reference([s for *_, s in known], cosines))


def test_rho_is_zero_when_no_pair_remains():
    result = ws.evaluate_benchmark(np.eye(2), ["a", "b"],
                                   ws.Benchmark("none", [("x", "a", 1.0), ("b", "y", 2.0)]))
    assert (result.pairs, result.not_in_vocabulary, result.scored) == (2, 2, 0)
    assert result.rho == 0.0 and "no pair" in result.note
    empty = ws.evaluate_benchmark(np.eye(2), ["a", "b"], ws.Benchmark("empty", []))
    assert empty.rho == 0.0 and empty.pairs == 0


def test_an_untied_model_gives_its_input_embedding():
    from zoo import AWDLSTM
    model = AWDLSTM(12, embed_dim=4, hidden_dim=6, num_layers=1, tie_weights=False, seed=0)
    model.build()
    matrix, tied = ws.input_embedding(model)
    assert not tied and matrix.shape == (12, 4)
    np.testing.assert_array_equal(matrix, np.asarray(model.embedding.embeddings))


# ---------------------------------------------------------------- thesis Table 5.2 (PTB)

TABLE_5_2_PTB = {  # file: (non-empty lines, pairs not in the PTB vocabulary)
    "EN-WS-353-ALL": (353, 116), "EN-WS-353-SIM": (203, 66), "EN-WS-353-REL": (252, 80),
    "EN-RG-65": (65, 55), "EN-MC-30": (30, 21), "EN-MTurk-287": (287, 146),
    "EN-MTurk-771": (771, 346), "EN-MEN-TR-3k": (3000, 1952), "EN-YP-130": (130, 65),
    "EN-VERB-143": (144, 9), "EN-RW-STANFORD": (2034, 1889), "EN-SimVerb-3500": (3500, 1746),
    "EN-SIMLEX-999": (999, 424),
}


@pytest.mark.ptb
def test_ptb_pairs_not_in_vocabulary_are_those_of_table_5_2(ptb_dir):
    folder = data_dir() / "word-similarity"
    if not folder.is_dir():
        pytest.skip(f"word-similarity benchmarks not found under {folder}")
    from tflm.data import load_corpus
    vocabulary = list(load_corpus("ptb", data_dir=ptb_dir, download=False).vocabulary)
    assert len(vocabulary) == 10_000
    e = np.random.default_rng(0).normal(size=(len(vocabulary), 3))
    results = ws.evaluate_folder(e, vocabulary, folder)
    got = {r.benchmark: (r.pairs, r.not_in_vocabulary) for r in results}
    assert got == TABLE_5_2_PTB
    assert [r.benchmark for r in results] == sorted(TABLE_5_2_PTB)


# ---------------------------------------------------------------- the command line

def _benchmarks(folder, vocab):
    folder.mkdir()
    (folder / "B-small.txt").write_text(
        f"{vocab[1]} {vocab[2]} 3.0\n{vocab[1]}\t{vocab[3]}\t1.5\n\n{vocab[2]} {vocab[4]} 2\n"
        f"{vocab[5].upper()} {vocab[6]} 7.5\n{vocab[7]} {vocab[8]} 1.0\nnot-a-word {vocab[1]} 2\n",
        encoding="utf-8")
    (folder / "A-none.txt").write_text("nothing here 1\n", encoding="utf-8")
    return folder


def test_command_line_on_a_run(tiny_run, tmp_path, capsys):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from tensorboard.util import tensor_util
    run = tmp_path / "run"
    shutil.copytree(tiny_run, run)
    vocab = (run / "vocab.txt").read_text(encoding="utf-8").splitlines()
    folder = _benchmarks(tmp_path / "bench", vocab)
    out = tmp_path / "ws.json"
    assert ws.main([str(run), "--benchmarks", str(folder), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    report = json.loads(out.read_text(encoding="utf-8"))
    rows = {r["benchmark"]: r for r in report["results"]}
    assert list(rows) == ["A-none", "B-small"]
    assert (rows["B-small"]["pairs"], rows["B-small"]["not_in_vocabulary"]) == (6, 1)
    assert rows["A-none"]["rho"] == 0.0 and "no pair" in rows["A-none"]["note"]
    lines = printed.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("benchmark"))
    assert lines[header].split() == ["benchmark", "pairs", "not", "in", "vocab", "rho"]
    assert lines[header + 1].split() == ["A-none", "1", "1", "0.0000"]
    assert lines[header + 2].split() == ["B-small", "6", "1", f"{rows['B-small']['rho']:.4f}"]
    assert "A-none: no pair in the vocabulary" in printed

    # The rho values are TensorBoard scalars of the run, at the best epoch.
    best_epoch = json.loads((run / "metrics.json").read_text())["best_epoch"]
    events = list((run / "logs" / "evaluation").glob("events.out.tfevents.*"))
    acc = EventAccumulator(str(events[0]))
    acc.Reload()
    (event,) = acc.Tensors("word_similarity/B-small")
    assert event.step == best_epoch
    assert float(tensor_util.make_ndarray(event.tensor_proto)) == pytest.approx(
        rows["B-small"]["rho"], abs=1e-6)
    assert "word_similarity/A-none" in acc.Tags()["tensors"]


def test_a_model_file_without_config_takes_the_folder_from_the_environment(
        tiny_run, tmp_path, capsys, monkeypatch):
    model = tmp_path / "model"
    model.mkdir()
    shutil.copy(tiny_run / "best.keras", model / "best.keras")
    shutil.copy(tiny_run / "vocab.txt", model / "vocab.txt")
    vocab = (model / "vocab.txt").read_text(encoding="utf-8").splitlines()
    monkeypatch.setenv(ws.ENV_DIR, str(_benchmarks(tmp_path / "bench", vocab)))
    assert ws.main([str(model / "best.keras")]) == 0
    assert "B-small" in capsys.readouterr().out
    assert not (model / "logs").exists()  # not a zoo run: no TensorBoard scalars


def _bad_line(tmp_path):
    folder = tmp_path / "bad"
    folder.mkdir()
    (folder / "EN-BAD.txt").write_text("a b 1\nc d\n", encoding="utf-8")
    return folder


@pytest.mark.parametrize("case, message", [
    ("missing run", "no such run directory"),
    ("no benchmarks", "pass --benchmarks"),
    ("malformed", "EN-BAD.txt:2: expected 3 fields"),
    ("missing folder", "does not exist"),
])
def test_bad_input_is_one_line_on_stderr_and_exit_2(tiny_run, tmp_path, capsys, monkeypatch,
                                                     case, message):
    monkeypatch.delenv(ws.ENV_DIR, raising=False)
    args = {"missing run": [str(tmp_path / "nowhere"), "--benchmarks", str(tmp_path)],
            "no benchmarks": [str(tiny_run)],
            "malformed": [str(tiny_run), "--benchmarks", str(_bad_line(tmp_path))],
            "missing folder": [str(tiny_run), "--benchmarks", str(tmp_path / "nope")]}[case]
    if case == "missing run":
        (tmp_path / "x.txt").write_text("a b 1\n", encoding="utf-8")
    assert ws.main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("tools.word_similarity: error: ") and message in err[0]


@pytest.mark.parametrize("backend", ["jax", pytest.param("torch", marks=pytest.mark.slow)])
def test_both_tools_give_the_same_figures_on_the_other_backends(tiny_run, tmp_path, backend):
    """tools.word_similarity and tools.embeddings load the run under JAX / PyTorch and
    report what they report under TensorFlow."""
    from tests.backends import run_in_backend
    from tools import embeddings
    run = tmp_path / "run"  # the tools write TensorBoard scalars into a run folder's logs/
    shutil.copytree(tiny_run, run)
    vocab = (run / "vocab.txt").read_text(encoding="utf-8").splitlines()
    folder = _benchmarks(tmp_path / "bench", vocab)
    assert ws.main([str(run / "best.keras"), "--benchmarks", str(folder), "--json",
                    str(tmp_path / "tf.json")]) == 0
    assert embeddings.main([str(run / "best.keras"), "--out", str(tmp_path / "tf")]) == 0
    run_in_backend(backend, f"""
        from tools import embeddings, word_similarity
        assert word_similarity.main([{str(run / "best.keras")!r}, "--benchmarks",
                                     {str(folder)!r}, "--json", {str(tmp_path / "o.json")!r}]) == 0
        assert embeddings.main([{str(run / "best.keras")!r}, "--out",
                                {str(tmp_path / "o")!r}]) == 0
    """)
    ours = json.loads((tmp_path / "tf.json").read_text())["results"]
    theirs = json.loads((tmp_path / "o.json").read_text())["results"]
    assert [r["rho"] for r in theirs] == pytest.approx([r["rho"] for r in ours], abs=1e-6)
    a = json.loads((tmp_path / "tf" / "embeddings.json").read_text())
    b = json.loads((tmp_path / "o" / "embeddings.json").read_text())
    assert b["singular_values"] == pytest.approx(a["singular_values"], rel=1e-5)
    assert (b["components_75"], b["components_95"]) == (a["components_75"], a["components_95"])
