"""`zoo.runtime.allocator`: glibc's malloc set so a training step reuses the memory it freed."""

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import REPO

GLIBC = sys.platform.startswith("linux") and os.confstr("CS_GNU_LIBC_VERSION") is not None
needs_glibc = pytest.mark.skipif(not GLIBC, reason="glibc's mallopt")


def _python(code, **env):
    """Run `code` in a fresh process (mallopt is process-wide); its last stdout line, parsed."""
    environ = {k: v for k, v in os.environ.items()
               if not k.startswith("MALLOC_") and k not in ("TFLM_MALLOC", "KERAS_BACKEND")}
    environ.update(env, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu", TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=environ,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_backend_name_is_read_as_keras_reads_it_without_importing_keras(tmp_path):
    code = ("import json, sys; from zoo.runtime import allocator; "
            "print(json.dumps([allocator.keras_backend_name(), 'keras' in sys.modules]))")
    assert _python(code, KERAS_BACKEND="jax") == ["jax", False]
    (tmp_path / "keras.json").write_text(json.dumps({"backend": "torch"}))
    assert _python(code, KERAS_HOME=str(tmp_path)) == ["torch", False]
    (tmp_path / "keras.json").write_text("{not json")
    assert _python(code, KERAS_HOME=str(tmp_path)) == ["tensorflow", False]


@needs_glibc
def test_settings_per_backend_and_what_the_user_set_wins():
    code = ("import json, sys; from zoo.runtime import allocator; made = allocator.keep_freed_memory("
            "sys.argv[1] if len(sys.argv) > 1 else None); "
            "print(json.dumps([made, allocator.settings_made()]))")
    keep = {"M_MMAP_MAX": 0, "M_TRIM_THRESHOLD": 2 ** 31 - 1}
    inline = {"jax_cpu_enable_async_dispatch": False}
    assert _python(code, KERAS_BACKEND="jax") == [{**keep, **inline}] * 2
    assert _python(code, KERAS_BACKEND="tensorflow") == [keep] * 2  # inline runs: JAX only
    assert _python(code, KERAS_BACKEND="torch") == [keep] * 2
    user = _python(code, KERAS_BACKEND="jax", MALLOC_MMAP_MAX_="4")
    assert user[0] == {"M_TRIM_THRESHOLD": 2 ** 31 - 1, **inline}
    assert _python(code, KERAS_BACKEND="jax", TFLM_MALLOC="default") == [{}, {}]


def test_jax_cpu_programs_run_inline_and_only_before_the_backend_starts():
    """After `keep_freed_memory("jax")` a program has finished when its call returns (JAX's
    CPU client ran it on the calling thread); by default a large one is still running. Once
    JAX's backend has started the flag is no longer read, and nothing is set."""
    code = """
import json
from zoo.runtime import allocator
case = CASE
if case == "started":
    import jax
    jax.numpy.ones(1)
made = allocator.keep_freed_memory("jax") if case != "default" else {}
import jax, jax.numpy as jnp
x = jnp.ones((1500, 1500))
f = jax.jit(lambda a: (a @ a @ a @ a).sum())
f(x).block_until_ready()
ready = [f(x).is_ready() for _ in range(5)]
print(json.dumps([made.get("jax_cpu_enable_async_dispatch"), ready]))
"""
    def run(case):
        return _python(code.replace("CASE", repr(case)), KERAS_BACKEND="jax")

    inline, ready = run("keep")
    assert inline is False and all(ready)
    _, ready = run("default")
    assert not all(ready)  # asynchronous dispatch: the call returns before the result
    inline, _ = run("started")
    assert inline is None


@needs_glibc
def test_jax_training_steps_reuse_their_freed_buffers():
    """Page faults per training step of a JAX model with (20, 32, 8000) logits: with
    glibc's defaults every step faulted in ~16,800 pages (66 MiB) afresh, because XLA's
    threads allocate from arenas whose heaps glibc unmaps when they empty; after
    `keep_freed_memory` the median step takes none."""
    code = """
import json, resource
from zoo.runtime import allocator
allocator.keep_freed_memory("jax")
import keras, numpy as np
from tflm import data
from zoo.models.awd_lstm.awd_lstm_lm import AWDLSTM
V = 8000
model = AWDLSTM(vocab_size=V, embed_dim=64, hidden_dim=128, num_layers=2, bptt=32)
model.compile(optimizer="sgd")
ids = np.random.default_rng(0).integers(0, V, 20 * 33 * 12)
faults = []
class Faults(keras.callbacks.Callback):
    def on_train_batch_begin(self, batch, logs=None):
        self.before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    def on_train_batch_end(self, batch, logs=None):
        faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - self.before)
model.fit(data.lm_dataset(ids, 20, 32, train=False), epochs=1, verbose=0,
          callbacks=[Faults()])
print(json.dumps(sorted(faults[1:-1])[len(faults[1:-1]) // 2]))
"""
    assert _python(code, KERAS_BACKEND="jax") < 1000
