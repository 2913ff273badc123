"""`python -m tools.divergence`: Yang et al.'s Table 11 (expected pairwise KL) for the Q
matrices given, against a NumPy computation over the same sampled pairs; one-line errors."""

import json

import numpy as np
import pytest

from tools import divergence


def _q(path, rows, words, seed):
    q = np.log(np.random.default_rng(seed).dirichlet(np.ones(words) * 0.3, size=rows))
    np.save(path, q.astype(np.float32))
    return q.astype(np.float32).astype(np.float64)


def test_the_table_gives_each_matrix_its_mean_kl_over_the_same_pairs(tmp_path, capsys):
    qa, qb = _q(tmp_path / "a.npy", 30, 7, 0), _q(tmp_path / "b.npy", 30, 7, 1)
    out = tmp_path / "kl.json"
    assert divergence.main([str(tmp_path / "a.npy"), str(tmp_path / "b.npy"), "--labels",
                            "Softmax", "MoS", "--pairs", "200", "--seed", "3",
                            "--json", str(out)]) == 0
    rng = np.random.default_rng(3)  # the pairs as the docstring draws them
    i, j = rng.integers(0, 30, 200), rng.integers(0, 29, 200)
    j = j + (j >= i)
    expected = [float(np.mean(np.sum(np.exp(q[i]) * (q[i] - q[j]), axis=1))) for q in (qa, qb)]
    saved = json.loads(out.read_text())["models"]
    assert [m["label"] for m in saved] == ["Softmax", "MoS"]
    assert [m["mean"] for m in saved] == pytest.approx(expected, rel=1e-6)
    printed = capsys.readouterr().out
    assert f"| Softmax | 30 | {expected[0]:.4f} |" in printed
    assert f"| MoS | 30 | {expected[1]:.4f} |" in printed


def test_logits_instead_of_log_probabilities_are_refused_in_one_line(tmp_path, capsys):
    np.save(tmp_path / "logits.npy", np.random.default_rng(0).normal(size=(10, 5)))
    assert divergence.main([str(tmp_path / "logits.npy"), "--pairs", "20"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "is not a log-probability vector" in err[0]


# ---------------------------------------------------------------- the papers' contexts


def test_the_papers_six_contexts_are_found_once_in_the_ptb_test_split(ptb_dir):
    """Each Reference of thesis Table 5.1 / Yang Table 14 lies once in PTB's test split, the
    predicted word after its prefix; the context shown is the previous sentence and the
    current one up to the blank, as the papers print it."""
    from tflm.data import load_corpus
    from tools.published_contexts import PUBLISHED, rows_of
    corpus = load_corpus("ptb", ptb_dir)
    ids, vocab = corpus.test, corpus.vocabulary
    located = rows_of("parthiban2020_table_5_1", ids, vocab)
    assert [row for row, _, _ in located] == [2699, 21299, 82039, 477, 82204, 63608]
    for (row, context, reference), (prefix, target) in zip(
            located, PUBLISHED["yang2018_table14"].entries):
        assert vocab.id_to_token(int(ids[row + 1])) == target
        assert context[-len(prefix.split()):] == prefix.split()
        assert context.count("<eos>") == 1  # the previous sentence, then the current one
        assert reference[:len(prefix.split()) + 1] == prefix.split() + [target]
        assert reference[-1] == "<eos>" and reference.count("<eos>") == 1
    row5, context5, reference5 = located[4]
    assert " ".join(context5).startswith("the government is watching closely")
    assert " ".join(reference5) == ("pretoria has n't forgotten why they were all sentenced "
                                    "to life <unk> in the first place for sabotage and "
                                    "conspiracy to <unk> the government <eos>")


def test_top_k_table_at_the_papers_contexts_from_the_command_line(tmp_path, capsys, ptb_dir):
    """`--top-k 3`: each matrix's three most probable words at each context, as NumPy's
    argsort of that row gives them."""
    from tflm.data import load_corpus
    vocab = load_corpus("ptb", ptb_dir).vocabulary
    rng = np.random.default_rng(0)
    rows = 82430
    q = np.lib.format.open_memmap(tmp_path / "q.npy", mode="w+", dtype=np.float32,
                                  shape=(rows, len(vocab)))
    chosen = [2699, 21299, 82039, 477, 82204, 63608]
    for r in chosen:
        logits = rng.standard_normal(len(vocab)) * 3.0
        q[r] = logits - np.log(np.exp(logits - logits.max()).sum()) - logits.max()
    q.flush()
    out = tmp_path / "top.json"
    data = ["--data-dir", str(ptb_dir)]
    assert divergence.main([str(tmp_path / "q.npy"), "--labels", "MoS", "--top-k", "3",
                            "--json", str(out), *data]) == 0
    printed = capsys.readouterr().out
    saved = json.loads(out.read_text())
    assert saved["rows"] == chosen
    for r, per in zip(chosen, saved["top_k"]["MoS"]):
        best = np.argsort(-q[r])[:3]
        assert [w for w, _ in per] == [vocab.id_to_token(int(i)) for i in best]
        assert [p for _, p in per] == pytest.approx(np.exp(q[r][best]), rel=1e-5)
    assert "Context #5" in printed and "for sabotage and _____" in printed
    assert "Reference #5  pretoria has n't forgotten" in printed
    # rows given by hand, and a bad row, in one line
    assert divergence.main([str(tmp_path / "q.npy"), "--top-k", "2", "--contexts",
                            "477", *data]) == 0
    assert "Context #1" in capsys.readouterr().out
    assert divergence.main([str(tmp_path / "q.npy"), "--top-k", "2", "--contexts",
                            "99999999", *data]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--contexts rows must lie in" in err[0]
