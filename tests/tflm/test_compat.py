"""The private Keras APIs tflm relies on (`tflm.compat`), checked against the installed Keras.

Each test names the private API it guards: when a Keras release renames, moves or changes
one of them, the test with that name fails here instead of training going wrong later."""

import inspect
import json
import re

import keras
import numpy as np
import pytest
from tests.backends import run_in_backend
from tflm import compat
from tflm.backends.lstm_kernels import portable_lstm
from tflm.layers import WeightDropLSTM


def _parameters(fn):
    return set(inspect.signature(fn).parameters)


def test_keras_src_backend_lstm_takes_a_recurrent_matrix_and_refuses_a_cpu():
    from keras.src import backend
    assert {"inputs", "initial_state_h", "initial_state_c", "mask", "kernel",
            "recurrent_kernel", "bias", "activation", "recurrent_activation",
            "return_sequences", "go_backwards", "unroll"} <= _parameters(backend.lstm)
    layer = WeightDropLSTM(4, weight_dropout=0.0)
    x = np.zeros((2, 3, 5), "float32")
    layer.build(x.shape)
    cell = layer.cell
    with pytest.raises(NotImplementedError):  # no cuDNN here: the portable loop takes over
        compat.fused_lstm(x, np.zeros((2, 4), "float32"), np.zeros((2, 4), "float32"), None,
                          cell.kernel, cell.recurrent_kernel, cell.bias,
                          activation=cell.activation,
                          recurrent_activation=cell.recurrent_activation,
                          return_sequences=True, go_backwards=False, unroll=False)


def test_keras_src_backend_rnn_loop_semantics():
    from keras.src import backend
    assert {"step_function", "inputs", "initial_states", "go_backwards", "mask", "unroll",
            "input_length", "zero_output_for_mask", "return_all_outputs"} <= \
        _parameters(backend.rnn)
    # A running sum: masked steps hold the state and give zero outputs.
    x = np.arange(1, 7, dtype="float32").reshape(1, 6, 1)
    mask = np.array([[True, True, False, True, False, False]])
    last, outputs, (state,) = compat.rnn_loop(
        lambda x_t, states: (states[0] + x_t, [states[0] + x_t]), x,
        [np.zeros((1, 1), "float32")], mask=mask, go_backwards=False, unroll=False,
        zero_output_for_mask=True, return_all_outputs=True)
    np.testing.assert_allclose(np.asarray(outputs)[0, :, 0], [1, 3, 0, 7, 0, 0])
    assert float(np.asarray(state)[0, 0]) == 7.0    # the state after the last real step
    assert float(np.asarray(last)[0, 0]) == 0.0     # the (masked) last step's output


def test_portable_loop_equals_keras_lstm():
    layer = WeightDropLSTM(4, weight_dropout=0.0, return_sequences=True)
    ref = keras.layers.LSTM(4, return_sequences=True, use_cudnn=False)
    x = np.random.default_rng(0).normal(size=(2, 5, 3)).astype("float32")
    ref.build(x.shape)
    layer.build(x.shape)
    layer.set_weights(ref.get_weights())
    zeros = [np.zeros((2, 4), "float32")] * 2
    _, outputs, _ = portable_lstm(layer.cell, x, zeros, None, layer.cell.recurrent_kernel)
    np.testing.assert_allclose(np.asarray(outputs), np.asarray(ref(x)), atol=1e-6)


def test_optimizer_get_variable_index():
    assert "variable" in _parameters(keras.optimizers.Optimizer._get_variable_index)
    a, b = keras.Variable(np.zeros(2)), keras.Variable(np.zeros(3))
    opt = keras.optimizers.SGD(0.1)
    opt.build([a, b])
    assert compat.optimizer_variable_index(opt, b) == 1
    assert compat.optimizer_variable_index(opt, a) == 0


def test_layer_flatten_layers_walks_nested_layers():
    inner = keras.layers.Dense(2, name="inner")

    class Outer(keras.layers.Layer):
        def __init__(self):
            super().__init__(name="outer")
            self.wrapped = [inner]

    outer = Outer()
    assert [layer.name for layer in compat.nested_layers(outer)] == ["outer", "inner"]


def test_keras_mask_is_read_from_a_tensor():
    tokens = np.array([[0, 1, 2]])
    masked = keras.layers.Embedding(5, 4, mask_zero=True)(tokens)
    assert keras.ops.convert_to_numpy(compat.keras_mask(masked)).tolist() == [[False, True, True]]
    assert compat.keras_mask(keras.ops.ones((1, 3))) is None


def test_keras_call_is_plain_sees_mixed_precision_autocast_scopes_and_remat():
    plain = keras.layers.Dense(2)
    mixed = keras.layers.Dense(2, dtype="mixed_bfloat16")
    seen = {}

    class MixedParent(keras.layers.Layer):  # its __call__ opens an autocast scope
        def call(self, inputs):
            seen["inside"] = compat.keras_call_is_plain(plain)
            return inputs

    MixedParent(dtype="mixed_bfloat16")(np.ones((1, 3), "float32"))
    assert compat.keras_call_is_plain(plain) and not compat.keras_call_is_plain(mixed)
    assert seen == {"inside": False}
    with keras.RematScope(mode="full"):
        remat = keras.layers.Dense(2)
    assert not compat.keras_call_is_plain(remat)


def test_keras_variable_storage_is_what_value_reads_outside_stateless_scopes():
    total = keras.Variable(np.float64(1.0), trainable=False)
    assert compat.keras_variable_storage(total) is total.value
    with keras.StatelessScope():
        assert compat.keras_variable_storage(total) is None

    class MixedParent(keras.layers.Layer):  # its __call__ opens a float16 autocast scope
        def build(self, input_shape):
            self.w = self.add_weight(shape=(2,), initializer="ones")

        def call(self, inputs):
            seen.append((compat.keras_variable_storage(self.w), self.w.value))
            return inputs

    seen = []
    parent = MixedParent(dtype="mixed_float16")
    parent(np.ones((1, 2), "float32"))
    (storage, value), = seen
    assert keras.backend.standardize_dtype(value.dtype) == "float16"  # a cast copy there
    assert storage is compat.keras_variable_storage(parent.w) is parent.w.value
    assert keras.backend.standardize_dtype(storage.dtype) == "float32"


def test_symbolic_scope_is_visible():
    assert not compat.in_symbolic_scope()
    with keras.SymbolicScope():
        assert compat.in_symbolic_scope()


@pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                    reason="the hook belongs to Keras' TensorFlow trainer")
def test_tensorflow_trainer_builds_through_maybe_symbolic_build():
    from keras.src.backend.tensorflow.trainer import TensorFlowTrainer
    hook = TensorFlowTrainer._maybe_symbolic_build
    assert {"iterator", "data_batch"} <= _parameters(hook)
    for method in ("fit", "evaluate", "train_on_batch", "test_on_batch"):
        assert "_maybe_symbolic_build" in inspect.getsource(getattr(TensorFlowTrainer, method))
    calls = []

    class Model(compat.TokenWindowBuild, keras.Model):
        def __init__(self):
            super().__init__()
            self.dense = keras.layers.Dense(2)

        def build_under_strategy(self):
            calls.append(1)
            return False

        def call(self, x):
            return self.dense(x)

    model = Model()
    model.compile(optimizer="sgd", loss="mse")
    model.fit(np.zeros((4, 2), "float32"), np.zeros((4, 2), "float32"), verbose=0)
    assert calls, "Keras no longer calls _maybe_symbolic_build from fit"


def _product_sources():
    from tests.conftest import REPO
    for folder in ("tflm", "zoo", "tools", "bench"):
        for path in sorted((REPO / folder).rglob("*.py")):
            yield path.relative_to(REPO).as_posix(), path.read_text(encoding="utf-8")


def test_private_apis_are_used_only_in_the_compat_module():
    private = [r"keras\.src\b", r"\btorch\._[a-zA-Z]", r"\._flatten_layers\b",
               r"\._get_variable_index\b", r"_symbolic_build\b", r"\._distribute_strategy\b",
               r"\._jax_state", r"\._iterations\b", r"\._trainable_variables\b",
               r"set_keras_mask", r"_in_multi_worker_mode", r"\bjax\._src\b",
               r"_backend_update_step\b"]
    offenders = [f"{name}: {pattern}" for name, text in _product_sources()
                 if name != "tflm/compat.py" for pattern in private
                 if re.search(pattern, text)]
    assert not offenders, offenders


def test_jax_backend_started_after_the_first_array_only():
    """xla_bridge.backends_are_initialized: False after `import jax`, True after an array."""
    code = ("import json; from tflm import compat; a = compat.jax_backend_started(); "
            "import jax; b = compat.jax_backend_started(); jax.numpy.ones(2); "
            "print(json.dumps([a, b, compat.jax_backend_started()]))")
    out = run_in_backend("jax", code, fresh=True)  # before JAX is imported, too
    assert json.loads(out.strip().splitlines()[-1]) == [False, False, True]


def test_no_backend_checks_in_the_language_model_or_the_layers():
    offenders = [name for name, text in _product_sources()
                 if (name == "tflm/language_model.py" or name.startswith("tflm/layers/")
                     or name.startswith("zoo/awd_lstm") or name == "zoo/models/awd_lstm/awd_lstm_backbone.py")
                 and "backend.backend()" in text]
    assert not offenders, offenders


def test_torch_mkldnn_linear_and_its_backward_ops():
    torch = pytest.importorskip("torch")
    if not torch.backends.mkldnn.is_available():
        pytest.skip("PyTorch without oneDNN")
    rng = np.random.default_rng(1)
    x, w = rng.normal(size=(6, 4)).astype("float32"), rng.normal(size=(5, 4)).astype("float32")
    b, g = rng.normal(size=(5,)).astype("float32"), rng.normal(size=(6, 5)).astype("float32")
    y = compat.onednn_linear(torch.tensor(x), torch.tensor(w), torch.tensor(b))
    assert y.layout == torch.strided  # dense, as every other op expects
    np.testing.assert_allclose(y.numpy(), x @ w.T + b, rtol=1e-5, atol=1e-5)
    for bias_defined in (True, False):
        dx, dw, db = compat.onednn_linear_backward(torch.tensor(x), torch.tensor(g),
                                                   torch.tensor(w), bias_defined)
        assert dx.layout == torch.strided and dw.layout == torch.strided
        np.testing.assert_allclose(dx.numpy(), g @ w, rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(dw.numpy(), g.T @ x, rtol=1e-5, atol=1e-5)
        if bias_defined:
            np.testing.assert_allclose(db.numpy(), g.sum(0), rtol=1e-5, atol=1e-5)
        else:
            assert db is None


def test_optimizer_backend_update_step_is_the_per_variable_loop():
    """BaseOptimizer._backend_update_step(grads, trainable_variables, learning_rate): what
    `apply` calls to update the variables. `compat.WholeUpdateStep` replaces it: True from
    `update_variables` skips the per-variable `update_step`s, False runs them."""
    from keras.src.optimizers.base_optimizer import BaseOptimizer
    assert list(inspect.signature(BaseOptimizer._backend_update_step).parameters) == [
        "self", "grads", "trainable_variables", "learning_rate"]

    class Probe(compat.WholeUpdateStep, keras.optimizers.Optimizer):
        def __init__(self, together):
            super().__init__(learning_rate=0.5)
            self.together, self.calls = together, []

        def update_variables(self, grads, variables, learning_rate):
            self.calls.append(("together", len(variables)))
            if self.together:
                for g, v in zip(grads, variables):
                    v.assign_sub(g * learning_rate)
            return self.together

        def update_step(self, gradient, variable, learning_rate):
            self.calls.append(("one",))
            variable.assign_sub(gradient * learning_rate)

    for together in (True, False):
        variables = [keras.Variable(np.ones(2, "float32"), name=n) for n in "ab"]
        probe = Probe(together)
        probe.apply([np.full(2, 2.0, "float32")] * 2, variables)
        want = [("together", 2)] + ([] if together else [("one",), ("one",)])
        assert probe.calls == want
        for v in variables:
            np.testing.assert_array_equal(np.asarray(v), np.zeros(2))


def test_torch_foreach_kernels():
    """torch._foreach_norm / _foreach_mul (a 0-d tensor and a number) / _foreach_sub_ /
    _foreach_add_ against NumPy."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(2)
    a = [rng.normal(size=s).astype("float32") for s in ((3, 4), (5,))]
    b = [rng.normal(size=x.shape).astype("float32") for x in a]
    ta, tb = [torch.tensor(x) for x in a], [torch.tensor(x) for x in b]
    norms = [float(n) for n in compat.torch_foreach_norm(ta)]
    np.testing.assert_allclose(norms, [np.linalg.norm(x) for x in a], rtol=1e-6)
    for factor in (torch.tensor(0.25), 0.25):
        for got, x in zip(compat.torch_foreach_mul(ta, factor), a):
            np.testing.assert_array_equal(got.numpy(), x * np.float32(0.25))
    compat.torch_foreach_sub_(ta, tb)
    for got, x, y in zip(ta, a, b):
        np.testing.assert_array_equal(got.numpy(), x - y)
    compat.torch_foreach_add_(ta, tb)
    for got, x, y in zip(ta, a, b):
        np.testing.assert_array_equal(got.numpy(), (x - y) + y)
