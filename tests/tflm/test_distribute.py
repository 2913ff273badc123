"""MirroredStrategy on two logical CPUs equals one device (dropout off and on); multi-worker
on localhost."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tests.backends import run_here
from tests.conftest import REPO
from tflm.distribute import free_local_ports

# One subprocess (TensorFlow's logical devices are fixed at start-up) for the CI's
# MirroredStrategy checks on two logical CPUs, another for the slow tier's flow and sampled
# heads (MIRRORED_HEADS); each test reads its part of a result.
MIRRORED_PRELUDE = """
import json, numpy as np, keras, tensorflow as tf
from tflm import distribute
distribute.use_logical_cpus(2)
from zoo.models.awd_lstm.awd_lstm_lm import AWDLSTM
strategy = distribute.get_strategy("mirrored", ["/cpu:0", "/cpu:1"])


def windows(streams):  # the streams' consecutive 10-position windows (inputs, targets)
    starts = range(0, streams.shape[1] - 1, 10)
    return tf.data.Dataset.from_tensor_slices((
        np.stack([streams[:, i:i+10] for i in starts]),
        np.stack([streams[:, i+1:i+11] for i in starts])))


def twins(kw):  # an AWD-LSTM on one device and its replicated copy, same weights, SGD(2)
    single = AWDLSTM(30, **kw); single.build()
    single.compile(optimizer=keras.optimizers.SGD(2.0))
    with strategy.scope():
        multi = AWDLSTM(30, **kw); multi.build(); multi.set_weights(single.get_weights())
        multi.compile(optimizer=keras.optimizers.SGD(2.0))
    return single, multi
"""

MIRRORED = MIRRORED_PRELUDE + """
from tflm.layers import EmbeddingDropout, LockedDropout, WeightDropLSTM
kw = dict(embed_dim=8, hidden_dim=12, num_layers=2, seed=3, bptt=10, dropout=0, dropout_h=0,
          dropout_i=0, dropout_e=0, weight_dropout=0, clip_norm=0.1, weight_decay=0.01)
data = np.random.default_rng(0).integers(0, 30, size=(4, 61)).astype("int32")
ds = windows(data)
single, multi = twins(kw)
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
# Replicas with very different perplexities (streams 0-1 all word 0, made likely): the
# pass's perplexity is exp(total NLL / tokens), not the mean of the replicas' perplexities.
skewed = data.copy()
skewed[:2] = 0
sds = windows(skewed)
weights = single.get_weights()
bias = [i for i, v in enumerate(single.weights) if "output_bias" in v.path][0]
weights[bias][0] += 6.0
single.set_weights(weights)
multi.set_weights(weights)
r1 = single.evaluate(sds, verbose=0, return_dict=True)
r2 = multi.evaluate(sds, verbose=0, return_dict=True)
val = multi.fit(ds.take(1), epochs=1, verbose=0, validation_data=sds).history
out["skewed"] = {"single": r1["perplexity"], "multi": r2["perplexity"],
                 "multi_exp_nll": float(np.exp(r2["nll"])), "single_nll": r1["nll"],
                 "multi_nll": r2["nll"], "val_perplexity": val["val_perplexity"][0],
                 "val_nll": val["val_nll"][0], "keys": sorted(r2), "fit_keys": sorted(val)}

# Dropout on. Replica r holds streams [4 r, 4 r + 4) of a global batch of 8. Each layer runs
# two training steps under strategy.run in a tf.function (as fit does) next to a one-device
# twin with the same seed on the same global batch.
rng = np.random.default_rng(1)

def replicated(layer, *inputs):
    blocks = lambda a: lambda ctx: a[4 * ctx.replica_id_in_sync_group:][:4]
    per_replica = [strategy.experimental_distribute_values_from_function(blocks(a))
                   for a in inputs]
    step = tf.function(lambda *a: strategy.run(lambda *b: layer(*b, training=True), args=a))
    return [np.concatenate([t.numpy() for t in strategy.experimental_local_results(step(
        *per_replica))]) for _ in range(2)]

def one_device(layer, *inputs):
    return [np.asarray(layer(*inputs, training=True)) for _ in range(2)]

x = np.ones((8, 3, 256), "float32")  # the same input on both replicas
with strategy.scope():
    locked = LockedDropout(0.5, seed=1)
got, ref = replicated(locked, x), one_device(LockedDropout(0.5, seed=1), x)
out["locked"] = {
    "agree": [float((m[:4] == m[4:]).mean()) for m in got],
    "kept": [float((m > 0).mean()) for m in got],
    "values_ok": all(bool(np.isin(m, [0.0, 2.0]).all()) for m in got),
    "constant_in_time": all(bool((m == m[:, :1]).all()) for m in got),
    "steps_differ": bool((got[0] != got[1]).any()),
    "equals_single": all(bool((m == o).all()) for m, o in zip(got, ref))}

# Per-element dropout (the Zaremba model's): StreamDropout draws per stream; Keras'
# Dropout, whose seed state is mirrored, repeats one replica's mask on the other.
from tflm.layers import StreamDropout
for name, make in (("stream", lambda: StreamDropout(0.5, seed=4)),
                   ("keras", lambda: keras.layers.Dropout(0.5, seed=4))):
    with strategy.scope():
        layer = make()
    got = replicated(layer, x)
    out["element_" + name] = {
        "agree": [float((m[:4] == m[4:]).mean()) for m in got],
        "kept": [float((m > 0).mean()) for m in got]}
    if name == "stream":
        ref = one_device(make(), x)
        out["element_stream"]["equals_single"] = all(bool((m == o).all())
                                                     for m, o in zip(got, ref))

half = rng.integers(0, 50, size=(4, 6)).astype("int32")
ids, emb = np.concatenate([half, half]), np.ones((8, 6, 2), "float32")
with strategy.scope():
    drop_e = EmbeddingDropout(50, rate=0.5, seed=2)
got = replicated(drop_e, ids, emb)
ref = one_device(EmbeddingDropout(50, rate=0.5, seed=2), ids, emb)
out["embedding"] = {
    "halves_equal": all(bool((m[:4] == m[4:]).all()) for m in got),
    "some_dropped": all(0.0 < float((m == 0).mean()) < 1.0 for m in got),
    "equals_single": all(bool((m == o).all()) for m, o in zip(got, ref))}

z = rng.normal(size=(4, 5, 3)).astype("float32")
seqs = np.concatenate([z, z])  # streams b and b + 4 are the same sequence
lkw = dict(weight_dropout=0.5, seed=5, return_sequences=True)
with strategy.scope():
    lstm = WeightDropLSTM(6, **lkw); lstm.build((None, None, 3))
twin = WeightDropLSTM(6, **lkw); twin.build((None, None, 3)); twin.set_weights(lstm.get_weights())
got, ref = replicated(lstm, seqs), one_device(twin, seqs)
out["weight_drop"] = {
    "halves_equal": all(bool((m[:4] == m[4:]).all()) for m in got),
    "dropped": bool(np.abs(got[0] - np.asarray(twin(seqs, training=False))).max() > 1e-3),
    "max_diff_single": float(max(np.abs(m - o).max() for m, o in zip(got, ref)))}

# a real fit with every dropout on: the replicated run equals the one-device run
kw.update(dropout=0.4, dropout_h=0.3, dropout_i=0.5, dropout_e=0.2, weight_dropout=0.5)
data = rng.integers(0, 30, size=(8, 31)).astype("int32")
ds = windows(data)
single, multi = twins(kw)
h1, h2 = single.fit(ds, epochs=2, verbose=0).history, multi.fit(ds, epochs=2, verbose=0).history
out["fit_dropout"] = {"loss": [h1["loss"], h2["loss"]],
                      "weight_diff": float(max(np.abs(a - b).max() for a, b in
                                               zip(single.get_weights(), multi.get_weights())))}

# Embedding noise is per stream (as LockedDropout); a fit with AdvSoft, embedding noise and
# MLE-CosReg on, replicated, equals the one-device fit.
from tflm.layers import EmbeddingNoise
with strategy.scope():
    noise = EmbeddingNoise(0.5, seed=6)
got = replicated(noise, np.zeros((8, 3, 256), "float32"))
ref = one_device(EmbeddingNoise(0.5, seed=6), np.zeros((8, 3, 256), "float32"))
out["noise"] = {"corr": float(np.corrcoef(got[0][:4].ravel(), got[0][4:].ravel())[0, 1]),
                "std": float(got[0].std()),
                "equals_single": all(bool(np.allclose(m, o)) for m, o in zip(got, ref))}
kw.update(head={"type": "softmax", "adversarial_alpha": 0.05}, embedding_noise=0.2,
          cosine_regularization=0.5)
single, multi = twins(kw)
h1, h2 = single.fit(ds, epochs=2, verbose=0).history, multi.fit(ds, epochs=2, verbose=0).history
out["fit_regularized"] = {"loss": [h1["loss"], h2["loss"]],
                          "weight_diff": float(max(np.abs(a - b).max() for a, b in
                                                   zip(single.get_weights(),
                                                       multi.get_weights())))}

# Averaged SGD (the presets' optimizer): its averages are updated in a `cond` per variable
# under the strategy's update context; every step is averaged (3 steps: the average is
# mean(theta_2, theta_3)).
from tflm.optimizers import AveragedSGD, averaged_weights
kw = dict(embed_dim=8, hidden_dim=12, num_layers=2, seed=3, bptt=10, dropout=0, dropout_h=0,
          dropout_i=0, dropout_e=0, weight_dropout=0, clip_norm=0.1, head={"type": "softmax"})
single = AWDLSTM(30, **kw); single.build()
single.compile(optimizer=AveragedSGD(2.0, start_averaging=0))
with strategy.scope():
    multi = AWDLSTM(30, **kw); multi.build(); multi.set_weights(single.get_weights())
    multi.compile(optimizer=AveragedSGD(2.0, start_averaging=0))
single.fit(ds, epochs=1, verbose=0)
multi.fit(ds, epochs=1, verbose=0)
with averaged_weights(single), averaged_weights(multi):
    averaged = [single.get_weights(), multi.get_weights()]
out["fit_asgd"] = {
    "count": [single.optimizer.average_count, multi.optimizer.average_count],
    "weight_diff": float(max(np.abs(a - b).max() for a, b in
                             zip(single.get_weights(), multi.get_weights()))),
    "average_diff": float(max(np.abs(a - b).max() for a, b in zip(*averaged))),
    "average_moved": float(max(np.abs(a - b).max() for a, b in
                               zip(averaged[0], single.get_weights())))}
print("RESULT " + json.dumps(out))
"""


# The heads whose mirrored fit is the slow tier's (their replicated traces are most of this
# file's time; no README claim rests on them alone: AdvSoft's targets under MirroredStrategy
# are `fit_regularized` above).
MIRRORED_HEADS = MIRRORED_PRELUDE + """
ds = windows(np.random.default_rng(1).integers(0, 30, size=(8, 31)).astype("int32"))
out = {}

# NeuralODELogits: each replica solves its half of the batch (its own adaptive steps), and
# its NFE variable is written in replica context.
kw = dict(embed_dim=8, hidden_dim=12, num_layers=2, seed=3, bptt=10, dropout=0, dropout_h=0,
          dropout_i=0, dropout_e=0, weight_dropout=0, clip_norm=0.1,
          head={"type": "node", "rtol": 1e-7, "atol": 1e-7})
single, multi = twins(kw)
h1, h2 = single.fit(ds, epochs=2, verbose=0).history, multi.fit(ds, epochs=2, verbose=0).history
out["fit_node"] = {"loss": [h1["loss"], h2["loss"]], "nfe": h2["nfe"],
                   "weight_diff": float(max(np.abs(a - b).max() for a, b in
                                            zip(single.get_weights(), multi.get_weights())))}

# Importance-sampled heads: the candidates (and the conditional flow's Hutchinson noise) are
# drawn per stream, so a replicated step samples what one device samples for the global
# batch; the flows' adaptive solves agree to their tolerance.
out["fit_sampled"] = {}
for name, head in (("softmax", {"type": "softmax", "num_samples": 5, "sampling_seed": 4}),
                   ("ccnf", {"type": "ccnf", "num_samples": 3, "sampling_seed": 4, "seed": 5,
                             "rtol": 1e-6, "atol": 1e-6})):
    kw["head"] = head
    single, multi = twins(kw)
    h1 = single.fit(ds, epochs=2, verbose=0).history
    h2 = multi.fit(ds, epochs=2, verbose=0).history
    out["fit_sampled"][name] = {
        "loss": [h1["loss"], h2["loss"]],
        "weight_diff": float(max(np.abs(a - b).max() for a, b in
                                 zip(single.get_weights(), multi.get_weights())))}

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
    return _printed_result(out)


def _printed_result(out):
    line = [l for l in out.splitlines() if l.startswith("RESULT ")][-1]
    return json.loads(line[7:])


@pytest.fixture(scope="module")
def mirrored():
    return _result(_run(MIRRORED))


@pytest.fixture(scope="module")
def mirrored_heads():
    return _result(_run(MIRRORED_HEADS))


def test_mirrored_two_cpus_equals_single_device(mirrored):
    r = mirrored
    assert r["replicas"] == 2
    assert r["eval"][1] == pytest.approx(r["eval"][0], rel=1e-6)
    for a, b in zip(r["fit"][0], r["fit"][1]):
        assert b == pytest.approx(a, rel=1e-5)
    for a, b in zip(r["fit"][2], r["fit"][3]):
        assert b == pytest.approx(a, rel=1e-5)
    assert r["weight_diff"] < 1e-5
    assert r["eval_after"][1] == pytest.approx(r["eval_after"][0], rel=1e-5)


def test_mirrored_averaged_sgd_equals_single_device(mirrored):
    r = mirrored["fit_asgd"]
    assert r["count"] == [3, 3]
    assert r["weight_diff"] < 1e-5 and r["average_diff"] < 1e-5
    assert r["average_moved"] > 1e-4  # the average is not the last iterate


def test_mirrored_perplexity_is_of_the_pass_not_the_mean_of_replicas(mirrored):
    s = mirrored["skewed"]
    assert s["single"] > 2.0 and s["single"] < 30.0
    assert s["multi"] == pytest.approx(s["single"], rel=1e-5)
    assert s["multi"] == pytest.approx(s["multi_exp_nll"], rel=1e-5)
    assert s["multi_nll"] == pytest.approx(s["single_nll"], rel=1e-5)
    assert s["val_perplexity"] == pytest.approx(float(np.exp(s["val_nll"])), rel=1e-5)
    assert s["keys"] == ["loss", "nll", "perplexity"]
    assert {"grad_norm", "loss", "perplexity", "val_perplexity"} <= set(s["fit_keys"])


def test_mirrored_locked_dropout_masks_are_per_stream(mirrored):
    """LockedDropout (and so the MoS / DOC / MixTape latent dropout) draws one mask per
    stream: streams b and b + B/2, on different replicas, must not share it, yet each mask
    is constant over time with keep rate 1 - p, and the masks are those one device draws for
    the same global batch."""
    r = mirrored["locked"]
    for agree, kept in zip(r["agree"], r["kept"]):
        # independent Bernoulli(0.5) masks agree with probability 0.5 (sd 0.016 over 1024)
        assert 0.4 < agree < 0.6
        assert 0.45 < kept < 0.55
    assert r["values_ok"] and r["constant_in_time"] and r["steps_differ"]
    assert r["equals_single"]


def test_mirrored_element_dropout_masks_are_per_stream(mirrored):
    """StreamDropout (a fresh mask per element, the Zaremba model's dropout) draws the
    global batch's mask and keeps each replica's rows: streams b and b + B/2 agree only by
    chance and the masks equal one device's; keras.layers.Dropout repeats them."""
    r = mirrored["element_stream"]
    for agree, kept in zip(r["agree"], r["kept"]):
        assert 0.45 < agree < 0.55        # 3,072 independent Bernoulli(0.5) pairs: sd 0.009
        assert 0.47 < kept < 0.53
    assert r["equals_single"]
    assert mirrored["element_keras"]["agree"] == [1.0, 1.0]  # why StreamDropout exists


def test_mirrored_shared_masks_stay_shared(mirrored):
    """The DropConnect mask on U (WeightDropLSTM) and the embedding row mask are one per
    forward for the whole batch, as in the reference: the same sequence on both replicas
    gives the same output, equal to one device's."""
    e, w = mirrored["embedding"], mirrored["weight_drop"]
    assert e["halves_equal"] and e["some_dropped"] and e["equals_single"]
    assert w["halves_equal"] and w["dropped"]
    assert w["max_diff_single"] < 1e-6


def test_mirrored_fit_with_dropout_equals_single_device(mirrored):
    """Every dropout on: a replicated fit draws the one-device masks, so it trains alike."""
    r = mirrored["fit_dropout"]
    for a, b in zip(*r["loss"]):
        assert b == pytest.approx(a, rel=1e-5)
    assert r["weight_diff"] < 1e-5


def test_mirrored_regularized_fit_equals_single_device(mirrored):
    """Embedding noise draws per stream (streams on different replicas get independent
    noise, the one-device draw; 3,072 pairs: the correlation sd is 0.018); AdvSoft + noise +
    MLE-CosReg train alike replicated."""
    n = mirrored["noise"]
    assert abs(n["corr"]) < 0.08 and n["std"] == pytest.approx(0.5, rel=0.05)
    assert n["equals_single"]
    r = mirrored["fit_regularized"]
    for a, b in zip(*r["loss"]):
        assert b == pytest.approx(a, rel=1e-5)
    assert r["weight_diff"] < 1e-5


@pytest.mark.slow
def test_mirrored_neural_ode_head_fit_equals_single_device(mirrored_heads):
    """A replica's adaptive solve of half the batch takes its own steps, so its logits agree
    with the whole batch's to the solve's accuracy (float32: ~1e-6), not bit for bit."""
    r = mirrored_heads["fit_node"]
    for a, b in zip(*r["loss"]):
        assert b == pytest.approx(a, rel=1e-4)
    assert r["weight_diff"] < 1e-4 and all(n >= 8 for n in r["nfe"])


@pytest.mark.slow
def test_mirrored_sampled_training_equals_single_device(mirrored_heads):
    """Sampled softmax and the sampled conditional flow: each replica draws its own streams'
    candidates (and noise), the ones a single device draws, so the fits agree (the flow to
    its solves' tolerance)."""
    for name, r in mirrored_heads["fit_sampled"].items():
        # The flow: replicas' adaptive solves and reduction orders vary from run to run
        # (1.03e-4 relative on one loss in one of two runs), so 5e-4, not 1e-4.
        tol = 1e-5 if name == "softmax" else 5e-4
        for a, b in zip(*r["loss"]):
            assert b == pytest.approx(a, rel=tol), name
        assert r["weight_diff"] < tol, name


MULTI_WORKER = """
import json, os, numpy as np
from tflm import distribute
strategy = None if os.environ["ROLE"] == "single" else distribute.get_strategy("multi-worker")
import keras
from zoo.models.awd_lstm.awd_lstm_lm import AWDLSTM
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


def test_multi_worker_on_localhost_equals_single_device(monkeypatch):
    """Two worker processes on localhost against the same model on one device, which runs
    in this process (the TensorFlow session's) while they train."""
    workers = [f"127.0.0.1:{p}" for p in free_local_ports(2)]
    procs = []
    for index in range(2):
        config = {"cluster": {"worker": workers}, "task": {"type": "worker", "index": index}}
        procs.append(_run(MULTI_WORKER, {"TF_CONFIG": json.dumps(config), "ROLE": "worker"}))
    monkeypatch.setenv("ROLE", "single")
    single = _printed_result(run_here(MULTI_WORKER))
    results = [_result(p) for p in procs]
    assert results[0] == results[1], "workers must agree"
    assert results[0]["eval"] == pytest.approx(single["eval"], rel=1e-5)
    for a, b in zip(results[0]["ppl"], single["ppl"]):
        assert a == pytest.approx(b, rel=1e-5)
    assert results[0]["wsum"] == pytest.approx(single["wsum"], rel=1e-5)
