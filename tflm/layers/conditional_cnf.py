"""ConditionalCNFHead: a flow of every word's embedding conditioned on the context
(Andonov 2019 §6.4-6.6): not rank-bounded, trained by importance sampling."""

import keras
from keras import ops

from tflm.layers.cnf import FlowHead
from tflm.losses import importance_sampled_log_probs


@keras.saving.register_keras_serializable(package="tflm")
class ConditionalCNFHead(FlowHead):
    """Output head: one flow per (position, word), conditioned on the context vector h.

        z(t0) = e_w,   log p(z(t0)) = l_w = h . e_w + b_w
        [z(t1); Delta_w(h)] = int_{t0}^{t1} [f(z, t, h); Tr(df/dz)] dt
        f(z, t, h) = W_out^T softplus(W_z^T z + t w_t + b_in + W_h^T h + b_h) + b_out
        log P(w | c) = log_softmax_w(l_w - Delta_w(h))

    Delta now depends on the context, so Q_theta = A - B with B of rank up to min(N, V): the
    bottleneck does not bound it (thesis §6.4; a test on the synthetic high-rank language).
    The reference writes the context branch as a second ConcatLinear on [t, h]; its t term
    adds to w_t, so W_h^T h + b_h is the same family.

    Cost: the state is `(batch, time, V, d)`, one ODE per position and word (§6.5). With
    `num_samples=k` (20 in §7.3.3) training solves only the target and k words drawn from
    the proposal Q (`head.sampler`, unigram counts via `head.sampler.set_proposal`):
    importance sampling (§6.6.3, `tflm.losses.importance_sampled_log_probs`), the training
    loss reads the target's column. Evaluation always uses the full partition function;
    `vocab_chunk` solves the vocabulary in chunks of that many words to bound memory (each
    chunk its own adaptive steps, so the result agrees with one solve to the tolerance).
    Character models (V < 50) train on the full vocabulary (`num_samples=None`).

    Hutchinson's trace (the training default, the reference's) estimates Delta without bias,
    but Delta enters a softmax over words, which is not linear in it: the expected loss is
    above the exact one (Jensen) and its gradient is biased towards a smaller flow
    Jacobian (several times the true gradient for weights of scale 0.6,
    tests/tflm/layers/test_ccnf_sampled_gradient.py). Near f = 0, where a head on a trained base
    starts, the bias fades but one draw's noise is tens of times the gradient (measured:
    bench/reproductions/results/flow_heads_synthetic.md, "why ccnf barely learns"). `trace="exact"` is unbiased,
    noise-free and cheaper here: use it to train.

    Args:
        embedding, vocab_size: the vocabulary projection (tied / untied) of l_w and z(t0).
        num_samples: k noise words per position in training; None = full vocabulary.
        sampling_seed: seed of the candidate sampler.
        shared_samples: must stay False (the default): per-position noise words.
        vocab_chunk: words per solve outside sampled training (None: all at once).
        hidden, trace, eval_trace, noise, method, rtol, atol, step_size, max_steps,
            adjoint, t1, init, seed: as `CNFHead` (in training Hutchinson's trace with
            Gaussian noise, one draw per solve and per stream, as the reference; in
            evaluation the exact trace).

    Input shape: `(batch, time, d_h)`. Output shape: `(batch, time, V)` (in sampled
    training `(batch, time, 1 + k)`, the target first), float32.

    Example:
    >>> emb = TiedEmbedding(20, 8)
    >>> head = ConditionalCNFHead(embedding=emb, trace="exact")
    >>> head(np.zeros((2, 3, 8), "float32")).shape
    (2, 3, 20)

    Reference: Andonov 2019 (thesis), §6.4-6.6 (eqs. 6.7-6.17), §7.3.3, Tables 7.7-7.10;
    Jozefowicz et al. 2016 (importance sampling).
    """

    supports_sampling = True
    shares_samples_by_default = False

    def __init__(self, embedding=None, vocab_size=None, vocab_chunk=None, **kwargs):
        super().__init__(embedding=embedding, vocab_size=vocab_size, **kwargs)
        if self.shared_samples:
            raise ValueError("ConditionalCNFHead draws its k noise words per position (the "
                             "reference's); shared_samples=True is not implemented for it.")
        if vocab_chunk is not None and (int(vocab_chunk) != vocab_chunk or vocab_chunk < 1):
            raise ValueError(f"ConditionalCNFHead: vocab_chunk must be a positive integer or "
                             f"None; got {vocab_chunk!r}.")
        self.vocab_chunk = None if vocab_chunk is None else int(vocab_chunk)

    def build(self, input_shape):
        d_h = int(input_shape[-1])
        self.build_projection(d_h)
        d = self.embedding.embed_dim if self.tied else d_h
        self.build_flow(d)
        k = self.hidden or d
        self.w_h = self.add_weight(shape=(d_h, k), name="w_h", initializer=self._uniform(d_h))
        self.b_h = self.add_weight(shape=(k,), name="b_h", initializer="zeros")
        self.built = True

    def context_term(self, h):
        """W_h^T h + b_h with a word axis: `(batch, time, 1, k)`."""
        c = ops.matmul(ops.cast(h, "float32"), ops.cast(self.w_h, "float32"))
        return ops.expand_dims(c + ops.cast(self.b_h, "float32"), -2)

    def flowed_log_density(self, h, ids, training=False):
        """l_w - Delta_w(h) for candidate ids `(batch, time, C)`; and NFE."""
        z0 = self.target_vectors(ids)
        delta, nfe = self.log_density_change(z0, self.context_term(h), per_stream=True,
                                             training=training)
        return self.candidate_logits(h, ids) - delta, nfe

    def _all_words(self, h, start, stop):
        ids = ops.arange(start, stop, dtype="int32")
        shape = tuple(ops.shape(h)[:-1]) + (stop - start,)
        return ops.broadcast_to(ids, shape)

    def call(self, h, training=False, targets=None):
        if self.sampling(training, targets):
            ids, log_q = self.sampler(targets)
            density, nfe = self.flowed_log_density(h, ids, training=True)
            self.record_nfe(nfe)
            return importance_sampled_log_probs(density, log_q)
        chunk = self.vocab_chunk or self.vocab_size
        parts, total = [], 0
        for start in range(0, self.vocab_size, chunk):
            stop = min(start + chunk, self.vocab_size)
            density, nfe = self.flowed_log_density(h, self._all_words(h, start, stop),
                                                   training=training)
            parts.append(density)
            total = total + nfe
        self.record_nfe(total)
        density = parts[0] if len(parts) == 1 else ops.concatenate(parts, axis=-1)
        return ops.log_softmax(density, axis=-1)

    def get_config(self):
        config = super().get_config()
        config["vocab_chunk"] = self.vocab_chunk
        return config
