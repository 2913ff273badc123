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


def initial_entry_std(initializer):
    """The standard deviation of the i.i.d. entries `initializer` draws, or None for an
    initializer of unknown spread (anything but RandomUniform / RandomNormal /
    TruncatedNormal)."""
    config = initializer.get_config() if hasattr(initializer, "get_config") else {}
    if isinstance(initializer, keras.initializers.RandomUniform):
        return (config["maxval"] - config["minval"]) / math.sqrt(12.0)
    if isinstance(initializer, keras.initializers.TruncatedNormal):
        return config["stddev"] * 0.8796  # the std of N(0, 1) truncated at +-2
    if isinstance(initializer, keras.initializers.RandomNormal):
        return config["stddev"]
    return None


def initial_singular_value_range(initializer, rows, cols):
    """(s_max, s_min) of a rows x cols matrix of i.i.d. entries drawn by `initializer`, from
    the Marchenko-Pastur edges sigma (sqrt(rows) +- sqrt(cols)) (rows >= cols), with sigma
    the entries' standard deviation; None for an initializer of unknown spread."""
    sigma = initial_entry_std(initializer)
    if sigma is None:
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

    Storage: the weights `left` and `right` hold c U and c V, c = `factor_scale` (`u` and `v`
    give U and V). An SGD step on the factors moves E by lr (G V D V^T + U D U^T G + ...)
    with D = diag(s_k^2 / c^2) (G the gradient in E): stored as plain orthonormal U and V
    (c = 1) that is s_k^2 ~ 33 times a plain embedding's step at the AWD-LSTM PTB
    initialisation, and lr 30 diverged within ten steps; with c the rms initial singular
    value, sigma sqrt(vocab_size) (5.77 for U(-0.1, 0.1) and 10,000 words), D ~ I and
    clipping and learning rates mean what they mean for `TiedEmbedding`.

    Defaults. The published constants are unknown (thesis 000 §5.3.2: "not available
    publicly"), so they come from a sweep of three short PTB epochs (100k training tokens,
    embedding 200, SGD lr 30; bench/heads/results/regularizers_spectrum_sweep.md),
    baseline test perplexity 568.5 with s_100 / s_1 0.150:
    - orthogonality 1e-4 (Frobenius and spectral): 594.5 (+4.6 %), s_100 / s_1 0.176, the
      rows' mean cosine 1.6e-3 (baseline 2.8e-3). lmkit's 0.01 (`u_fn`, `u_sn`) keeps the
      spectrum nearly flat (0.83) but perplexity lags by 30 % (740.2; as we read it, with U
      and V orthonormal E grows a dominant direction only by rotating U's columns into it
      and then raising their s_k); 0.001 still costs 33 % (757.2). Raise it for a flatter
      spectrum at that price.
    - decay: exponential (the paper's choice for AWD-LSTM) through the largest and smallest
      singular values of the random initial matrix (`initial_singular_value_range`, the
      Marchenko-Pastur edges: 6.9 and 4.6 for U(-0.1, 0.1), 10,000 x 400; then
      `derived_decay_constants`): the slow decay of a well-conditioned random matrix against
      the fast decay of degenerate trained embeddings. Strength 0.01: with orthogonality
      0.01, 0.001 / 0.01 / no target gave 741.4 / 740.2 / 730.5 and 0.1 gave 803.8.
    With an initializer of unknown spread pass `factor_scale`, `decay_c1` and `decay_c2`.

    Args:
        vocab_size, embed_dim, embeddings_initializer, use_output_bias: as `TiedEmbedding`.
        orthogonality_frobenius, orthogonality_spectral: lambda of the Frobenius and
            spectral orthogonality penalties of U and V. Default 1e-4 and 1e-4.
        decay: "exponential" (default, the AWD-LSTM choice), "polynomial" or None (no
            singular-value target).
        decay_strength: lambda_e / lambda_p. Default 0.01.
        decay_c1, decay_c2: the target's constants; None derives them (above).
        decay_gamma: the exponent gamma. Default 1.0 (polynomial: pass a negative one).
        factor_scale: c > 0, the factor `left` and `right` hold U and V times; None: the
            rms initial singular value (above). 1.0 stores U and V as they are.

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
                 use_output_bias=True, orthogonality_frobenius=1e-4,
                 orthogonality_spectral=1e-4, decay="exponential", decay_strength=0.01,
                 decay_c1=None, decay_c2=None, decay_gamma=1.0, factor_scale=None, **kwargs):
        kwargs.pop("embeddings_regularizer", None)
        super().__init__(vocab_size, embed_dim, embeddings_initializer=embeddings_initializer,
                         use_output_bias=use_output_bias, **kwargs)
        if self.embed_dim > self.vocab_size:
            raise ValueError(f"SpectralEmbedding needs embed_dim <= vocab_size (U is V x d "
                             f"with orthonormal columns); got {vocab_size} x {embed_dim}.")
        if decay not in ("exponential", "polynomial", None):
            raise ValueError(f"decay must be 'exponential', 'polynomial' or None; got "
                             f"decay={decay!r}.")
        if factor_scale is None:
            sigma = initial_entry_std(self.embeddings_initializer)
            if sigma is None:
                raise ValueError(
                    "SpectralEmbedding derives factor_scale from a RandomUniform / "
                    "RandomNormal / TruncatedNormal initializer; with "
                    f"{type(self.embeddings_initializer).__name__}, pass factor_scale (the "
                    "rms singular value of the initial matrix) and decay_c1, decay_c2.")
            factor_scale = sigma * math.sqrt(self.vocab_size)
        self.factor_scale = float(factor_scale)
        if not self.factor_scale > 0.0:
            raise ValueError(f"factor_scale must be > 0; got factor_scale={factor_scale!r}.")
        self.orthogonality = OrthogonalityRegularizer(orthogonality_frobenius,
                                                      orthogonality_spectral,
                                                      scale=self.factor_scale)
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
                values = dict(u=u * self.factor_scale, s=s,
                              v=ops.transpose(vt) * self.factor_scale)
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

    def _weighted_values(self, dtype):
        """s / c^2: E = left diag(s / c^2) right^T, the factors being stored as c U, c V."""
        return ops.cast(self.singular_values, dtype) / ops.cast(self.factor_scale ** 2, dtype)

    @property
    def u(self):
        """U, `(vocab_size, embed_dim)` float32, orthonormal columns at initialization."""
        if not self.built:
            self.build()
        return ops.cast(self.left, "float32") / self.factor_scale

    @property
    def v(self):
        """V, `(embed_dim, embed_dim)` float32, orthogonal at initialization."""
        if not self.built:
            self.build()
        return ops.cast(self.right, "float32") / self.factor_scale

    @property
    def embeddings(self):
        """E = U diag(s) V^T, `(vocab_size, embed_dim)` float32 (computed)."""
        if not self.built:
            self.build()
        return ops.matmul(ops.cast(self.left, "float32") * self._weighted_values("float32"),
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
        self.left.assign((u * self.factor_scale).astype(np.float32))
        self.singular_values.assign(s.astype(np.float32))
        self.right.assign((vt.T * self.factor_scale).astype(np.float32))

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
        rows = rows * self._weighted_values(dtype)
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
        projected = ops.matmul(h, ops.cast(self.right, h.dtype)) * self._weighted_values(
            h.dtype)
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
            decay_c2=self.decay_c2, decay_gamma=self.decay_gamma,
            factor_scale=self.factor_scale)

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        # Saved before `factor_scale` existed: the weights hold U and V themselves.
        config.setdefault("factor_scale", 1.0)
        return super().from_config(config)

    def get_config(self):
        config = super().get_config()
        config.pop("embeddings_regularizer", None)
        config.update(self.spectrum_options())
        return config
