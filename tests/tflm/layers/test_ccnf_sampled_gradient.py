"""ConditionalCNFHead's importance-sampled objective: with the exact trace its gradient with
respect to the flow's weights is the full-softmax objective's in expectation (Jozefowicz et
al. 2016 §3.1, Andonov 2019 §6.6.3). With Hutchinson's trace in training (the reference's
ffjord default) it is not: Delta enters log_softmax, which is not linear in it, so the noise
of the estimate raises the expected loss (Jensen) and biases the gradient towards a smaller
flow Jacobian, several times the true gradient
(bench/reproductions/results/flow_heads_synthetic.md, "why ccnf barely learns")."""

import numpy as np
import tensorflow as tf

from tflm.layers import ConditionalCNFHead, TiedEmbedding

V, D, T, DRAWS = 12, 3, 2, 400


def _head(trace, rng):
    emb = TiedEmbedding(V, D)
    emb.build()
    emb.embeddings.assign(rng.normal(size=(V, D)).astype("float32") * 0.7)
    emb.output_bias.assign(rng.normal(size=V).astype("float32"))
    head = ConditionalCNFHead(embedding=emb, num_samples=60, trace=trace, method="rk4",
                              step_size=0.25, adjoint=False, seed=5, sampling_seed=7)
    head.build((None, None, D))
    head.sampler.set_proposal(rng.dirichlet(np.ones(V) * 2))
    for v in head.flow_params() + [head.w_h, head.b_h]:
        v.assign(rng.normal(size=v.shape).astype("float32") * 0.6)
    return head


def _gradients(head, loss_fn):
    weights = head.flow_params() + [head.w_h]
    with tf.GradientTape() as tape:
        loss = loss_fn()
    grads = np.concatenate([np.ravel(g) for g in tape.gradient(loss, weights)])
    return grads, float(loss)


def _full_and_sampled(trace, seed, sampled_vocab=True):
    rng = np.random.default_rng(seed)
    head = _head(trace, rng)
    h = rng.normal(size=(1, T, D)).astype("float32")
    y = rng.integers(0, V, (1, T)).astype("int32")
    # DRAWS copies of the same contexts: every copy gets its own noise words (and
    # Hutchinson noise), so the batch mean is the mean over DRAWS draws.
    hs, ys = np.repeat(h, DRAWS, 0), np.repeat(y, DRAWS, 0)

    def full():  # -log P(y | c), all V words, exact trace (evaluation)
        lp = head(h, training=False)
        return -tf.reduce_mean(tf.gather(lp, y, batch_dims=2))

    def sampled(batch_h, batch_y):
        if not sampled_vocab:  # every word, the training trace: the full objective's estimate
            return lambda: -tf.reduce_mean(tf.gather(head(batch_h, training=True), batch_y,
                                                     batch_dims=2))
        return lambda: -tf.reduce_mean(head(batch_h, training=True, targets=batch_y)[..., 0])

    return _gradients(head, full), _gradients(head, sampled(hs, ys))


def _cos(a, b):
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_sampled_flow_gradient_matches_the_full_objective_in_expectation():
    (full, _), (mean, _) = _full_and_sampled("exact", seed=0)
    assert _cos(full, mean) > 0.995
    np.testing.assert_allclose(np.linalg.norm(mean), np.linalg.norm(full), rtol=0.05)


def test_hutchinson_trace_biases_the_objective_towards_a_smaller_flow():
    """Mean over 400 Hutchinson draws, all V words: the gradient is not the exact one (it
    points elsewhere and is several times larger); the sampled objective inherits it."""
    (full, loss), (mean, mean_loss) = _full_and_sampled("hutchinson", seed=0,
                                                         sampled_vocab=False)
    assert mean_loss > loss + 0.1  # E[-log softmax(l - Delta_hat)_y] > -log softmax(l - Delta)_y
    assert _cos(full, mean) < 0.5
    assert np.linalg.norm(mean - full) > 2 * np.linalg.norm(full)
    (full, _), (mean, _) = _full_and_sampled("hutchinson", seed=0)
    assert _cos(full, mean) < 0.5
