"""Mixtape: per-token mixture of logits with sigmoid-tree gates (high rank, one softmax)."""

import math

import keras
import numpy as np
from keras import ops

from tflm.layers.dropout import LockedDropout
from tflm.layers.head import LogProbHead, tanh_components


def sigmoid_tree(gates, axis=-1):
    """Leaf probabilities of a complete binary sigmoid tree.

    `gates` holds gamma_n = sigmoid(a_n) of the K - 1 internal nodes along `axis`, in heap
    order (root 0, children of n are 2n+1 and 2n+2). With K = 2^D leaves, leaf j goes left
    (factor gamma) or right (factor 1 - gamma) at each level following the bits of j, most
    significant first. For K = 4 (3 gates):

        pi_1 = g1 g2,  pi_2 = g1 (1 - g2),  pi_3 = (1 - g1) g3,  pi_4 = (1 - g1)(1 - g3)

    Args:
        gates: tensor with K - 1 values in (0, 1) along `axis`.
        axis: the node axis. Default -1.

    Returns:
        Tensor with the K leaf weights (summing to 1) along `axis`.
    """
    rank = len(gates.shape)
    axis = axis % rank
    num_leaves = int(gates.shape[axis]) + 1
    depth = int(round(math.log2(num_leaves)))
    index = [slice(None)] * rank

    def node_gate(n):
        index[axis] = n
        return gates[tuple(index)]

    leaves = []
    for j in range(num_leaves):
        node, weight = 0, None
        for level in range(depth):
            bit = (j >> (depth - 1 - level)) & 1
            g = node_gate(node)
            factor = g if bit == 0 else 1.0 - g
            weight = factor if weight is None else weight * factor
            node = 2 * node + 1 + bit
        leaves.append(weight)
    return ops.stack(leaves, axis=axis)


@keras.saving.register_keras_serializable(package="tflm")
class MixtapeLayer(LogProbHead):
    """Mixtape output head: token-specific mixture of component logits, one softmax.

        h_{c,k}     = tanh(W_k g_c + b_k)                                      (K components)
        a_{c,w,n}   = v_w^T tanh(U_n g_c) + u_n^T g_c + b_{w,n}                 (n = 1..K-1)
        pi_{c,w,:}  = sigmoid tree of sigmoid(a_{c,w,:})                        (sums to 1 over k)
        l_{c,w}     = sum_k pi_{c,w,k} h_{c,k}^T e_w + b_w
        log P(w|c)  = log_softmax(l_c)_w

    K = 4 gives pi_1 = g1 g2, pi_2 = g1(1-g2), pi_3 = (1-g1) g3, pi_4 = (1-g1)(1-g3); any power
    of two works (K = 1 is the softmax head on tanh(W g + b)). The gate vectors v_w have
    size `gate_dim` (d2 << d). Gate sharing: tokens whose frequency rank is >= 
    `shared_gate_rank` share one gate vector v and one bias per gate, so their mixture weights
    depend on the context only and their logits are (sum_k pi_{c,k} h_{c,k})^T e_w + b_w (one
    (B, T, V_rare) matmul instead of K). Frequency ranks come from `token_frequency_rank`
    (rank[w] = 0 for the most frequent token) or, when it is None, from the ids themselves
    (ids sorted by frequency). The output bias b_w is added once (the pi sum to 1).

    Memory: (B, T, K, S) component logits and (B, T, K-1, S) gate pre-activations for the
    S = min(shared_gate_rank, V) tokens with their own gates, plus (B, T, V - S) for the rest.

    Args:
        num_components: K, a power of two. Default 4.
        gate_dim: d2, size of the per-token gate vectors. Default 64.
        shared_gate_rank: S; tokens of frequency rank >= S share one gate. None: every token
            has its own gate. Default None.
        embedding: `TiedEmbedding` (tied decoder), or None.
        vocab_size: V for an untied decoder.
        latent_dim: size of h_{c,k}. Default: embedding size (tied) or input size (untied).
        latent_dropout: locked dropout on the (B, T, K, L) components, in [0, 1). Default 0.0.
        token_frequency_rank: optional length-V sequence of distinct ranks 0..V-1. Default None.
        seed: int seed for the latent dropout. Default None.

    Input shape: `(batch, time, d)`. Output shape: `(batch, time, V)`, float32.

    Example:
    >>> emb = TiedEmbedding(100, 16)
    >>> head = MixtapeLayer(num_components=4, gate_dim=8, shared_gate_rank=20, embedding=emb)
    >>> head(np.zeros((2, 5, 32), "float32")).shape
    (2, 5, 100)

    Reference: Yang, Luong, Salakhutdinov & Le 2019, "Mixtape: Breaking the Softmax
    Bottleneck Efficiently" (NeurIPS); Parthiban 2020 (thesis), §3.1.5, eq 3.8-3.13.
    """

    def __init__(self, num_components=4, gate_dim=64, shared_gate_rank=None, embedding=None,
                 vocab_size=None, latent_dim=None, latent_dropout=0.0, token_frequency_rank=None,
                 seed=None, **kwargs):
        super().__init__(embedding=embedding, vocab_size=vocab_size, **kwargs)
        k = num_components
        if not (isinstance(k, (int, np.integer)) and k >= 1 and (k & (k - 1)) == 0):
            raise ValueError("MixtapeLayer: num_components must be a power of two (1, 2, 4, "
                             f"8, ...) for the sigmoid tree; got num_components={k!r}.")
        self.num_components = int(k)
        if not (isinstance(gate_dim, (int, np.integer)) and gate_dim >= 1):
            raise ValueError(f"MixtapeLayer: gate_dim must be a positive integer; "
                             f"got gate_dim={gate_dim!r}.")
        self.gate_dim = int(gate_dim)
        if shared_gate_rank is not None and not (
                isinstance(shared_gate_rank, (int, np.integer)) and shared_gate_rank >= 1):
            raise ValueError("MixtapeLayer: shared_gate_rank must be a positive integer or "
                             f"None; got shared_gate_rank={shared_gate_rank!r}.")
        self.shared_gate_rank = None if shared_gate_rank is None else int(shared_gate_rank)
        if latent_dim is not None and not (
                isinstance(latent_dim, (int, np.integer)) and latent_dim >= 1):
            raise ValueError(f"MixtapeLayer: latent_dim must be a positive integer or None; "
                             f"got latent_dim={latent_dim!r}.")
        if self.tied and latent_dim is not None and latent_dim != self.embedding.embed_dim:
            raise ValueError(f"MixtapeLayer: a tied decoder needs latent_dim == embed_dim "
                             f"({self.embedding.embed_dim}); got latent_dim={latent_dim}.")
        self.latent_dim = None if latent_dim is None else int(latent_dim)
        latent_dropout = float(latent_dropout)
        if not 0.0 <= latent_dropout < 1.0:
            raise ValueError(f"MixtapeLayer: latent_dropout must be in [0, 1); "
                             f"got latent_dropout={latent_dropout}.")
        self.latent_dropout = latent_dropout
        self.seed = seed
        self.token_frequency_rank = None
        if token_frequency_rank is not None:
            rank = np.asarray(token_frequency_rank).reshape(-1)
            if rank.shape[0] != self.vocab_size or not np.array_equal(
                    np.sort(rank), np.arange(self.vocab_size)):
                raise ValueError(
                    "MixtapeLayer: token_frequency_rank must be a permutation of 0..V-1 "
                    f"(V={self.vocab_size}); got an array of shape {rank.shape} with values "
                    f"from {rank.min() if rank.size else None} to "
                    f"{rank.max() if rank.size else None}.")
            self.token_frequency_rank = [int(r) for r in rank]
        self.dropout = LockedDropout(latent_dropout, seed=seed, name="latent_dropout")
        # Token order used inside: frequent (own gate) first, then shared-gate tokens.
        s = self.vocab_size if self.shared_gate_rank is None else min(self.shared_gate_rank,
                                                                      self.vocab_size)
        self._num_gated = s
        if self.token_frequency_rank is None or s == self.vocab_size:
            self._order = None          # ids already in the internal order (or no split)
        else:
            order = np.argsort(np.asarray(self.token_frequency_rank), kind="stable")
            inverse = np.empty_like(order)
            inverse[order] = np.arange(order.size)
            self._order = order.astype("int32")        # internal position -> token id
            self._inverse = inverse.astype("int32")    # token id -> internal position

    def build(self, input_shape):
        d = int(input_shape[-1])
        k, n = self.num_components, self.num_components - 1
        size = self.latent_dim or (self.embedding.embed_dim if self.tied else d)
        self._latent_units = size
        self.latent_kernel = self.add_weight(shape=(d, k * size), name="latent_kernel",
                                             initializer="glorot_uniform")
        self.latent_bias = self.add_weight(shape=(k * size,), name="latent_bias",
                                           initializer="zeros")
        if n > 0:
            self.gate_context_kernel = self.add_weight(   # U_n, stacked: (d, n * d2)
                shape=(d, n * self.gate_dim), name="gate_context_kernel",
                initializer="glorot_uniform")
            self.gate_linear_kernel = self.add_weight(    # u_n: (d, n)
                shape=(d, n), name="gate_linear_kernel", initializer="glorot_uniform")
            rows = self._num_gated + (1 if self._num_gated < self.vocab_size else 0)
            self.gate_vectors = self.add_weight(          # v_w (rows 0..S-1), shared v (row S)
                shape=(rows, self.gate_dim), name="gate_vectors",
                initializer=keras.initializers.RandomNormal(stddev=0.1, seed=self.seed))
            self.gate_bias = self.add_weight(shape=(rows, n), name="gate_bias",
                                             initializer="zeros")
        self.build_projection(size)
        self.built = True

    # -- pieces -------------------------------------------------------------------------
    def components(self, g, training=False):
        """h_{c,k} = tanh(W_k g + b_k): `(batch, time, K, L)`."""
        h = tanh_components(g, self.latent_kernel, self.latent_bias, self.num_components,
                            self._latent_units)
        return self.dropout(h, training=training)

    def _decoder(self):
        """Decoder matrix (V, L) and bias (V,) (or None) in the internal token order."""
        if self.tied:
            weight, bias = self.embedding.embeddings, self.embedding.output_bias
        else:
            weight, bias = ops.transpose(self.kernel), self.bias
        if self._order is not None:
            weight = ops.take(weight, self._order, axis=0)
            bias = None if bias is None else ops.take(bias, self._order, axis=0)
        return weight, bias

    def gate_logits(self, g):
        """Gate pre-activations: own gates `(B, T, n, S)` and the shared one `(B, T, n)` or None."""
        n, d2, s = self.num_components - 1, self.gate_dim, self._num_gated
        g32 = ops.cast(g, "float32")
        shape = ops.shape(g)
        ctx = ops.tanh(ops.matmul(g32, ops.cast(self.gate_context_kernel, "float32")))
        ctx = ops.reshape(ctx, tuple(shape[:-1]) + (n, d2))                      # tanh(U_n g)
        lin = ops.matmul(g32, ops.cast(self.gate_linear_kernel, "float32"))       # u_n^T g
        vec = ops.cast(self.gate_vectors, "float32")
        bias = ops.cast(self.gate_bias, "float32")
        own = (ops.matmul(ctx, ops.transpose(vec[:s]))                           # (B, T, n, S)
               + ops.expand_dims(lin, -1) + ops.transpose(bias[:s]))
        shared = None
        if s < self.vocab_size:
            shared = ops.sum(ctx * vec[s], axis=-1) + lin + bias[s]             # (B, T, n)
        return own, shared

    def mixture_weights(self, g):
        """pi for the own-gate tokens `(B, T, S, K)` and the shared one `(B, T, K)` or None.

        Token axis in the internal order (frequency rank order when `token_frequency_rank`
        is given and gates are shared; token id order otherwise)."""
        if not self.built:
            self.build(g.shape)
        g = ops.cast(g, self.compute_dtype)
        if self.num_components == 1:
            return None, None
        own, shared = self.gate_logits(g)
        own_pi = ops.moveaxis(sigmoid_tree(ops.sigmoid(own), axis=2), 2, -1)
        shared_pi = None if shared is None else sigmoid_tree(ops.sigmoid(shared))
        return own_pi, shared_pi

    def call(self, g, training=False):
        h = self.components(g, training=training)                             # (B, T, K, L)
        weight, bias = self._decoder()
        s = self._num_gated
        if self.num_components == 1:
            logits = ops.cast(ops.matmul(h[:, :, 0], ops.transpose(ops.cast(weight, h.dtype))),
                              "float32")
        else:
            own_a, shared_a = self.gate_logits(g)
            pi = sigmoid_tree(ops.sigmoid(own_a), axis=2)                       # (B, T, K, S)
            comp = ops.matmul(h, ops.transpose(ops.cast(weight[:s], h.dtype)))  # (B, T, K, S)
            logits = ops.sum(ops.cast(comp, "float32") * pi, axis=2)            # (B, T, S)
            if shared_a is not None:
                pi_shared = sigmoid_tree(ops.sigmoid(shared_a))                 # (B, T, K)
                mixed = ops.sum(h * ops.cast(ops.expand_dims(pi_shared, -1), h.dtype), axis=2)
                rare = ops.matmul(mixed, ops.transpose(ops.cast(weight[s:], h.dtype)))
                rare = ops.cast(rare, "float32")
                logits = ops.concatenate([logits, rare], axis=-1)              # (B, T, V)
        if bias is not None:
            logits = logits + ops.cast(bias, "float32")
        if self._order is not None:
            logits = ops.take(logits, self._inverse, axis=-1)                 # back to id order
        return ops.log_softmax(logits, axis=-1)

    def get_config(self):
        config = super().get_config()
        config.update(num_components=self.num_components, gate_dim=self.gate_dim,
                      shared_gate_rank=self.shared_gate_rank, latent_dim=self.latent_dim,
                      latent_dropout=self.latent_dropout,
                      token_frequency_rank=self.token_frequency_rank, seed=self.seed)
        return config
