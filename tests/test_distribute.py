"""MirroredStrategy on two logical CPUs equals one device; multi-worker on localhost."""

import json
import os
import socket
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO

MIRRORED = """
import json, numpy as np, keras, tensorflow as tf
from tflm import distribute
distribute.use_logical_cpus(2)
from zoo.awd_lstm import AWDLSTM
kw = dict(embed_dim=8, hidden_dim=12, num_layers=2, seed=3, bptt=10, dropout=0, dropout_h=0,
          dropout_i=0, dropout_e=0, weight_dropout=0, clip_norm=0.1, weight_decay=0.01)
data = np.random.default_rng(0).integers(0, 30, size=(4, 61)).astype("int32")
xs = np.stack([data[:, i:i+10] for i in range(0, 60, 10)])
ys = np.stack([data[:, i+1:i+11] for i in range(0, 60, 10)])
ds = tf.data.Dataset.from_tensor_slices((xs, ys))
single = AWDLSTM(30, **kw); single.build(); single.compile(optimizer=keras.optimizers.SGD(2.0))
strategy = distribute.get_strategy("mirrored", ["/cpu:0", "/cpu:1"])
with strategy.scope():
    multi = AWDLSTM(30, **kw); multi.build(); multi.set_weights(single.get_weights())
    multi.compile(optimizer=keras.optimizers.SGD(2.0))
out = {"replicas": strategy.num_replicas_in_sync}
out["eval"] = [single.evaluate(ds, verbose=0, return_dict=True)["perplexity"],
               multi.evaluate(ds, verbose=0, return_dict=True)["perplexity"]]
h1 = single.fit(ds, epochs=2, verbose=0).history
h2 = multi.fit(ds, epochs=2, verbose=0).history
out["fit"] = [h1["perplexity"], h2["perplexity"], h1["loss"], h2["loss"]]
out["weight_diff"] = float(max(np.abs(a - b).max() for a, b in
                               zip(single.get_weights(), multi.get_weights())))
out["eval_after"] = [single.evaluate(ds, verbose=0, return_dict=True)["perplexity"],
                     multi.evaluate(ds, verbose=0, return_dict=True)["perplexity"]]
print("RESULT " + json.dumps(out))
"""


def _run(code, env=None, timeout=300):
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", KERAS_BACKEND="tensorflow",
               PYTHONPATH=str(REPO), **(env or {}))
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _result(proc, timeout=300):
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    line = [l for l in out.splitlines() if l.startswith("RESULT ")][-1]
    return json.loads(line[7:])


def test_mirrored_two_cpus_equals_single_device():
    r = _result(_run(MIRRORED))
    assert r["replicas"] == 2
    assert r["eval"][1] == pytest.approx(r["eval"][0], rel=1e-6)
    for a, b in zip(r["fit"][0], r["fit"][1]):
        assert b == pytest.approx(a, rel=1e-5)
    for a, b in zip(r["fit"][2], r["fit"][3]):
        assert b == pytest.approx(a, rel=1e-5)
    assert r["weight_diff"] < 1e-5
    assert r["eval_after"][1] == pytest.approx(r["eval_after"][0], rel=1e-5)


MULTI_WORKER = """
import json, os, numpy as np
from tflm import distribute
strategy = None if os.environ["ROLE"] == "single" else distribute.get_strategy("multi-worker")
import keras
from zoo.awd_lstm import AWDLSTM
kw = dict(embed_dim=8, hidden_dim=12, num_layers=2, seed=3, bptt=10, dropout=0, dropout_h=0,
          dropout_i=0, dropout_e=0, weight_dropout=0, clip_norm=0.1, weight_decay=0.01)
ids = np.random.default_rng(0).integers(0, 30, size=4 * 61).astype("int32")
ds = distribute.lm_dataset_for(strategy, ids, 4, 10, train=False)
scope = strategy.scope() if strategy else keras.name_scope("single")
with scope:
    m = AWDLSTM(30, **kw); m.build()
    m.set_weights([np.random.default_rng(i).normal(size=w.shape).astype("float32") * 0.1
                   for i, w in enumerate(m.get_weights())])
    m.compile(optimizer=keras.optimizers.SGD(2.0))
e = m.evaluate(ds, verbose=0, return_dict=True)["perplexity"]
h = m.fit(ds, epochs=2, verbose=0).history
print("RESULT " + json.dumps({"eval": e, "ppl": h["perplexity"],
      "wsum": float(sum(np.abs(w).sum() for w in m.get_weights()))}))
"""


def _free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def test_multi_worker_on_localhost_equals_single_device():
    workers = [f"127.0.0.1:{p}" for p in _free_ports(2)]
    procs = []
    for index in range(2):
        config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        procs.append(_run(MULTI_WORKER, {"TF_CONFIG": json.dumps(config), "ROLE": "worker"}))
    single = _result(_run(MULTI_WORKER, {"ROLE": "single"}))
    results = [_result(p) for p in procs]
    assert results[0] == results[1], "workers must agree"
    assert results[0]["eval"] == pytest.approx(single["eval"], rel=1e-5)
    for a, b in zip(results[0]["ppl"], single["ppl"]):
        assert a == pytest.approx(b, rel=1e-5)
    assert results[0]["wsum"] == pytest.approx(single["wsum"], rel=1e-5)
