"""`LanguageModel.xla_evaluation` on TensorFlow: evaluation compiled with XLA on a CPU gives
the same figures for every head, and is used only where it applies."""

import numpy as np
import pytest
import keras

import zoo
from tflm import backends, data

pytestmark = pytest.mark.skipif(keras.backend.backend() != "tensorflow",
                                reason="XLA evaluation is TensorFlow's")

V = 30
TINY = dict(embed_dim=8, hidden_dim=12, num_layers=2, seed=1, bptt=6)
HEADS = {"softmax": {}, "mos": {"num_experts": 3}, "moc": {"num_experts": 3}, "gss": {},
         "ss": {}, "plif": {"num_intervals": 50}, "mixtape": {},
         "doc": {"num_components_per_layer": [2, 3]},
         "node": {}, "cnf": {}, "ccnf": {"num_samples": 4}}


def _model(name):
    model = zoo.AWDLSTM(V, head={"type": name, **HEADS[name]}, **TINY)
    model.compile(optimizer=keras.optimizers.SGD(1.0))
    return model


@pytest.mark.parametrize("name", sorted(HEADS))
def test_every_head_evaluates_the_same_under_xla(name):
    ids = np.random.default_rng(0).integers(0, V, 4 * 6 * 5 + 3)  # a shorter last window
    model = _model(name)
    results = []
    for xla in (False, True):
        model.xla_evaluation = xla
        model.make_test_function(force=True)
        results.append(model.evaluate(data.lm_dataset(ids, 4, 6, train=False), verbose=0,
                                      return_dict=True)["perplexity"])
    assert results[1] == pytest.approx(results[0], rel=1e-4)
    assert model.jit_compile is False  # training keeps Keras' choice


def test_xla_only_where_it_applies():
    model = _model("softmax")
    model.build()
    seen = []

    def make(force):
        seen.append(model.jit_compile)

    backend = backends.current()
    backend.make_test_function(model, make, force=True)
    model.xla_evaluation = True
    backend.make_test_function(model, make, force=True)
    model.run_eagerly = True
    backend.make_test_function(model, make, force=True)
    assert seen == [False, True, False]
    assert model.jit_compile is False


def test_zoo_compiles_only_passes_long_enough_to_repay_it():
    from zoo.runs.final_evaluation import XLA_MIN_WINDOWS, xla_pays
    long = np.zeros(XLA_MIN_WINDOWS * 35, "int32")  # batch 1, bptt 35: exactly enough
    assert xla_pays("auto", long, 1, 35)
    assert not xla_pays("auto", long[:-1], 1, 35)
    assert not xla_pays("auto", long, 10, 35)       # a tenth of the windows at batch 10
    assert xla_pays(True, long[:10], 1, 35) and not xla_pays(False, long, 1, 35)
