"""After `import zoo`, `keras.saving.load_model` rebuilds zoo models (issue 43), whichever of
zoo, tflm and Keras is imported first, and `import zoo` itself still imports no Keras."""

import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

import zoo
from zoo.models import keras_registration, registry

LOAD = """
    import sys
    {imports}
    assert "keras" in sys.modules
    m = keras.saving.load_model(sys.argv[1])
    print(type(m).__module__ + "." + type(m).__name__)
    print(keras.ops.convert_to_numpy(m(np.array([[1, 2, 3]]))).sum())
"""


def _load_in_fresh_process(imports, path):
    script = textwrap.dedent(LOAD.format(imports=imports))
    env = dict(os.environ, KERAS_BACKEND="jax")  # the fastest start; the file is TF-made
    proc = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True,
                          text=True, env=env, cwd="/")
    assert proc.returncode == 0, proc.stderr[-3000:]
    name, total = proc.stdout.split()[-2:]
    return name, float(total)


IMPORT_ORDERS = {
    "zoo_first": "import zoo; assert 'keras' not in sys.modules; import keras, numpy as np",
    "keras_first": "import keras, numpy as np; import zoo",
    "tflm_between": "import zoo, tflm, keras, numpy as np",
}


@pytest.mark.parametrize("order", list(IMPORT_ORDERS))
def test_keras_load_model_after_import_zoo_in_any_order(tiny_run, order):
    """The issue's case (`import zoo` then `keras.saving.load_model`, Keras imported
    later), Keras imported first, and tflm imported between them (tflm then imports
    Keras while zoo waits for it): each rebuilds the AWD-LSTM with the saved weights."""
    path = tiny_run / "best.keras"
    expected = float(keras.ops.convert_to_numpy(
        zoo.load_model(path)(np.array([[1, 2, 3]]))).sum())
    name, total = _load_in_fresh_process(IMPORT_ORDERS[order], path)
    assert name == "zoo.models.awd_lstm.awd_lstm_lm.AWDLSTM"
    np.testing.assert_allclose(total, expected, rtol=1e-4)


def test_every_name_zoo_registers_has_a_stand_in():
    """`registry.SERIALIZABLE` is the whole list: after every family is imported, the "zoo>"
    names Keras knows are exactly its names, each the real class."""
    registry.register_all()
    known = {k: v for k, v in keras.saving.get_custom_objects().items()
             if k.startswith("zoo>")}
    assert set(known) == {f"zoo>{name}" for name in registry.SERIALIZABLE}
    for name, cls in known.items():
        assert not getattr(cls, "zoo_stand_in", False), name
        assert cls.__module__ == registry.SERIALIZABLE[cls.__name__]


def test_a_stand_in_gives_way_to_the_real_class(monkeypatch):
    """A stand-in rebuilds through the real class and is replaced by it; a name already
    registered is left alone."""
    registry.register_all()
    registered = keras.saving.get_custom_objects()
    real = registered["zoo>ZarembaBackbone"]
    monkeypatch.delitem(registered, "zoo>ZarembaBackbone")
    keras_registration.register_stand_ins()
    stand_in = registered["zoo>ZarembaBackbone"]
    assert stand_in.zoo_stand_in and not getattr(registered["zoo>AWDLSTM"], "zoo_stand_in", False)
    layer = real(vocab_size=7, hidden_dim=4, num_layers=1)
    rebuilt = keras.saving.deserialize_keras_object(keras.saving.serialize_keras_object(layer))
    assert type(rebuilt) is real and rebuilt.get_config() == layer.get_config()
    assert registered["zoo>ZarembaBackbone"] is real


def test_import_zoo_imports_no_keras():
    proc = subprocess.run(
        [sys.executable, "-c", "import sys, zoo; print('keras' in sys.modules, "
         "'tensorflow' in sys.modules)"], capture_output=True, text=True, cwd="/")
    assert proc.stdout.split() == ["False", "False"], proc.stderr
