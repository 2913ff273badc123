"""SGD with learning-rate multipliers, AveragedSGD (torch ASGD semantics), weight swapping,
flooding."""

import numpy as np
import pytest
import keras
import tensorflow as tf

from tflm.flooding import flood, flood_sign
from tflm.optimizers import (SGD, AveragedSGD, averaged_weights, find_averaged_optimizer,
                             start_finetune)

C = np.array([1.0, 0.5, 2.0, -0.25], "float32")  # toy quadratic f = 0.5 * sum(C * w^2)
W0 = np.array([1.0, -2.0, 3.0, 0.5], "float32")


def _grad(w):
    return C * np.asarray(w)  # known gradient of the quadratic


def _run(opt, steps, var=None, start_after=None, graph=False):
    """Take `steps` steps on the quadratic; start averaging after `start_after` steps.
    Returns (variable, list of iterates after each step)."""
    var = var if var is not None else keras.Variable(W0.copy(), name="w")
    apply = tf.function(lambda g: opt.apply([g], [var])) if graph else (
        lambda g: opt.apply([g], [var]))
    iterates = []
    for step in range(steps):
        if start_after is not None and step == start_after:
            opt.start_averaging_now()
        apply(tf.constant(_grad(var.numpy())))
        iterates.append(var.numpy().copy())
    return var, iterates


# ---- SGD ------------------------------------------------------------------------------
def test_averaged_sgd_before_averaging_is_keras_sgd_bit_for_bit():
    rng = np.random.default_rng(0)
    grads = rng.normal(size=(6, 4)).astype("float32")
    ours, ref = keras.Variable(W0.copy()), keras.Variable(W0.copy())
    opt, keras_sgd = AveragedSGD(0.37), keras.optimizers.SGD(0.37)
    for g in grads:
        opt.apply([tf.constant(g)], [ours])
        keras_sgd.apply([tf.constant(g)], [ref])
        assert ours.numpy().tobytes() == ref.numpy().tobytes()
    assert not opt.is_averaging and opt.average_count == 0
    np.testing.assert_array_equal(opt.average_variables[0].numpy(), np.zeros(4, "float32"))


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf.function"])
def test_average_is_mean_of_iterates_2_to_k_as_torch_asgd(graph):
    opt = AveragedSGD(0.1)
    _, iterates = _run(opt, 6, start_after=1, graph=graph)  # 1 SGD step, then k = 1..5
    averaged = np.asarray(iterates[1:])  # theta_1..theta_5 of the averaged phase
    assert opt.average_count == 5 and opt.start_iteration == 1
    avg = opt.average_variables[0].numpy()
    np.testing.assert_allclose(avg, averaged[1:].mean(0), rtol=1e-6)  # mean(theta_2..theta_5)
    assert not np.allclose(avg, averaged.mean(0), rtol=1e-4), "theta_1 must drop out"
    # bit-exact against a float32 transcription of the documented recursion
    ref = averaged[0].copy()
    for k in range(2, 6):
        ref = averaged[k - 1] if k <= 2 else ref + (averaged[k - 1] - ref) * np.float32(1 / (k - 1))
    assert avg.tobytes() == ref.astype("float32").tobytes()


def test_traced_averaging_is_one_cond_for_all_variables_and_averages_each():
    # One `cond` on "averaging active" for every variable's average (a cond per variable
    # cost the PTB model's trace ~0.5 s); each average stays the mean of its own iterates.
    rng = np.random.default_rng(3)
    variables = [keras.Variable(rng.normal(size=shape).astype("float32"), name=f"w{i}")
                 for i, shape in enumerate([(4,), (2, 3), (5,)])]
    opt = AveragedSGD(0.1, start_averaging=1)
    opt.build(variables)
    step = tf.function(lambda grads: opt.apply(grads, variables))
    grads = [[tf.constant(rng.normal(size=v.shape).astype("float32")) for v in variables]
             for _ in range(5)]
    graph = step.get_concrete_function(grads[0]).graph
    conds = [op for op in graph.get_operations() if op.type in ("If", "StatelessIf")]
    assert len(conds) == 1, [op.name for op in conds]
    iterates = []
    for g in grads:
        step(g)
        iterates.append([v.numpy().copy() for v in variables])
    assert opt.average_count == 4  # steps 2..5 averaged (start_averaging=1: iteration 1 on)
    for i, average in enumerate(opt.average_variables):
        # the averaged phase's iterates but its first (torch.optim.ASGD drops it)
        expected = np.mean([it[i] for it in iterates[2:]], axis=0)
        np.testing.assert_allclose(average.numpy(), expected, rtol=1e-5, atol=1e-6)


def test_average_matches_torch_optim_asgd_as_the_reference_uses_it():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    grads = rng.normal(size=(7, 4)).astype("float32")
    var, opt = keras.Variable(W0.copy()), AveragedSGD(0.5)
    param = torch.nn.Parameter(torch.tensor(W0.copy()))
    sgd = torch.optim.SGD([param], lr=0.5)
    for i, g in enumerate(grads):
        if i == 2:  # the reference's switch: a fresh ASGD(t0=0, lambd=0)
            opt.start_averaging_now()
            sgd = torch.optim.ASGD([param], lr=0.5, t0=0, lambd=0.0)
        opt.apply([tf.constant(g)], [var])
        param.grad = torch.tensor(g)
        sgd.step()
        np.testing.assert_allclose(var.numpy(), param.detach().numpy(), rtol=1e-6, atol=1e-7)
        if i >= 2:
            np.testing.assert_allclose(opt.average_variables[0].numpy(),
                                       sgd.state[param]["ax"].numpy(), rtol=1e-6, atol=1e-7)


def test_start_averaging_argument_is_an_iteration():
    opt = AveragedSGD(0.1, start_averaging=3)
    _, iterates = _run(opt, 7)  # steps taken at iterations 3..6 are k = 1..4
    assert opt.average_count == 4
    np.testing.assert_allclose(opt.average_variables[0].numpy(),
                               np.mean(iterates[4:], 0), rtol=1e-6)


def test_optimizer_memory_does_not_grow_with_steps():
    var, opt = keras.Variable(W0.copy()), AveragedSGD(0.1, start_averaging=0)
    _run(opt, 1, var)
    sizes = [int(np.prod(v.shape)) for v in opt.variables]
    _run(opt, 25, var)
    assert [int(np.prod(v.shape)) for v in opt.variables] == sizes
    # iteration, lr, start, count, previous window scale + one average
    assert len(opt.variables) == 5 + 1


def test_swap_is_an_exact_involution_and_context_manager_restores_bits():
    var, opt = keras.Variable(W0.copy()), AveragedSGD(0.3)
    _run(opt, 5, var, start_after=1)
    raw, avg = var.numpy().copy(), opt.average_variables[0].numpy().copy()
    assert not np.array_equal(raw, avg)
    opt.swap_average_weights()
    assert var.numpy().tobytes() == avg.tobytes()
    assert opt.average_variables[0].numpy().tobytes() == raw.tobytes()
    opt.swap_average_weights([var])
    assert var.numpy().tobytes() == raw.tobytes()
    assert opt.average_variables[0].numpy().tobytes() == avg.tobytes()

    holder = type("M", (), {"optimizer": opt})()
    with pytest.raises(RuntimeError, match="boom"):
        with averaged_weights(holder) as averaged:
            assert averaged
            assert var.numpy().tobytes() == avg.tobytes()
            with averaged_weights(holder) as nested:  # nested use is a no-op
                assert not nested
            raise RuntimeError("boom")
    assert var.numpy().tobytes() == raw.tobytes()
    assert opt.average_variables[0].numpy().tobytes() == avg.tobytes()


def test_averaged_weights_does_nothing_before_any_averaged_step():
    var, opt = keras.Variable(W0.copy()), AveragedSGD(0.3)
    _run(opt, 2, var)
    holder = type("M", (), {"optimizer": opt})()
    before = var.numpy().copy()
    with averaged_weights(holder) as averaged:  # not averaging: the average is all zeros
        assert not averaged
        np.testing.assert_array_equal(var.numpy(), before)
    opt.start_averaging_now()
    assert opt.is_averaging and not opt.has_average
    with averaged_weights(holder) as averaged:
        assert not averaged
        np.testing.assert_array_equal(var.numpy(), before)
    plain = type("M", (), {"optimizer": keras.optimizers.SGD(0.1)})()
    with averaged_weights(plain) as averaged:
        assert not averaged


@pytest.mark.parametrize("cls", [SGD, AveragedSGD])
def test_learning_rate_multipliers_scale_only_matching_variables(cls):
    a = keras.Variable(np.ones(3, "float32"), name="kernel")
    b = keras.Variable(np.ones(2, "float32"), name="slopes")
    opt = cls(2.0, learning_rate_multipliers={"slopes": 0.25})
    if cls is AveragedSGD:
        opt.start_averaging_now()
    opt.apply([tf.fill((3,), 0.5), tf.fill((2,), 0.5)], [a, b])
    np.testing.assert_allclose(a.numpy(), 1 - 2.0 * 0.5)
    np.testing.assert_allclose(b.numpy(), 1 - 2.0 * 0.25 * 0.5)
    assert opt.multiplier_of(a) == 1.0 and opt.multiplier_of(b) == 0.25
    exact = cls(2.0, learning_rate_multipliers={b.path: 0.1, "slo": 3.0})  # exact path wins
    exact.build([a, b])
    assert exact.multiplier_of(b) == 0.1 and exact.multiplier_of(a) == 1.0


def test_learning_rate_multiplier_errors_name_the_bad_key():
    va = keras.Variable(np.ones(3, "float32"), name="alpha")
    with pytest.raises(ValueError, match="'nope'"):
        SGD(1.0, learning_rate_multipliers={"nope": 0.5}).build([va])
    with pytest.raises(ValueError, match="different multipliers"):
        SGD(1.0, learning_rate_multipliers={"alp": 0.5, "pha": 0.1}).build([va])
    with pytest.raises(ValueError, match="-1"):
        SGD(1.0, learning_rate_multipliers={"alpha": -1})
    with pytest.raises(ValueError, match="dict"):
        SGD(1.0, learning_rate_multipliers=[("alpha", 1.0)])


def test_constructor_errors_name_the_bad_value():
    with pytest.raises(ValueError, match="-3"):
        AveragedSGD(1.0, start_averaging=-3)
    with pytest.raises(ValueError, match="2.5"):
        AveragedSGD(1.0, start_averaging=2.5)
    with pytest.raises(ValueError, match="-0.5"):
        AveragedSGD(-0.5)
    with pytest.raises(ValueError, match="gradient_accumulation_steps"):
        AveragedSGD(1.0, gradient_accumulation_steps=4)
    assert float(AveragedSGD(30).learning_rate.numpy()) == 30.0  # ints are fine


def test_config_round_trip_keeps_start_and_multipliers():
    opt = AveragedSGD(12.0, start_averaging=7, learning_rate_multipliers={"plif": 0.5},
                      name="asgd")
    config = opt.get_config()
    assert config["start_averaging"] == 7 and config["learning_rate_multipliers"] == {"plif": 0.5}
    again = AveragedSGD.from_config(config)
    assert again.get_config() == config
    restored = keras.optimizers.deserialize(keras.optimizers.serialize(opt))
    assert type(restored) is AveragedSGD and restored.get_config() == config
    opt.start_averaging_now()  # at iteration 0 -> the config reports the live value
    assert opt.get_config()["start_averaging"] == 0
    plain = SGD(3.0, learning_rate_multipliers={"x": 2.0})
    assert SGD.from_config(plain.get_config()).get_config() == plain.get_config()


def test_restart_and_start_finetune_average_from_the_averaged_weights():
    var, opt = keras.Variable(W0.copy()), AveragedSGD(0.2)
    _run(opt, 4, var, start_after=0)
    avg = opt.average_variables[0].numpy().copy()
    holder = type("M", (), {"optimizer": opt, "trainable_variables": [var]})()
    assert start_finetune(holder) is opt
    np.testing.assert_array_equal(var.numpy(), avg)
    assert opt.is_averaging and opt.average_count == 0 and not opt.has_average
    assert opt.start_iteration == 4
    _, iterates = _run(opt, 1, var)
    np.testing.assert_array_equal(opt.average_variables[0].numpy(), iterates[0])  # k = 1
    with pytest.raises(TypeError, match="SGD"):
        start_finetune(type("M", (), {"optimizer": keras.optimizers.SGD(0.1)})())
    opt.stop_averaging()  # back to plain SGD: the average stays as it was
    frozen = opt.average_variables[0].numpy().copy()
    _run(opt, 2, var)
    assert not opt.is_averaging and opt.average_count == 1
    np.testing.assert_array_equal(opt.average_variables[0].numpy(), frozen)


def test_find_averaged_optimizer_looks_inside_loss_scale_wrapper():
    opt = AveragedSGD(1.0)
    wrapped = keras.optimizers.LossScaleOptimizer(opt)
    assert find_averaged_optimizer(wrapped) is opt
    assert find_averaged_optimizer(keras.optimizers.SGD(1.0)) is None


# ---- flooding -------------------------------------------------------------------------
def test_flood_value_and_gradient_sign():
    w = tf.Variable(2.0)
    for level, sign in ((1.0, 1.0), (5.0, -1.0)):
        with tf.GradientTape() as tape:
            loss = w ** 2  # 4.0, dL/dw = 4
            flooded = flood(loss, level)
        assert float(flooded) == pytest.approx(abs(4.0 - level) + level)
        assert float(tape.gradient(flooded, w)) == pytest.approx(sign * 4.0)
        assert float(flood_sign(loss, level)) == sign
    loss = tf.constant(0.7)
    assert flood(loss, None) is loss and float(flood_sign(loss, None)) == 1.0
    assert float(flood(tf.constant(0.5), 1.0)) == 1.5


def test_flood_rejects_bad_levels():
    for bad in (-0.1, float("nan"), "high"):
        with pytest.raises(ValueError, match="flooding level"):
            flood(tf.constant(1.0), bad)


@pytest.mark.parametrize("norm_scale", [1e-6, 1e-3, 10.0])
def test_clipping_is_torch_clip_grad_norm(norm_scale):
    """Factor clip / (norm + 1e-6), at most 1, as torch.nn.utils.clip_grad_norm_; at tiny
    norms the 1e-6 is most of the factor (1e-6 / (2e-6 + 1e-6) = 1/3, not 1/2)."""
    torch = pytest.importorskip("torch")
    from tflm import backends
    from tflm.backends.gradients import clip_and_scale
    rng = np.random.default_rng(4)
    grads = [rng.normal(size=s).astype("float32") for s in ((3, 4), (5,))]
    total = np.sqrt(sum((g ** 2).sum() for g in grads))
    grads = [g * (2 * norm_scale / total) for g in grads]  # global norm 2 * norm_scale
    clipped, norm = clip_and_scale(backends.current(), [tf.constant(g) for g in grads],
                                   norm_scale, 1.0)
    params = [torch.nn.Parameter(torch.zeros(g.shape)) for g in grads]
    for p, g in zip(params, grads):
        p.grad = torch.as_tensor(g)
    torch.nn.utils.clip_grad_norm_(params, norm_scale)
    assert float(norm) == pytest.approx(2 * norm_scale, rel=1e-5)
    for ours, p in zip(clipped, params):
        np.testing.assert_allclose(np.asarray(ours), p.grad.numpy(), rtol=1e-5)


def test_clip_norm_of_sparse_gradients_counts_repeated_rows_once_summed():
    """A gathered variable's gradient is tf.IndexedSlices with a row per lookup (an untied
    input embedding, a sampled softmax's rows; after a replica all-reduce, one per replica):
    the norm is the dense gradient's (rows summed per index, as torch's .grad), not the
    slices' (which undercounts repeated words and made replicated sampled training clip
    differently from one device)."""
    torch = pytest.importorskip("torch")
    from tflm import backends
    from tflm.backends.gradients import clip_and_scale
    rng = np.random.default_rng(5)
    values = rng.normal(size=(6, 3)).astype("float32")
    indices = np.array([2, 0, 2, 2, 4, 0], "int32")
    sparse = tf.IndexedSlices(tf.constant(values), tf.constant(indices), tf.constant([5, 3]))
    dense = tf.convert_to_tensor(sparse).numpy()
    other = rng.normal(size=(4,)).astype("float32")
    clipped, norm = clip_and_scale(backends.current(), [sparse, tf.constant(other)], 0.5, 1.0)
    params = [torch.nn.Parameter(torch.zeros(dense.shape)), torch.nn.Parameter(torch.zeros(4))]
    params[0].grad, params[1].grad = torch.as_tensor(dense), torch.as_tensor(other)
    want = float(torch.nn.utils.clip_grad_norm_(params, 0.5))
    assert float(norm) == pytest.approx(want, rel=1e-6)
    np.testing.assert_allclose(tf.convert_to_tensor(clipped[0]).numpy(),
                               params[0].grad.numpy(), rtol=1e-5)
