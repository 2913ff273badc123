"""LMS-PLIF: formula, continuity and monotonicity at every knot, linear tails, training."""

import numpy as np
import pytest

import keras
from tflm import losses as tflm_losses
from tflm.layers import PLIFHead, PLIFLayer, TiedEmbedding, learning_rate_multipliers
from tests.backends import run_in_backend
from tests.tflm.layers.test_heads_backends import (assert_close_log_probs, assert_log_probs,
                                       check_mixed_precision, check_training_step,
                                       gradients_finite, np_log_softmax, np_softplus,
                                       roundtrip_exact)

K, T, V = 50, 5.0, 40


def ref_f(l, pre_slopes, num_intervals, bound):
    """f(l) = (l - (-T + i D)) s_i + D sum_{j<i} s_j, i = clamp(floor((l + T)/D), 0, K-1), float64."""
    l = np.asarray(l, np.float64)
    d = 2.0 * bound / num_intervals
    s = np_softplus(np.asarray(pre_slopes, np.float64))
    knots = d * np.concatenate([[0.0], np.cumsum(s)[:-1]])
    i = np.clip(np.floor((l + bound) / d), 0, num_intervals - 1).astype(int)
    return (l - (-bound + i * d)) * s[i] + knots[i]


def make_layer(**kw):
    kw = dict(num_intervals=K, bound=T, init_scale=0.7, seed=3) | kw
    layer = PLIFLayer(**kw)
    layer.build()
    return layer


def transform(layer, x):
    return np.asarray(layer.transform(np.asarray(x, "float32")), np.float64)


def test_matches_reference_formula():
    layer = make_layer()
    v = np.asarray(layer.pre_slopes)
    rng = np.random.default_rng(0)
    logits = (3.0 * rng.normal(size=(2, 4, V))).astype("float32")     # some beyond [-T, T]
    logits[0, 0, :4] = [-12.0, 9.0, -T, T]
    assert (np.abs(logits) > T).any()
    out = layer(logits)
    assert_log_probs(out, logits.shape)
    expected_f = ref_f(logits, v, K, T)
    assert_close_log_probs(out, np_log_softmax(expected_f))
    fl = PLIFLayer(num_intervals=K, bound=T, init_scale=0.7, seed=3, return_logits=True)
    fl.build()
    fl.pre_slopes.assign(v)
    assert_close_log_probs(fl(logits), expected_f)
    # the slopes are really random (the map is not an affine function of l)
    s = np.asarray(layer.slopes())
    assert s.min() > 0 and s.std() > 0.1


def test_continuous_and_strictly_increasing_at_every_knot():
    layer = make_layer()
    s = np.asarray(layer.slopes(), np.float64)
    d = 2 * T / K
    knots = -T + d * np.arange(K + 1)
    eps = 1e-3 * d
    left = transform(layer, knots - eps)
    right = transform(layer, knots + eps)
    assert np.all(right > left)
    # extrapolate both sides to the knot: they must meet (a jump would be ~ D * s ~ 0.2)
    s_left = np.concatenate([[s[0]], s])           # piece left of knot i is i-1 (clamped)
    s_right = np.concatenate([s, [s[-1]]])
    at_left = left + eps * s_left
    at_right = right - eps * s_right
    np.testing.assert_allclose(at_left, at_right, atol=2e-5)
    # value at the knot = D * sum_{j<i} s_j (up to the constant of knot 0)
    expected = d * np.concatenate([[0.0], np.cumsum(s)])
    np.testing.assert_allclose(transform(layer, knots), expected, atol=2e-5)
    # strictly increasing on a dense grid, tails included
    grid = np.linspace(-3 * T, 3 * T, 6001)
    assert np.all(np.diff(transform(layer, grid)) > 0)


def test_linear_beyond_the_bound():
    layer = make_layer()
    s = np.asarray(layer.slopes(), np.float64)
    lo = np.array([-T - 1.0, -T - 7.5, -40.0])
    np.testing.assert_allclose(transform(layer, lo), (lo + T) * s[0], rtol=1e-5)
    hi = np.array([T + 1.0, T + 7.5, 40.0])
    f_t = transform(layer, np.array([T]))[0]
    np.testing.assert_allclose(transform(layer, hi), f_t + (hi - T) * s[-1], rtol=1e-5)


def test_init_scale_zero_is_softmax_and_default_init_near_identity():
    rng = np.random.default_rng(1)
    logits = (4.0 * rng.normal(size=(2, 3, V))).astype("float32")
    flat = make_layer(init_scale=0.0)
    np.testing.assert_allclose(np.asarray(flat.slopes()), 1.0, atol=1e-6)
    assert_close_log_probs(flat(logits), np_log_softmax(logits), rtol=2e-5)
    default = PLIFLayer()                      # reference size: K = 100,000 on [-20, 20]
    default.build()
    assert default.pre_slopes.shape == (100_000,)
    s = np.asarray(default.slopes())
    assert abs(s.mean() - 1.0) < 0.01 and 0.02 < s.std() < 0.2
    assert_log_probs(default(logits))


def test_huge_logits_and_gradients():
    import tensorflow as tf
    layer = make_layer()
    big = tf.Variable((1e4 * np.random.default_rng(2).uniform(-1, 1, (2, 3, V))).astype("float32"))
    assert_log_probs(layer(big))
    gradients_finite(lambda: layer(big)[..., 0], [big, layer.pre_slopes])
    small = tf.Variable((2.0 * np.random.default_rng(3).normal(size=(2, 3, V))).astype("float32"))
    grads = gradients_finite(lambda: layer.transform(small), [small, layer.pre_slopes])
    # df/dl = s_i (the slope of the interval the logit falls in)
    s = np.asarray(layer.slopes(), np.float64)
    i = np.clip(np.floor((np.asarray(small) + T) / (2 * T / K)), 0, K - 1).astype(int)
    np.testing.assert_allclose(np.asarray(grads[0]), s[i], rtol=1e-5)


def test_slope_gradients_match_formula():
    """d sum f / d s_j = D #{i > j} + sum_{i = j} u: the exact knot sums pass gradients on."""
    import tensorflow as tf
    layer = make_layer()
    l = (4.0 * np.random.default_rng(9).normal(size=(3, V))).astype("float32")
    with tf.GradientTape() as tape:
        f = tf.reduce_sum(layer.transform(l))
    grad = np.asarray(tape.gradient(f, layer.pre_slopes.value), np.float64)
    d = 2 * T / K
    i = np.clip(np.floor((l.astype(np.float64) + T) / d), 0, K - 1).astype(int).ravel()
    u = l.astype(np.float64).ravel() - (-T + i * d)
    ds = d * (i[:, None] > np.arange(K)).sum(0) + np.bincount(i, weights=u, minlength=K)
    v = np.asarray(layer.pre_slopes, np.float64)
    np.testing.assert_allclose(grad, ds / (1 + np.exp(-v)), rtol=1e-5, atol=1e-6)


# The preset's PLIF (zoo/presets/awd_lstm_plif_ptb.json: K = 100,000 on [-20, 20]) with slopes
# from the layer's initializer at a realistic spread, on logits in [-30, 30] (a quarter of
# them within 3e-6 of a knot). Run by every backend; writes log-probs and slopes to argv[1].
K100K_SRC = """
import sys
import numpy as np
import keras
from tflm.layers import PLIFLayer

rng = np.random.default_rng(0)
near_knot = -20.0 + 4e-4 * rng.integers(0, 100_001, (4, 500))
logits = np.concatenate([rng.uniform(-30.0, 30.0, (4, 1500)),
                         near_knot + rng.uniform(-3e-6, 3e-6, (4, 500))], -1).astype("float32")
layer = PLIFLayer(num_intervals=100_000, bound=20.0, init_scale=1.0, seed=0)
log_probs = keras.ops.convert_to_numpy(layer(logits))       # log_softmax(f(l)), as PLIFHead
np.savez(sys.argv[1], logits=logits, log_probs=log_probs,
         pre_slopes=keras.ops.convert_to_numpy(layer.pre_slopes))
"""
K100K_BACKENDS = ("tensorflow", "jax", "torch")


@pytest.fixture(scope="module")
def k100k_runs(tmp_path_factory):
    """K100K_SRC under every backend: here for this process's backend, the others in
    subprocesses started together (most of their time is importing Keras)."""
    from concurrent.futures import ThreadPoolExecutor
    folder = tmp_path_factory.mktemp("plif_k100k")

    def run(backend):
        target = str(folder / f"{backend}.npz")
        code = f"import sys; sys.argv = ['x', {target!r}]\n" + K100K_SRC
        if backend == keras.backend.backend():
            exec(code, {})
        else:
            run_in_backend(backend, code)
        return target

    with ThreadPoolExecutor(len(K100K_BACKENDS)) as pool:
        return {b: pool.submit(run, b) for b in K100K_BACKENDS}


@pytest.mark.parametrize("backend", K100K_BACKENDS)
def test_log_probs_at_reference_size_match_float64(backend, k100k_runs):
    """K = 100,000: log-probs within 2e-5 of float64 on every backend (5e-6 to 9e-6 measured;
    a float32 running sum of the knots left them 1.6e-4 off on TensorFlow)."""
    out = np.load(k100k_runs[backend].result())          # re-raises a skip or failure
    v = out["pre_slopes"]
    assert v.shape == (100_000,) and 0.5 < np_softplus(v).std() < 0.75    # realistic spread
    expected = np_log_softmax(ref_f(out["logits"], v, 100_000, 20.0))
    assert_log_probs(out["log_probs"], expected.shape)
    err = np.abs(out["log_probs"] - expected).max()
    assert err <= 2e-5, f"max |log P - float64 reference| = {err:.3g} under {backend}"


def test_frozen_slopes_are_not_trainable_and_do_not_move():
    rng = np.random.default_rng(4)
    x = rng.normal(size=(4, 5, 16)).astype("float32")
    y = rng.integers(0, V, size=(4, 5))
    inp = keras.Input((5, 16))
    head = PLIFHead(vocab_size=V, num_intervals=K, bound=T, init_scale=0.5, frozen=True)
    model = keras.Model(inp, head(inp))
    assert [w.name for w in head.non_trainable_weights] == ["pre_slopes"]
    assert "pre_slopes" not in [w.name for w in head.trainable_weights]
    slopes = np.array(head.plif.pre_slopes)
    check_training_step(model, x, y)
    np.testing.assert_array_equal(np.array(head.plif.pre_slopes), slopes)


def test_one_training_step_moves_slopes():
    rng = np.random.default_rng(5)
    x = rng.normal(size=(4, 5, 16)).astype("float32")
    y = rng.integers(0, V, size=(4, 5))
    inp = keras.Input((5, 16))
    head = PLIFHead(vocab_size=V, num_intervals=K, bound=T, init_scale=0.5)
    model = keras.Model(inp, head(inp))
    check_training_step(model, x, y)


def test_learning_rate_multipliers():
    emb = TiedEmbedding(V, 8)
    inp = keras.Input((5, 8))
    x = PLIFHead(embedding=emb, num_intervals=K, learning_rate_multiplier=1e-3, name="ph")(inp)
    model = keras.Model(inp, x)
    mult = learning_rate_multipliers(model)
    assert list(mult.values()) == [1e-3]
    (path,) = mult
    assert path.endswith("pre_slopes") and "ph" in path
    assert path in {v.path for v in model.trainable_variables}
    frozen = keras.Sequential([keras.Input((5, V)), PLIFLayer(K, learning_rate_multiplier=0.5,
                                                              frozen=True)])
    assert learning_rate_multipliers(frozen) == {}
    plain = keras.Sequential([keras.Input((5, V)), PLIFLayer(K)])
    assert learning_rate_multipliers(plain) == {}


def test_save_load_roundtrip(tmp_path):
    rng = np.random.default_rng(6)
    ids = rng.integers(0, V, size=(2, 6)).astype("int32")
    emb = TiedEmbedding(V, 8)
    inp = keras.Input((6,), dtype="int32")
    h = keras.layers.Dense(8, activation="tanh")(emb(inp))
    out = PLIFHead(embedding=emb, num_intervals=K, bound=T, init_scale=0.5,
                   learning_rate_multiplier=0.01, seed=7)(h)
    model = keras.Model(inp, out)
    loaded = roundtrip_exact(model, ids, tmp_path)
    cfg = loaded.layers[-1].get_config()
    assert (cfg["num_intervals"], cfg["bound"], cfg["learning_rate_multiplier"]) == (K, T, 0.01)
    li = keras.Input((6, V))
    m2 = keras.Model(li, PLIFLayer(K, T, init_scale=0.3, frozen=True, return_logits=True)(li))
    loaded2 = roundtrip_exact(m2, rng.normal(size=(2, 6, V)).astype("float32"), tmp_path)
    assert loaded2.layers[-1].frozen and loaded2.layers[-1].return_logits


def test_mixed_precision():
    h = np.random.default_rng(7).normal(size=(2, 3, 16)).astype("float32")
    check_mixed_precision(lambda: PLIFHead(vocab_size=V, num_intervals=K, bound=T), h)


def test_bad_arguments_are_reported():
    with pytest.raises(ValueError, match="num_intervals=0"):
        PLIFLayer(num_intervals=0)
    with pytest.raises(ValueError, match="bound=-1"):
        PLIFLayer(bound=-1.0)
    with pytest.raises(ValueError, match="learning_rate_multiplier=0"):
        PLIFHead(vocab_size=V, learning_rate_multiplier=0)


def test_multipliers_drive_tflm_optimizers():
    """learning_rate_multipliers(model) plugs into tflm.optimizers.SGD: the slopes move
    `multiplier` times as far as they would with the plain learning rate."""
    optimizers = pytest.importorskip("tflm.optimizers")
    rng = np.random.default_rng(8)
    x = rng.normal(size=(4, 5, 16)).astype("float32")
    y = rng.integers(0, V, size=(4, 5))

    def one_step(multiplier):
        keras.utils.set_random_seed(1)
        inp = keras.Input((5, 16))
        head = PLIFHead(vocab_size=V, num_intervals=K, bound=T, init_scale=0.5, seed=2,
                        learning_rate_multiplier=multiplier)
        model = keras.Model(inp, head(inp))
        model.compile(loss=tflm_losses.NLL(), optimizer=optimizers.SGD(
            100.0, learning_rate_multipliers=learning_rate_multipliers(model) or None))
        before = np.array(head.plif.pre_slopes)
        model.train_on_batch(x, y)
        return np.array(head.plif.pre_slopes) - before

    plain, scaled = one_step(None), one_step(0.01)
    assert np.abs(scaled).max() > 1e-4
    # float32 weights near 0.54 resolve changes of ~6e-8
    np.testing.assert_allclose(scaled, 0.01 * plain, rtol=1e-3, atol=2e-7)
