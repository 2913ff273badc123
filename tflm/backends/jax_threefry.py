"""Uniform draws from Threefry-2x32 written in jax.numpy, for the dropout masks (JAX).

Threefry-2x32 with 20 rounds (Salmon, Moraes, Dror and Shaw, "Parallel random numbers: as
easy as 1, 2, 3", SC 2011) is the counter-based generator behind `jax.random`'s default
implementation. On a key (k0, k1) and a counter pair (x0, x1), with k2 = k0 ^ k1 ^
0x1BD11BDA:

    x0 += k0,  x1 += k1
    20 rounds r:  x0 += x1,  x1 = rotl(x1, R[r mod 8]) ^ x0
        R = 13 15 26 6 17 29 16 24
    after round 4 s - 1 (s = 1 .. 5):  x0 += k[s mod 3],  x1 += k[(s + 1) mod 3] + s

`bits(key, n)` hashes the counters 0 .. n - 1 as `jax.extend.random.threefry_2x32(key,
arange(n))` does (first half against second half; a test checks the two agree bit for
bit), and `uniform` turns 32 bits into a float32 in [0, 1) as `jax.random.uniform` does
(23 bits in the mantissa of a number in [1, 2), minus 1).

Why not `jax.random.uniform`: it hashes one counter pair per value (a 64-bit counter)
where this hashes one pair per two values, and XLA compiles its lowering more slowly. On
the 2-core CPU of bench/training/results/reference_throughput.md, the eight dropout masks of the 200 / 400 x 3 PTB
model's train step compiled in 1.1 s and ran in 4.0 ms with `jax.random.uniform`, in
0.95 s and 1.8 ms with the library's `threefry_2x32`, and in 0.6 s and 1.8 ms here (one
thread). The masks keep the generator's statistics; only the bits differ from
`jax.random`'s for the same seed.
"""

import math

import jax.numpy as jnp
from jax import lax

_ROTATIONS = (13, 15, 26, 6, 17, 29, 16, 24)
_PARITY = 0x1BD11BDA


def _rotate_left(x, r):
    return (x << jnp.uint32(r)) | (x >> jnp.uint32(32 - r))


def threefry2x32(key, x0, x1):
    """Threefry-2x32-20 of the counter pairs (x0, x1) (uint32 arrays of one shape) under
    `key` (two uint32 scalars): the two hashed words."""
    k0, k1 = (jnp.asarray(k, jnp.uint32) for k in key)
    schedule = (k0, k1, k0 ^ k1 ^ jnp.uint32(_PARITY))
    x0, x1 = x0 + k0, x1 + k1
    for r in range(20):
        x0 = x0 + x1
        x1 = _rotate_left(x1, _ROTATIONS[r % 8]) ^ x0
        if r % 4 == 3:
            s = r // 4 + 1
            x0 = x0 + schedule[s % 3]
            x1 = x1 + schedule[(s + 1) % 3] + jnp.uint32(s)
    return x0, x1


def bits(key, n):
    """`n` uint32 words: the counters 0 .. n - 1 (one zero appended when n is odd) split
    into halves, hashed pairwise, the halves joined again."""
    half = (n + 1) // 2
    x0 = lax.iota(jnp.uint32, half)
    x1 = x0 + jnp.uint32(half)
    if n % 2:  # the appended zero takes the second half's last place
        x1 = jnp.where(x0 == half - 1, jnp.uint32(0), x1)
    y0, y1 = threefry2x32(key, x0, x1)
    return jnp.concatenate([y0, y1])[:n]


def uniform(key, shape):
    """float32 uniforms in [0, 1) of `shape` from the two-word `key`."""
    words = bits(key, math.prod(int(d) for d in shape))
    mantissas = (words >> jnp.uint32(9)) | jnp.uint32(0x3F800000)
    return (lax.bitcast_convert_type(mantissas, jnp.float32) - 1.0).reshape(tuple(shape))
