"""Spectrum control: the tied embedding parametrized by its singular value decomposition."""

import math

import keras
import numpy as np
from keras import ops

from tflm import backends
from tflm.layers.embedding import TiedEmbedding
from tflm.regularizers import OrthogonalityRegularizer, SingularValueDecayRegularizer


def derived_decay_constants(largest, smallest, count, kind="exponential", gamma=1.0):
    """(c1, c2) of the decay target through `largest` at k = 1 and `smallest` at k = count.

        exponential: c1 exp(-c2 k^gamma):  c2 = ln(largest / smallest) / (count^gamma - 1),
                     c1 = largest exp(c2)
        polynomial:  c1 k^gamma with c1 = largest (c2 unused, returned as 0)
    """
    if kind == "polynomial" or count < 2 or smallest <= 0:
        return float(largest), 0.0
    c2 = math.log(largest / smallest) / (count ** gamma - 1.0)
    return float(largest * math.exp(c2)), float(c2)


def initial_singular_value_range(initializer, rows, cols):
    """(s_max, s_min) of a rows x cols matrix of i.i.d. entries drawn by `initializer`, from
    the Marchenko-Pastur edges sigma (sqrt(rows) +- sqrt(cols)) (rows >= cols), with sigma
    the entries' standard deviation; None for an initializer of unknown spread."""
    config = initializer.get_config() if hasattr(initializer, "get_config") else {}
    if isinstance(initializer, keras.initializers.RandomUniform):
        sigma = (config["maxval"] - config["minval"]) / math.sqrt(12.0)
    elif isinstance(initializer, keras.initializers.TruncatedNormal):
        sigma = config["stddev"] * 0.8796  # the std of N(0, 1) truncated at +-2
    elif isinstance(initializer, keras.initializers.RandomNormal):
        sigma = config["stddev"]
    else:
        return None
    return (sigma * (math.sqrt(rows) + math.sqrt(cols)),
            sigma * (math.sqrt(rows) - math.sqrt(cols)))


@keras.saving.register_keras_serializable(package="tflm")
class SpectralEmbedding(TiedEmbedding):
    """A `TiedEmbedding` whose matrix is E = U diag(s) V^T, with spectrum control's penalties.

        E = U diag(s) V^T,   U (vocab_size, d),  s (d,),  V (d, d)
        lookup e_w = (U_w * s) V^T;   logits = ((h V) * s) U^T + b    (E never formed)
        penalties (training loss, via the weights' regularizers):
            frobenius (|U^T U - I|_F^2 + |V^T V - I|_F^2)
          + spectral  (|U^T U - I|_2^2 + |V^T V - I|_2^2)                     (eq. 3.19)
          + strength sum_k (s_k - c1 exp(-c2 k^gamma))^2   (exponential, eq. 3.20)
                   or sum_k (s_k - c1 k^gamma)^2           (polynomial, eq. 3.21)

    Initialisation: the SVD of a matrix drawn from `embeddings_initializer` (the same
    distribution of E as `TiedEmbedding`), or of a given matrix with `assign_matrix(E)` /
    `SpectralEmbedding.from_matrix(E)`, which then represent E exactly (to float32 rounding).

    Defaults, since the published constants are unknown (thesis 000 §5.3.2: "not available
    publicly"): the orthogonality weights are lmkit's (`u_fn = v_fn = u_sn = v_sn = 0.01`);
    the decay target passes through the largest and smallest singular values of the random
    initial matrix (`initial_singular_value_range`, the Marchenko-Pastur edges: for the
    AWD-LSTM PTB initialisation U(-0.1, 0.1), 10,000 x 400, 6.9 and 4.6; then
    `derived_decay_constants`), i.e. it keeps the slow decay of a well-conditioned random
    matrix against the fast decay of degenerate trained embeddings; its strength is
    0.01 per singular value (lmkit's 0.1 weighs a loss of unknown scale; 0.01 keeps the
    penalty of a spectrum 1 off its target at d = 400 at 4 nats at most, and the shortened
    runs in bench/RESULTS_regularizers.md show its effect). With an initializer of unknown
    spread, pass `decay_c1` and `decay_c2`.

    Args:
        vocab_size, embed_dim, embeddings_initializer, use_output_bias: as `TiedEmbedding`.
        orthogonality_frobenius, orthogonality_spectral: lambda of the Frobenius and
            spectral orthogonality penalties of U and V. Default 0.01 and 0.01.
        decay: "exponential" (default, the AWD-LSTM choice), "polynomial" or None (no
            singular-value target).
        decay_strength: lambda_e / lambda_p. Default 0.01.
        decay_c1, decay_c2: the target's constants; None derives them (above).
        decay_gamma: the exponent gamma. Default 1.0 (polynomial: pass a negative one).

    Input shape: integer `(batch, time)`. Output shape: `(batch, time, embed_dim)`.
    The `embeddings` property is E, computed (read-only).

    Example:
    >>> emb = SpectralEmbedding(100, 16)
    >>> emb.reverse(emb(np.zeros((2, 5), "int32"))).shape
    (2, 5, 100)

    Reference: Wang et al. 2020 (ICLR), "Improving Neural Language Generation with Spectrum
    Control"; thesis 000 §3.2.2.
    """

    def __init__(self, vocab_size, embed_dim, embeddings_initializer=None,
                 use_output_bias=True, orthogonality_frobenius=0.01,
                 orthogonality_spectral=0.01, decay="exponential", decay_strength=0.01,
                 decay_c1=None, decay_c2=None, decay_gamma=1.0, **kwargs):
        kwargs.pop("embeddings_regularizer", None)
        super().__init__(vocab_size, embed_dim, embeddings_initializer=embeddings_initializer,
                         use_output_bias=use_output_bias, **kwargs)
        if self.embed_dim > self.vocab_size:
            raise ValueError(f"SpectralEmbedding needs embed_dim <= vocab_size (U is V x d "
                             f"with orthonormal columns); got {vocab_size} x {embed_dim}.")
        if decay not in ("exponential", "polynomial", None):
            raise ValueError(f"decay must be 'exponential', 'polynomial' or None; got "
                             f"decay={decay!r}.")
        self.orthogonality = OrthogonalityRegularizer(orthogonality_frobenius,
                                                      orthogonality_spectral)
        self.decay = decay
        self.decay_strength = float(decay_strength)
        self.decay_gamma = float(decay_gamma)
        if decay is not None and (decay_c1 is None or decay_c2 is None):
            edges = initial_singular_value_range(self.embeddings_initializer, self.vocab_size,
                                                 self.embed_dim)
            if edges is None:
                raise ValueError(
                    "SpectralEmbedding derives the decay target from a RandomUniform / "
                    "RandomNormal / TruncatedNormal initializer; with "
                    f"{type(self.embeddings_initializer).__name__}, pass decay_c1 and "
                    "decay_c2.")
            c1, c2 = derived_decay_constants(*edges, self.embed_dim, decay, self.decay_gamma)
            decay_c1 = c1 if decay_c1 is None else decay_c1
            decay_c2 = c2 if decay_c2 is None else decay_c2
        self.decay_c1 = None if decay_c1 is None else float(decay_c1)
        self.decay_c2 = None if decay_c2 is None else float(decay_c2)

    def build(self, input_shape=None):
        if self.built:
            return
        decay = None if self.decay is None else SingularValueDecayRegularizer(
            self.decay_c1, self.decay_c2, self.decay_gamma, self.decay_strength, self.decay)
        factors = {}

        def factor(index):
            # One draw of E and one SVD for the three weights, made when the first weight
            # is initialised. JAX initialises the weights a traced build makes later, with
            # concrete values, and may call this inside the trace meanwhile: traced values
            # are used once and never kept.
            def initializer(shape, dtype=None):
                if factors:
                    return ops.cast(factors[index], dtype)
                start = self.embeddings_initializer((self.vocab_size, self.embed_dim),
                                                    "float32")
                u, s, vt = ops.svd(start, full_matrices=False)
                values = dict(u=u, s=s, v=ops.transpose(vt))
                if backends.current().is_concrete(s):
                    factors.update(values)
                return ops.cast(values[index], dtype)
            return initializer

        self.left = self.add_weight(shape=(self.vocab_size, self.embed_dim), name="left",
                                    initializer=factor("u"), regularizer=self.orthogonality)
        self.singular_values = self.add_weight(shape=(self.embed_dim,), name="singular_values",
                                               initializer=factor("s"), regularizer=decay)
        self.right = self.add_weight(shape=(self.embed_dim, self.embed_dim), name="right",
                                     initializer=factor("v"), regularizer=self.orthogonality)
        self.output_bias = None
        if self.use_output_bias:
            self.output_bias = self.add_weight(shape=(self.vocab_size,), name="output_bias",
                                               initializer="zeros")
        self.built = True

    @property
    def embeddings(self):
        """E = U diag(s) V^T, `(vocab_size, embed_dim)` float32 (computed)."""
        if not self.built:
            self.build()
        return ops.matmul(ops.cast(self.left, "float32") * ops.cast(self.singular_values,
                                                                    "float32"),
                          ops.transpose(ops.cast(self.right, "float32")))

    def assign_matrix(self, matrix):
        """Set U, s, V to the SVD of `matrix` (V x d): the layer then represents it exactly
        (to float32 rounding). The output bias is left as it is."""
        matrix = np.asarray(matrix, np.float64)
        if matrix.shape != (self.vocab_size, self.embed_dim):
            raise ValueError(f"assign_matrix needs a ({self.vocab_size}, {self.embed_dim}) "
                             f"matrix; got shape {matrix.shape}.")
        if not self.built:
            self.build()
        u, s, vt = np.linalg.svd(matrix, full_matrices=False)
        self.left.assign(u.astype(np.float32))
        self.singular_values.assign(s.astype(np.float32))
        self.right.assign(vt.T.astype(np.float32))

    @classmethod
    def from_matrix(cls, matrix, **kwargs):
        """A built layer representing `matrix` (V x d); `kwargs` as the constructor's."""
        matrix = np.asarray(matrix)
        layer = cls(matrix.shape[0], matrix.shape[1], **kwargs)
        layer.build()
        layer.assign_matrix(matrix)
        return layer

    def _scaled_rows(self, ids, dtype):
        rows = ops.take(ops.cast(self.left, dtype), ops.cast(ids, "int32"), axis=0)
        rows = rows * ops.cast(self.singular_values, dtype)
        return ops.matmul(rows, ops.transpose(ops.cast(self.right, dtype)))

    def call(self, ids):
        return self._scaled_rows(ids, self.compute_dtype)

    def target_vectors(self, ids):
        if not self.built:
            self.build()
        return self._scaled_rows(ids, "float32")

    def reverse(self, h):
        if not self.built:
            self.build()
        projected = ops.matmul(h, ops.cast(self.right, h.dtype)) * ops.cast(
            self.singular_values, h.dtype)
        logits = ops.matmul(projected, ops.transpose(ops.cast(self.left, h.dtype)))
        if self.output_bias is not None:
            logits = logits + ops.cast(self.output_bias, h.dtype)
        return logits

    def spectrum_options(self):
        """The spectrum-control arguments (with the derived decay constants)."""
        return dict(
            orthogonality_frobenius=self.orthogonality.frobenius,
            orthogonality_spectral=self.orthogonality.spectral, decay=self.decay,
            decay_strength=self.decay_strength, decay_c1=self.decay_c1,
            decay_c2=self.decay_c2, decay_gamma=self.decay_gamma)

    def get_config(self):
        config = super().get_config()
        config.pop("embeddings_regularizer", None)
        config.update(self.spectrum_options())
        return config
