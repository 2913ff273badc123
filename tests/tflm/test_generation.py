"""`LanguageModel.generate` / `score` with KerasHub's conventions, and `tflm.samplers`
(issue 43): each sampler's distribution against NumPy, generation against an eager loop
over `forward_with_state`, padded prompts, stop tokens, text in and out, the same words on
another backend, and scores against NumPy."""

import json

import keras
import numpy as np
import pytest

import zoo
from tests.backends import run_in_backend
from tflm import samplers

V = 12


@pytest.fixture(scope="module")
def model():
    keras.utils.set_random_seed(4)
    lm = zoo.AWDLSTM(V, embed_dim=6, hidden_dim=8, num_layers=2)
    lm.build((None, None))
    # larger weights than the initialisation's: rows far from uniform
    lm.set_weights([w * 8 if w.ndim == 2 else w for w in lm.get_weights()])
    return lm


def _draws(sampler, row, n=20000, seed=0):
    rng = np.random.Generator(np.random.PCG64(seed))
    return np.bincount(sampler(np.tile(row, (n, 1)), rng), minlength=row.size) / n


def _close(freq, probs, n=20000):
    """Every frequency within 5 standard errors of its probability."""
    tolerance = 5 * np.sqrt(probs * (1 - probs) / n) + 1e-12
    np.testing.assert_array_less(np.abs(freq - probs), tolerance + 1e-9)


ROW = np.log(np.array([0.30, 0.05, 0.25, 0.05, 0.15, 0.10, 0.10]))


def test_random_sampler_draws_the_tempered_distribution():
    for temperature in (1.0, 0.5, 2.0):
        probs = np.exp(ROW / temperature) / np.exp(ROW / temperature).sum()
        _close(_draws(samplers.RandomSampler(temperature), ROW), probs)


def test_top_k_and_top_p_draw_from_their_candidates_only():
    top3 = np.zeros(7)
    top3[[0, 2, 4]] = [0.30, 0.25, 0.15]
    _close(_draws(samplers.TopKSampler(3), ROW), top3 / top3.sum())
    # nucleus: sorted 0.30, 0.25, 0.15, 0.10, ... -> 0.30 + 0.25 + 0.15 >= 0.7
    assert list(samplers.TopPSampler(0.7).candidates(ROW)) == [0, 2, 4]
    assert list(samplers.TopPSampler(0.71).candidates(ROW)) == [0, 2, 4, 5]  # ties: lower id
    assert list(samplers.TopPSampler(1.0, k=2).candidates(ROW)) == [0, 2]
    _close(_draws(samplers.TopPSampler(0.7), ROW), top3 / top3.sum())
    assert set(_draws(samplers.GreedySampler(), ROW).nonzero()[0]) == {0}


@pytest.mark.parametrize("make, message", [
    (lambda: samplers.RandomSampler(0.0), "temperature must be a number > 0"),
    (lambda: samplers.TopKSampler(0), "k must be an integer >= 1"),
    (lambda: samplers.TopPSampler(1.5), r"p must be in \(0, 1\]"),
    (lambda: samplers.get("beam"), "unknown sampler 'beam'"),
])
def test_bad_sampler_arguments_are_refused(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def _eager(model, prompt, steps, sampler, seed):
    """The loop `generate` replaces: one eager `forward_with_state` per word."""
    rng = np.random.Generator(np.random.PCG64(seed))
    log_probs, states = model.forward_with_state(np.array([prompt], np.int32))
    out = list(prompt)
    for _ in range(steps):
        row = np.asarray(keras.ops.convert_to_numpy(log_probs), np.float64)[:, -1]
        out.append(int(sampler(row, rng)[0]))
        log_probs, states = model.forward_with_state(np.array([[out[-1]]], np.int32), states)
    return out


@pytest.mark.parametrize("sampler", ["random", samplers.TopKSampler(4, 0.7), "greedy"])
def test_generate_equals_the_eager_loop(model, sampler):
    """Same seed, same words as feeding every word eagerly with the carried state."""
    sampler = samplers.get(sampler)
    for prompt in ([3, 1, 4], [5]):
        ours = model.generate([prompt], max_length=12, sampler=sampler, seed=7)
        assert ours == [_eager(model, prompt, 12 - len(prompt), sampler, 7)]
    assert model.generate(np.array([[3, 1, 4]]), max_length=12, sampler=sampler, seed=7) == [
        _eager(model, [3, 1, 4], 9, sampler, 7)]


def test_a_batch_of_prompts_of_different_lengths_continues_as_each_alone(model):
    """The shorter prompt is right-padded with PAD_ID, whose positions hold the state."""
    batch = model.generate([[3, 1, 4], [5]], max_length=8, sampler="greedy")
    assert batch == [model.generate([[3, 1, 4]], max_length=8, sampler="greedy")[0],
                     model.generate([[5]], max_length=8, sampler="greedy")[0]]
    assert [len(r) for r in batch] == [8, 8]


def test_stop_tokens_strip_prompt_and_text(model):
    words = [f"w{i}" for i in range(V)]
    full = model.generate([[3, 1]], max_length=10, sampler="greedy")[0]
    stop = full[3]
    stopped = model.generate([[3, 1]], max_length=10, sampler="greedy", stop_token_ids=[stop])
    assert stopped == [full[:3]]
    assert model.generate([[3, 1]], max_length=10, sampler="greedy",
                          strip_prompt=True) == [full[2:]]
    text = model.generate("w3 w1", max_length=10, sampler="greedy", vocabulary=words)
    assert text == " ".join(words[i] for i in full)
    with pytest.raises(ValueError, match="text prompts need the model's words"):
        model.generate("w3 w1", max_length=10)
    with pytest.raises(ValueError, match="leaves nothing to generate"):
        model.generate([[3, 1]], max_length=2)


@pytest.mark.slow  # CI time (about a minute under load); runs with -m slow
def test_the_same_words_on_jax(model, tmp_path):
    model.save(tmp_path / "m.keras")
    ours = model.generate([[3, 1, 4], [2]], max_length=15, sampler="top_p", seed=11)
    out = run_in_backend("jax", f"""
        import json, zoo
        m = zoo.load_model({str(tmp_path / "m.keras")!r})
        print(json.dumps(m.generate([[3, 1, 4], [2]], max_length=15, sampler="top_p", seed=11)))
    """)
    assert json.loads(out.strip().splitlines()[-1]) == ours


def test_score_gives_the_log_probabilities_and_the_targets_nll(model):
    tokens = np.array([[3, 1, 4, 1], [5, 9, 2, 0]])
    logits = model.score(tokens)
    np.testing.assert_allclose(logits, keras.ops.convert_to_numpy(model(tokens)), atol=1e-5)
    targets = np.array([[1, 4, 1, 5], [9, 2, 6, 5]])
    mask = np.array([[1, 1, 1, 1], [1, 1, 1, 0]], bool)
    loss = model.score(tokens, padding_mask=mask, scoring_mode="loss", target_ids=targets)
    expected = -np.take_along_axis(logits, targets[..., None], -1)[..., 0]
    np.testing.assert_allclose(loss[mask], expected[mask], rtol=1e-5)
    assert loss[1, 3] == 0.0
    with pytest.raises(ValueError, match="needs target_ids"):
        model.score(tokens, scoring_mode="loss")
