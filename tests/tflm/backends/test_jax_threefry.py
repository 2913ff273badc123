"""`tflm.backends.jax_threefry`: the same bits as JAX's Threefry-2x32, uniforms with the
statistics a dropout mask relies on, and the dropout layers drawing from it on JAX with a
fresh mask per call, in eager code and in a compiled stateless step."""

import json

from tests.backends import run_in_backend

BITS = r"""
import json
import numpy as np
import jax.numpy as jnp
from jax.extend.random import threefry_2x32
from tflm.backends import jax_threefry

rng = np.random.default_rng(0)
agree = {}
for n in (1, 2, 3, 8, 1001, 640000):
    key = rng.integers(0, 2 ** 32, 2, dtype=np.uint64).astype(np.uint32)
    ours = np.asarray(jax_threefry.bits((key[0], key[1]), n))
    library = np.asarray(threefry_2x32(jnp.asarray(key), jnp.arange(n, dtype=jnp.uint32)))
    agree[n] = bool(ours.shape == (n,) and np.array_equal(ours, library))
print(json.dumps(agree))
"""


def test_bits_equal_the_librarys_threefry_2x32():
    agree = json.loads(run_in_backend("jax", BITS).strip().splitlines()[-1])
    assert agree == {"1": True, "2": True, "3": True, "8": True, "1001": True,
                     "640000": True}


STATISTICS = r"""
import json
import numpy as np
from tflm.backends import jax_threefry

n = 400 * 1600
u = np.asarray(jax_threefry.uniform((np.uint32(7), np.uint32(11)), (400, 1600))).ravel()
# the next key of a SeedGenerator (its second word plus one), and a first word one apart
v = np.asarray(jax_threefry.uniform((np.uint32(7), np.uint32(12)), (n,)))
w = np.asarray(jax_threefry.uniform((np.uint32(8), np.uint32(11)), (n,)))
counts = np.bincount(np.minimum((u * 16).astype(int), 15), minlength=16)
expected = n / 16
mantissa = (np.asarray(jax_threefry.bits((np.uint32(7), np.uint32(11)), n)) >> 9)
print(json.dumps({
    "dtype": str(u.dtype), "min": float(u.min()), "max": float(u.max()),
    "mean": float(u.mean()),
    "chi2": float(((counts - expected) ** 2 / expected).sum()),
    "lag1": float(np.corrcoef(u[1:], u[:-1])[0, 1]),
    "halves": float(np.corrcoef(u[: n // 2], u[n // 2:])[0, 1]),
    "next key": float(np.corrcoef(u, v)[0, 1]),
    "other key": float(np.corrcoef(u, w)[0, 1]),
    "bit frequencies": [float(((mantissa >> b) & 1).mean()) for b in range(23)],
}))
"""


def test_uniforms_are_uniform_and_independent_across_positions_and_keys():
    s = json.loads(run_in_backend("jax", STATISTICS).strip().splitlines()[-1])
    n = 400 * 1600
    sigma_mean = (1 / 12 / n) ** 0.5
    assert s["dtype"] == "float32" and 0.0 <= s["min"] and s["max"] < 1.0
    assert abs(s["mean"] - 0.5) < 5 * sigma_mean
    assert s["chi2"] < 44.3  # 15 degrees of freedom: p = 1e-4
    for name in ("lag1", "halves", "next key", "other key"):
        assert abs(s[name]) < 5 / n ** 0.5, (name, s[name])
    sigma_bit = (0.25 / n) ** 0.5
    for b, frequency in enumerate(s["bit frequencies"]):
        assert abs(frequency - 0.5) < 5 * sigma_bit, (b, frequency)


LAYERS = r"""
import json
import numpy as np, jax, keras
from keras import ops
from tflm.layers import EmbeddingDropout, LockedDropout, WeightDropLSTM

out = {}
layer = LockedDropout(0.3, seed=3)
x = np.ones((400, 3, 200), "float32")
a, b = (ops.convert_to_numpy(layer(x, training=True)) for _ in range(2))
out["locked"] = [float((a[:, 0] > 0).mean()), bool(np.array_equal(a[:, 0], a[:, 2])),
                 bool(np.array_equal(a, b)),
                 bool(np.array_equal(a, ops.convert_to_numpy(
                     LockedDropout(0.3, seed=3)(x, training=True))))]
cell = WeightDropLSTM(400, weight_dropout=0.5, seed=0)
cell.build((None, None, 8))
m1, m2 = (ops.convert_to_numpy(cell.recurrent_kernel_mask()) for _ in range(2))
out["weight drop"] = [float((m1 == 0).mean()), bool(np.array_equal(m1, m2))]
words = EmbeddingDropout(vocab_size=20000, rate=0.1, seed=2)
r1, r2 = (ops.convert_to_numpy(words.row_mask()) for _ in range(2))
out["embedding"] = [float((r1 == 0).mean()), bool(np.array_equal(r1, r2))]

# in a compiled stateless step the seed state goes in and comes out advanced
state = layer.seed_generator.state


@jax.jit
def step(seed_state):
    with keras.StatelessScope(state_mapping=[(state, seed_state)]) as scope:
        y = layer(x, training=True)
    return y, scope.get_current_value(state)


s0 = state.value
y1, s1 = step(s0)
y2, s2 = step(s1)
out["compiled"] = [bool(np.array_equal(np.asarray(s0), np.asarray(s1))),
                   bool(np.array_equal(np.asarray(y1), np.asarray(y2)))]
print(json.dumps(out))
"""


def test_dropout_layers_draw_fresh_bernoulli_masks_on_jax():
    out = json.loads(run_in_backend("jax", LAYERS).strip().splitlines()[-1])
    kept, over_time, repeated, reproduced = out["locked"]
    assert abs(kept - 0.7) < 5 * (0.21 / 80000) ** 0.5
    assert over_time and not repeated and reproduced  # locked over time, seeded
    dropped, repeated = out["weight drop"]
    assert abs(dropped - 0.5) < 5 * (0.25 / 640000) ** 0.5 and not repeated
    dropped, repeated = out["embedding"]
    assert abs(dropped - 0.1) < 5 * (0.09 / 20000) ** 0.5 and not repeated
    assert out["compiled"] == [False, False]
