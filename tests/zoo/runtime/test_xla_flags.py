"""`zoo.runtime.xla_flags`: XLA's older CPU emitters and -O2 for a JAX run, only where known."""

import json
import os

import numpy as np
import pytest

from tests.backends import run_in_backend
from zoo.runtime import xla_flags

EMITTERS, LEVEL = xla_flags.FUSION_EMITTERS, xla_flags.OPTIMIZATION_LEVEL


@pytest.fixture
def clean(monkeypatch):
    monkeypatch.delenv(xla_flags.OPT_OUT, raising=False)
    monkeypatch.delenv("XLA_FLAGS", raising=False)
    monkeypatch.setenv("JAX_PLATFORMS", "cpu")
    monkeypatch.setattr(xla_flags, "_added", [])
    monkeypatch.setattr(xla_flags, "_jaxlib_version", lambda: (0, 10))
    monkeypatch.setattr(xla_flags, "_jax_backend_started", lambda: False)


def test_added_for_jax_only_and_recorded(clean):
    assert xla_flags.fast_cpu_compiles("tensorflow") == []
    assert xla_flags.fast_cpu_compiles("torch") == []
    assert "XLA_FLAGS" not in os.environ
    assert xla_flags.fast_cpu_compiles("jax") == [EMITTERS, LEVEL]
    assert os.environ["XLA_FLAGS"] == f"{EMITTERS} {LEVEL}"
    assert xla_flags.fast_cpu_compiles("jax") == []  # once
    assert os.environ["XLA_FLAGS"] == f"{EMITTERS} {LEVEL}"
    assert xla_flags.flags_added() == [EMITTERS, LEVEL]


def test_each_flag_the_user_set_wins_and_the_opt_out_leaves_all(clean, monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "--xla_backend_optimization_level=0 --xla_dump_to=/tmp/d")
    assert xla_flags.fast_cpu_compiles("jax") == [EMITTERS]
    assert os.environ["XLA_FLAGS"] == (
        f"--xla_backend_optimization_level=0 --xla_dump_to=/tmp/d {EMITTERS}")
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_use_fusion_emitters=true")
    assert xla_flags.fast_cpu_compiles("jax") == [LEVEL]
    assert os.environ["XLA_FLAGS"] == f"--xla_cpu_use_fusion_emitters=true {LEVEL}"
    monkeypatch.delenv("XLA_FLAGS")
    monkeypatch.setenv(xla_flags.OPT_OUT, "default")
    assert xla_flags.fast_cpu_compiles("jax") == []
    assert "XLA_FLAGS" not in os.environ


def test_the_optimization_level_on_cpu_only_runs(clean, monkeypatch):
    """The level applies to GPU code generation too: only where JAX cannot leave the CPU."""
    for platforms, cpu_only in (("cpu", True), ("cuda", False), ("cpu,cuda", False),
                                (" CPU ", True), ("tpu", False)):
        monkeypatch.setenv("JAX_PLATFORMS", platforms)
        assert xla_flags.cpu_only() == cpu_only, platforms
    monkeypatch.setenv("JAX_PLATFORMS", "cuda")
    assert xla_flags.fast_cpu_compiles("jax") == [EMITTERS]
    monkeypatch.delenv("JAX_PLATFORMS")
    find_spec = xla_flags.importlib.util.find_spec
    monkeypatch.setattr(xla_flags.importlib.util, "find_spec",
                        lambda name: object() if name == "jax_plugins" else find_spec(name))
    assert not xla_flags.cpu_only()  # a PJRT plugin (jax-cuda12-plugin, ...) is installed
    monkeypatch.setattr(xla_flags.importlib.util, "find_spec", lambda name: None)
    assert xla_flags.cpu_only()


def test_nothing_once_jax_has_started_its_backend(clean, monkeypatch):
    monkeypatch.setattr(xla_flags, "_jax_backend_started", lambda: True)
    assert xla_flags.fast_cpu_compiles("jax") == []
    assert "XLA_FLAGS" not in os.environ


@pytest.mark.parametrize("version", [None, (0, 9), (0, 11), (1, 0)])
def test_nothing_for_a_jaxlib_they_were_not_measured_on(clean, monkeypatch, version):
    """An XLA_FLAGS entry XLA does not know ends the process: only verified jaxlibs."""
    monkeypatch.setattr(xla_flags, "_jaxlib_version", lambda: version)
    assert xla_flags.fast_cpu_compiles("jax") == []
    assert "XLA_FLAGS" not in os.environ


def _jax_process(code):
    """Run `code` in a fresh JAX process (`XLA_FLAGS` and the opt-out cleared before JAX
    starts); its last stdout line, parsed as JSON."""
    clear = ("import os\nos.environ.pop('XLA_FLAGS', None)\n"
             f"os.environ.pop({xla_flags.OPT_OUT!r}, None)\n")
    return json.loads(run_in_backend("jax", clear + code).strip().splitlines()[-1])


_LSTM_STEP = """
import json, os, sys
from zoo.runtime import xla_flags
added = xla_flags.fast_cpu_compiles() if sys.argv[1:] == ["set"] else []
import jax, jax.numpy as jnp
key = jax.random.split(jax.random.key(0), 4)
late = xla_flags.fast_cpu_compiles()  # the backend has started: too late for a flag
x = jax.random.normal(key[0], (8, 12, 16)); w = jax.random.normal(key[1], (16, 64)) / 4
u = jax.random.normal(key[2], (16, 64)) / 4; b = jax.random.normal(key[3], (64,))
def loss(w, u):
    def cell(carry, x_t):
        h, c = carry
        i, f, g, o = jnp.split(x_t @ w + h @ u + b, 4, axis=-1)
        c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
        h = jax.nn.sigmoid(o) * jnp.tanh(c)
        return (h, c), h
    zeros = jnp.zeros((8, 16))
    _, hs = jax.lax.scan(cell, (zeros, zeros), jnp.swapaxes(x, 0, 1))
    return jax.nn.logsumexp(hs, axis=-1).mean()
value, grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))(w, u)
print(json.dumps([added, late, os.environ.get("XLA_FLAGS", ""), float(value),
                  [g.ravel()[:50].tolist() for g in grads]]))
"""


@pytest.mark.skipif(not xla_flags.jaxlib_verified(),
                    reason="the flags are added on verified jaxlibs only")
def test_jax_runs_with_the_flag_and_computes_what_it_computes_without():
    """XLA accepts the flags (an unknown one would end the process), and an LSTM's loss and
    gradients agree with XLA's defaults' to float32 rounding."""
    added, late, flags, value, grads = _jax_process(_LSTM_STEP.replace(
        "sys.argv[1:]", "['set']"))
    assert added == [EMITTERS, LEVEL] and late == [] and flags == f"{EMITTERS} {LEVEL}"
    default_added, _, default_flags, default_value, default_grads = _jax_process(
        _LSTM_STEP.replace("sys.argv[1:]", "[]"))
    assert default_added == [] and default_flags == ""
    np.testing.assert_allclose(value, default_value, rtol=1e-5)
    np.testing.assert_allclose(grads, default_grads, rtol=1e-4, atol=1e-6)
