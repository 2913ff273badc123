"""Keras weight regularizers of the output-embedding geometry (thesis 000 §3.2).

Each is a `keras.regularizers.Regularizer`: pass it as a layer's weight regularizer
(`TiedEmbedding(..., embeddings_regularizer=CosineSimilarityRegularizer(1.0))`) and its
penalty joins `model.losses`, hence the training loss, on every backend. Evaluation
(perplexity) never includes it.

- `CosineSimilarityRegularizer`: MLE-CosReg (Gao et al. 2019), the mean pairwise cosine
  similarity of the embedding rows, in O(N d).
- `OrthogonalityRegularizer`: the Frobenius and spectral penalties on W^T W - I of spectrum
  control (Wang et al. 2020), for its U and V factors.
- `SingularValueDecayRegularizer`: spectrum control's exponential or polynomial target for
  the singular values s_k.
"""

import math

import keras
from keras import ops


def _non_negative(name, value):
    value = float(value)
    if not value >= 0.0:
        raise ValueError(f"{name} must be >= 0; got {name}={value!r}.")
    return value


@keras.saving.register_keras_serializable(package="tflm")
class CosineSimilarityRegularizer(keras.regularizers.Regularizer):
    """MLE-CosReg: gamma times the mean pairwise cosine similarity of the rows of E.

        R(E) = gamma / N^2 * sum_{i != j} e_i^T e_j / (|e_i| |e_j|)
             = gamma / N^2 * ( | sum_i e_i / |e_i| |^2 - N )

    The second form is computed (O(N d); no N x N matrix). A zero row counts as a zero
    unit vector (its norm is floored at 1e-12). Gradients push the rows apart in angle,
    against the "narrow cone" the output embeddings of a trained language model occupy.

    Args:
        gamma: the coefficient (not published for the thesis' Table 3.6; 1.0 by default).

    Reference: Gao et al. 2019 (ICLR), "Representation Degeneration Problem in Training
    Natural Language Generation Models"; thesis 000 §3.2.1, eq. 3.17.
    """

    def __init__(self, gamma=1.0):
        self.gamma = _non_negative("gamma", gamma)

    def __call__(self, x):
        x = ops.cast(x, "float32")
        n = ops.cast(ops.shape(x)[0], "float32")
        norms = ops.sqrt(ops.maximum(ops.sum(ops.square(x), axis=-1, keepdims=True), 1e-24))
        total = ops.sum(x / norms, axis=0)
        return self.gamma * (ops.sum(ops.square(total)) - n) / ops.square(n)

    def get_config(self):
        return {"gamma": self.gamma}


@keras.saving.register_keras_serializable(package="tflm")
class OrthogonalityRegularizer(keras.regularizers.Regularizer):
    """Orthonormal columns: frobenius * |W^T W - I|_F^2 + spectral * |W^T W - I|_2^2.

    For a `(n, d)` weight (n >= d) whose columns spectrum control keeps orthonormal (its U,
    `(V, d)`, and V, `(d, d)`; thesis eq. 3.19 with lambda_1..4). The spectral norm of the
    symmetric `(d, d)` matrix comes from its singular values (`ops.norm(ord=2)`).

    With `scale` c the weight x holds c W and the penalty is that of W = x / c (with
    x^T x / c^2 - I): `tflm.layers.SpectralEmbedding` stores its factors scaled so that SGD
    steps E as far as it steps a plain embedding.

    Args:
        frobenius: weight of the squared Frobenius norm (0.01: lmkit's `u_fn` / `v_fn`).
        spectral: weight of the squared spectral norm (0.01: lmkit's `u_sn` / `v_sn`; 0
            skips the d x d SVD).
        scale: c > 0, the factor the weight holds W times. Default 1.0.

    Reference: Wang et al. 2020 (ICLR), "Improving Neural Language Generation with Spectrum
    Control"; thesis 000 §3.2.2, eq. 3.19.
    """

    def __init__(self, frobenius=0.01, spectral=0.01, scale=1.0):
        self.frobenius = _non_negative("frobenius", frobenius)
        self.spectral = _non_negative("spectral", spectral)
        self.scale = float(scale)
        if not self.scale > 0.0:
            raise ValueError(f"scale must be > 0; got scale={scale!r}.")

    def __call__(self, x):
        x = ops.cast(x, "float32")
        d = ops.shape(x)[-1]
        gram = ops.matmul(ops.transpose(x), x)
        if self.scale != 1.0:
            gram = gram / (self.scale * self.scale)
        gram = gram - ops.eye(d, dtype="float32")
        penalty = self.frobenius * ops.sum(ops.square(gram))
        if self.spectral:
            penalty = penalty + self.spectral * ops.square(ops.norm(gram, ord=2))
        return penalty

    def get_config(self):
        return {"frobenius": self.frobenius, "spectral": self.spectral, "scale": self.scale}


def decay_target(num_values, kind="exponential", c1=1.0, c2=0.01, gamma=1.0):
    """Target singular values t_k, k = 1..num_values, as a float list.

        exponential: t_k = c1 * exp(-c2 * k^gamma)    (thesis eq. 3.20)
        polynomial:  t_k = c1 * k^gamma               (eq. 3.21; gamma < 0 decays)
    """
    if kind == "exponential":
        return [c1 * math.exp(-c2 * k ** gamma) for k in range(1, num_values + 1)]
    if kind == "polynomial":
        return [c1 * k ** gamma for k in range(1, num_values + 1)]
    raise ValueError(f"kind must be 'exponential' or 'polynomial'; got kind={kind!r}.")


@keras.saving.register_keras_serializable(package="tflm")
class SingularValueDecayRegularizer(keras.regularizers.Regularizer):
    """strength * sum_k (s_k - t_k)^2 with t_k = `decay_target(k, kind, c1, c2, gamma)`.

    For the `(d,)` singular values s of spectrum control's E = U diag(s) V^T: pulls the
    spectrum towards a slow exponential (AWD-LSTM, thesis eq. 3.20) or polynomial (eq. 3.21)
    decay, against the fast decay of degenerate embeddings. The published constants are
    unknown (thesis §5.3.2); see `tflm.layers.SpectralEmbedding` for the defaults it derives.

    Args:
        c1, c2, gamma: the target's constants (c2 unused for "polynomial").
        strength: lambda_e / lambda_p. Default 0.01.
        kind: "exponential" (default) or "polynomial".

    Reference: Wang et al. 2020 (ICLR); thesis 000 §3.2.2, eqs. 3.20-3.21.
    """

    def __init__(self, c1, c2=0.01, gamma=1.0, strength=0.01, kind="exponential"):
        decay_target(1, kind, float(c1), float(c2), float(gamma))  # checks kind
        self.c1, self.c2, self.gamma = float(c1), float(c2), float(gamma)
        self.strength = _non_negative("strength", strength)
        self.kind = kind

    def __call__(self, s):
        s = ops.cast(s, "float32")
        target = ops.convert_to_tensor(
            decay_target(int(s.shape[0]), self.kind, self.c1, self.c2, self.gamma), "float32")
        return self.strength * ops.sum(ops.square(s - target))

    def get_config(self):
        return {"c1": self.c1, "c2": self.c2, "gamma": self.gamma, "strength": self.strength,
                "kind": self.kind}
