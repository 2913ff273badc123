"""A study's measures (`zoo.studies.measures`) and their figures (`zoo.studies.figures`):
a finished trial measured by the analysis commands, checked against NumPy; measured once
(a study run again measures only what is missing); the rank-against-perplexity
correlation, the normalized spectra and the win counts against hand computation."""

import importlib
import json

import numpy as np
import pytest
from scipy import stats

from zoo.errors import ConfigError, UserError
from zoo.studies import engine, figures, load_study, measures
from zoo.studies.trials import plan

TINY = {"corpus.train_tokens": 1500, "corpus.valid_tokens": 300, "corpus.test_tokens": 300,
        "corpus.vocab_size": 30, "model.embed_dim": 6, "model.hidden_dim": 8,
        "training.bptt": 8, "training.batch_size": 8, "training.epochs": 1}


def _study(tmp_path, **changes):
    study = {"description": "one synthetic arm", "reproduces": "nothing (a test)",
             "arms": {"a": {"preset": "synthetic"}}, "seeds": [1, 2],
             "metrics": ["test_perplexity", "press_rank"],
             "measures": ["rank", "word_similarity", "embedding_spectrum"],
             "scales": {"smoke": {"seeds": [1, 2], "set": TINY}}, **changes}
    path = tmp_path / "measured.json"
    path.write_text(json.dumps(study))
    return load_study(path)


def _benchmarks(folder, words):
    """Two benchmark files over the run's own words (a synthetic vocabulary matches no
    English benchmark)."""
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name in ("EN-A", "EN-B"):
        pairs = [(words[i], words[j], float(rng.uniform(0, 10)))
                 for i, j in rng.integers(0, len(words), (25, 2)) if i != j]
        (folder / f"{name}.txt").write_text("".join(f"{a} {b} {s:.2f}\n" for a, b, s in pairs))
    return folder


def _tools_in_process(monkeypatch, child=("tools.rank",)):
    """Each measure's command runs through its own `main` in this process (a fresh
    TensorFlow child costs about 7 s here), except those of `child`, which keep the real
    `python -m` child that a study runs, so that path and its exit-code check stay tested.
    Returns the commands each took: {"child": [...], "in_process": [...]}."""
    real = measures._run_tool
    taken = {"child": [], "in_process": []}

    def run_tool(args, what):
        if args[0] in child:
            taken["child"].append(args[0])
            return real(args, what)
        taken["in_process"].append(args[0])
        assert importlib.import_module(args[0]).main(list(args[1:])) == 0, args
    monkeypatch.setattr(measures, "_run_tool", run_tool)
    return taken


def test_a_finished_trial_is_measured_once_as_numpy_computes_it(tmp_path, monkeypatch):
    taken = _tools_in_process(monkeypatch)
    study = _study(tmp_path)
    trial = plan(study, "smoke")[0]
    path = tmp_path / "trials" / trial.name
    plans = {trial.name: (trial.config, str(path))}
    assert engine.train_trial({"trial": trial.name}, plans, None) == {"state": "finished",
                                                                     "error": ""}
    words = (path / "vocab.txt").read_text().split()
    monkeypatch.setenv(measures.SIMILARITY_ENV, str(_benchmarks(tmp_path / "ws", words[2:])))
    assert engine._needs_work(path, study["measures"])  # finished, not yet measured
    assert engine.train_trial({"trial": trial.name}, plans, None, study["measures"]) == {
        "state": "finished", "error": ""}
    found = measures.read_measures(path)
    assert set(found) == set(study["measures"])
    assert taken == {"child": ["tools.rank"], "in_process": [
        "tools.qmatrix", "tools.word_similarity", "tools.embeddings"]}
    assert not (path / "measures" / "q_test.npy").exists()  # Q deleted, its spectrum kept

    # the rank: Q exported again in-process, its SVD in NumPy, Press's threshold
    from tools.qmatrix import export_q
    from zoo.runs.saved_run import open_run
    run = open_run(path)
    export_q(run.model, run.corpus, "test", tmp_path / "q.npy")
    q = np.load(tmp_path / "q.npy").astype(np.float64)
    s = np.linalg.svd(q, compute_uv=False)
    threshold = 0.5 * np.sqrt(sum(q.shape) + 1) * s[0] * np.finfo(np.float32).eps
    assert found["rank"]["press_rank"] == int((s > threshold).sum())
    np.testing.assert_allclose(np.load(path / "measures" / "q_test.npz")["values"], s,
                               rtol=1e-5, atol=1e-7 * s[0])  # float32 Q: noise below Press
    # word similarity: one rho per benchmark file and their mean
    rhos = found["word_similarity"]
    assert set(rhos) == {"word_similarity_EN-A", "word_similarity_EN-B",
                         "word_similarity_mean"}
    assert rhos["word_similarity_mean"] == pytest.approx(
        (rhos["word_similarity_EN-A"] + rhos["word_similarity_EN-B"]) / 2)
    assert 1 <= found["embedding_spectrum"]["embedding_components_75"] <= 6

    # measured once: run again, nothing changes; a measure taken away is taken again alone
    stamp = (path / measures.MEASURES_FILE).stat().st_mtime_ns
    assert not engine._needs_work(path, study["measures"])
    measures.measure_trial(path, study["measures"])
    assert (path / measures.MEASURES_FILE).stat().st_mtime_ns == stamp
    kept = dict(found)
    del kept["word_similarity"]
    (path / measures.MEASURES_FILE).write_text(json.dumps(kept))
    assert measures.missing(path, study["measures"]) == ["word_similarity"]
    again = measures.measure_trial(path, study["measures"])
    assert again["rank"] == found["rank"] and again["word_similarity"] == rhos


def test_a_measure_without_its_benchmarks_says_where_to_put_them(tmp_path, monkeypatch):
    monkeypatch.delenv(measures.SIMILARITY_ENV, raising=False)
    monkeypatch.delenv("TFLM_DATA_DIR", raising=False)
    with pytest.raises(UserError, match="TFLM_WORD_SIMILARITY_DIR"):
        measures.similarity_dir(tmp_path / "nothing")


def test_an_unknown_measure_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="unknown measure.*'ranks'"):
        _study(tmp_path, measures=["ranks"])


def _fake_measured(tmp_path, runs):
    """Finished trial folders: {(arm, seed): (test perplexity, measures)}."""
    study = _study(tmp_path, arms={"a": {"preset": "synthetic"}, "b": {"preset": "synthetic"}})
    trials = plan(study, "paper")
    for trial in trials:
        path = tmp_path / "trials" / trial.name
        (path / "measures").mkdir(parents=True)
        ppl, measured, spectrum = runs[trial.arm, trial.seed]
        (path / "metrics.json").write_text(json.dumps(
            {"test_perplexity": ppl, "history": [{"val_perplexity": ppl}]}))
        (path / measures.MEASURES_FILE).write_text(json.dumps(measured))
        np.savez(path / "measures" / "q_test.npz", values=np.asarray(spectrum))
    return trials


def test_the_figures_hold_hand_computed_correlation_spectra_and_wins(tmp_path):
    import matplotlib.image

    def ws(x, y, z):
        return {"word_similarity_X": x, "word_similarity_Y": y, "word_similarity_Z": z}
    runs = {("a", 1): (60.0, {"rank": {"press_rank": 400}, "word_similarity": ws(.3, .5, .2)},
                       [4.0, 2.0, 1.0]),
            ("a", 2): (59.0, {"rank": {"press_rank": 402}, "word_similarity": ws(.5, .5, .2)},
                       [2.0, 2.0, 0.5]),
            ("b", 1): (56.0, {"rank": {"press_rank": 9981}, "word_similarity": ws(.2, .6, .2)},
                       [10.0, 5.0, 1.0]),
            ("b", 2): (57.0, {"rank": {"press_rank": 9979}, "word_similarity": ws(.2, .4, .1)},
                       [10.0, 1.0, 0.1])}
    trials = _fake_measured(tmp_path, runs)
    points, rho = figures.rank_vs_perplexity(trials, tmp_path, tmp_path / "r.png")
    assert points == {"a": [(60.0, 400), (59.0, 402)], "b": [(56.0, 9981), (57.0, 9979)]}
    assert rho == pytest.approx(stats.spearmanr([60, 59, 56, 57],
                                                [400, 402, 9981, 9979]).statistic)
    drawn = figures.spectra(trials, tmp_path, tmp_path / "q.png")
    np.testing.assert_allclose(drawn["a"], [1.0, 0.75, 0.25 / 2 + 0.25 / 2])
    np.testing.assert_allclose(drawn["b"], [1.0, 0.3, 0.055])
    means, counts = figures.word_similarity(trials, tmp_path, tmp_path / "w.png",
                                            tmp_path / "wins.png")
    assert means["a"] == pytest.approx({"X": 0.4, "Y": 0.5, "Z": 0.2})
    assert means["b"] == pytest.approx({"X": 0.2, "Y": 0.5, "Z": 0.15})
    assert counts == {"a": 3, "b": 1}  # Y is a tie: both win it
    for name in ("r.png", "q.png", "w.png", "wins.png"):
        assert matplotlib.image.imread(tmp_path / name).shape[0] > 100


@pytest.mark.parametrize("corpus, rows", [({"name": "wikitext-2"}, 33_320),
                                          ({"name": "ptb"}, None),
                                          ({"name": "synthetic", "vocab_size": 30}, None)])
def test_the_rank_takes_the_theses_contexts(tmp_path, corpus, rows):
    """PTB's Q: every test context; WikiText-2's: the first 33,320 (thesis §4.3.3)."""
    (tmp_path / "config.json").write_text(json.dumps({"corpus": corpus}))
    assert measures.rank_rows(tmp_path) == rows


def test_a_failing_measure_command_is_one_user_error_with_its_last_line(tmp_path):
    missing = tmp_path / "missing.npy"
    with pytest.raises(UserError, match=r"measure rank: tools\.rank failed \(exit 2\): "
                                        r"tools\.rank: error: .*missing\.npy"):
        measures._run_tool(["tools.rank", str(missing)], "rank")
