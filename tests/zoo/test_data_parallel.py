"""Multi-device on JAX the Keras 3 way (issue 43): `zoo.train --strategy data-parallel` runs
under `keras.distribution.DataParallel` on two host devices
(`--xla_force_host_platform_device_count=2`), its carried LSTM state sharded by stream, and
trains as one device does; batch sizes the devices do not divide and the other backends get
a clear error."""

import json

import pytest

from tests.backends import run_in_backend
from tests.conftest import TINY_RUN_FLAGS

TWO_DEVICES = """
import os
os.environ["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"
import jax
assert len(jax.devices()) == 2, jax.devices()
"""


def test_data_parallel_training_equals_one_device(tmp_path):
    """Two epochs of the same seed, dropout on, with and without `--strategy data-parallel`:
    the same masks (per stream, whichever device holds it) and the same updates, so the
    same curve up to float summation order."""
    runs = {name: tmp_path / name for name in ("one", "two")}
    printed = run_in_backend("jax", TWO_DEVICES + f"""
import json, pathlib
import keras
from zoo import train
flags = {TINY_RUN_FLAGS!r}
assert train.main(["--epochs", "2", "--seed", "5", "--out", {str(runs["one"])!r}, *flags]) == 0
assert train.main(["--epochs", "2", "--seed", "5", "--out", {str(runs["two"])!r},
                   "--strategy", "data-parallel", *flags]) == 0
assert keras.distribution.distribution() is None  # the run leaves none behind
folders = {{"one": {str(runs["one"])!r}, "two": {str(runs["two"])!r}}}
print(json.dumps({{n: json.loads(pathlib.Path(p, "metrics.json").read_text())
                  for n, p in folders.items()}}))
""", timeout=600)
    metrics = json.loads(printed.splitlines()[-1])
    one, two = metrics["one"]["history"], metrics["two"]["history"]
    for a, b in zip(one, two):
        for key in ("loss", "val_perplexity", "grad_norm"):
            assert b[key] == pytest.approx(a[key], rel=2e-4), (key, a[key], b[key])
    # one program for the whole run on both (device arrays are padded as NumPy ones are)
    assert [h["train_step_traces"] for h in one] == [h["train_step_traces"] for h in two]
    assert sum(h["train_step_traces"] for h in two) == 1, two
    assert metrics["two"]["test_perplexity"] == pytest.approx(metrics["one"]["test_perplexity"],
                                                              rel=2e-4)


def test_the_carried_state_is_sharded_by_stream_and_the_weights_replicated():
    printed = run_in_backend("jax", TWO_DEVICES + """
import numpy as np
import keras
import zoo
from tflm import distribute
distribute.data_parallel(batch_sizes=(8,))
model = zoo.AWDLSTM(vocab_size=30, embed_dim=8, hidden_dim=12, num_layers=2)
model.compile(optimizer=keras.optimizers.SGD(1.0))
x = np.random.default_rng(0).integers(0, 30, size=(8, 5))
model.fit(x, x, batch_size=8, epochs=1, verbose=0)
states = model.stream_state(True).variables()
assert len(states) == 4
for v in states:
    shards = sorted((s.index[0].start or 0, s.index[0].stop) for s in v.value.addressable_shards)
    print("state", v.shape, shards)
kernel = model.trainable_weights[0].value
print("weight", {tuple(str(i) for i in s.index) for s in kernel.addressable_shards})
""")
    lines = printed.splitlines()
    states = [line for line in lines if line.startswith("state")]
    assert len(states) == 4 and all(line.endswith("[(0, 4), (4, 8)]") for line in states)
    weight = [line for line in lines if line.startswith("weight")]
    assert weight == ["weight {('slice(None, None, None)', 'slice(None, None, None)')}"]


def test_batches_the_devices_do_not_divide_are_refused_before_training():
    printed = run_in_backend("jax", TWO_DEVICES + """
from tflm import distribute
try:
    distribute.data_parallel(batch_sizes=(20, 5))
except ValueError as err:
    print(err)
""")
    assert "a batch of 5 streams does not split over 2 devices under data-parallel" in printed


def test_data_parallel_on_tensorflow_points_to_mirrored():
    import keras
    from tflm import distribute
    if keras.backend.backend() != "tensorflow":
        pytest.skip("the TensorFlow session's check")
    with pytest.raises(ValueError, match="on TensorFlow use the 'mirrored' strategy"):
        distribute.data_parallel()
    with pytest.raises(ValueError, match="'data-parallel' is keras.distribution.DataParallel"):
        distribute.get_strategy("data-parallel")
