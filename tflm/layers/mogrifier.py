"""The Mogrifier LSTM (Melis, Kočiský & Blunsom 2020): x and h_prev gate each other before the
LSTM step."""

import math

import keras
from keras import ops

from tflm import backends
from tflm.layers.dropout import per_stream_uniform

INITS = ("keras", "lamb")


def _low_rank_factor_initializer(fan_in, rank):
    """One factor of a rank-k product A B standing in for a (fan_in x n) matrix: A and B
    ~ TN(0, s) with s = (1 / (fan_in k)) ** (1/4), so that an entry of A B, a sum of k
    products, has about the variance 1 / fan_in of a directly drawn matrix (deepmind/lamb
    utils.make_low_rank_factorization_initializer; TN: truncated at 2 s, as TensorFlow's
    `truncated_normal` and Keras' `TruncatedNormal`)."""
    return keras.initializers.TruncatedNormal(stddev=(1.0 / (fan_in * rank)) ** 0.25)


def _fan_in_initializer():
    """lamb's cell initializer: truncated normal, variance 1 / fan_in (fan_in = rows)."""
    return keras.initializers.VarianceScaling(1.0, "fan_in", "truncated_normal")


@keras.saving.register_keras_serializable(package="tflm")
class MogrifierLSTM(keras.layers.Layer):
    """LSTM whose input x and previous output h_prev gate each other for `rounds` rounds
    before the usual LSTM step (Melis et al. 2020, eq. 1-2):

        x^{-1} = x_t,  h^0 = h_{t-1}
        x^i = 2 sigma(Q^i h^{i-1} + a^i) * x^{i-2}      for odd i in 1..r
        h^i = 2 sigma(R^i x^{i-1} + b^i) * h^{i-2}      for even i in 1..r
        (h_t, c_t) = LSTM(x^up, c_{t-1}, h^up)          x^up, h^up: the last x^i and h^i

    and the LSTM (Keras' gate order i, f, g, o; one bias b):

        z = [x^up, h^up] [W; U] + b,  i, f, o = sigma(z_i, z_f, z_o),  g = tanh(z_g)
        c_t = f c_{t-1} + i g    (cap_input_gate: c_t = f c_{t-1} + min(i, 1 - f) g)
        h_t = o tanh(c_t)

    r = 0 is the plain LSTM. With `rank` = k each Q^i (m x n) and R^i (n x m) is a product
    of a (m x k) and a (k x n) factor (the paper's "low-rank factorization"); `rank=None`
    trains full matrices. The factor 2 keeps the gates near 1 at a random initialisation.
    In row-vector form, as computed: x <- x * 2 sigma(h Q_i + a_i), Q_i `(units, features)`
    or its factors `(units, k)`, `(k, features)`; h <- h * 2 sigma(x R_i + b_i), R_i
    `(features, units)`. Round j = i - 1 (0-based) gates x when j is even, h when odd,
    as deepmind/lamb's `TiledLSTMCell._do_feature_masking` (feature_mask_rounds / _rank).
    Only the h^up fed to the gates is mogrified; the state carried on is (h_t, c_t).

    `state_dropout` p drops h_{t-1} before mogrification with one Bernoulli(1 - p) / (1 - p)
    mask per sequence and window, shared by every step (lamb's `state_dropout`, Gal &
    Ghahramani's variational dropout on the recurrent input); drawn per stream as
    `tflm.layers.LockedDropout`. Dropout on x belongs before the layer (StreamDropout or
    LockedDropout on the input sequence: the same as lamb's in-cell input transform).

    Parametrization and initialisation:
    - `init="keras"` (default): W glorot-uniform, U orthogonal, b zero with `forget_bias`
      on the forget gate (keras.layers.LSTM's unit_forget_bias).
    - `init="lamb"`: W, U ~ TN(0, 1/fan_in) (variance scaling, fan_in = rows), every bias
      ~ TN(0, 1/units) with mean `forget_bias` for the forget gate (lamb's cell_init_factor
      1 and forget_bias; lamb draws b per gate, fan_in = units).
    - the mogrifier matrices (both inits): full rank TN(0, 1/fan_in); rank k: both factors
      TN(0, s), s = (fan_in k)^(-1/4); their biases a^i, b^i zero (`mogrifier_bias`,
      lamb's; the paper's equations have none).

    Kernel: the portable loop (`keras.ops` and Keras' RNN time loop: every backend and
    device, autodiff for gradients). There is no fused kernel: x^up depends on h_{t-1}, so
    the input projection cannot be hoisted out of the loop as `WeightDropLSTM`'s portable
    path does; each step runs the 2r small gate matmuls and one [x, h] [W; U] matmul. The
    compiled paths are the backend's: XLA (`jit_compile=True` on TensorFlow, always on
    JAX), and `unroll=True` (keras.layers.LSTM's option: the time loop written out step by
    step, for a window of known length, so that the compiler sees across steps).
    bench/training/results/mogrifier_step.md measures both against the loop on a CPU: XLA
    pays (0.62-0.73x of TensorFlow's loop), unrolling does not (a minute more of
    compilation, 1.3-1.4x the loop's step under XLA, 3.3x under JAX); on a GPU unmeasured.

    Carried state: `initial_state=[h, c]`, returned with `return_state=True` (the same
    (h, c) pair per layer as `WeightDropLSTM`, so `tflm.LanguageModel` carries it between
    windows). `mask` `(batch, time)`: masked steps hold the state and output zeros.

    Args:
        units: hidden size n.
        rounds: r >= 0 (5 on PTB, 6 on WikiText-2 in the paper's tuned models).
        rank: k >= 1 of the factorized Q^i, R^i, or None (or 0, lamb's convention) for
            full matrices.
        state_dropout: p in [0, 1) on h_{t-1}, one mask per sequence per window. Default 0.
        cap_input_gate: c = f c + min(i, 1 - f) g (lamb's default, in every tuned config).
            Default False (the paper's plain LSTM).
        mogrifier_bias: train the biases a^i, b^i. Default True.
        forget_bias: the forget gate's initial bias (its mean under "lamb"). Default 1.
        init: "keras" or "lamb".
        seed: seed of the state-dropout masks.
        return_sequences: return every step's h (default True) or the last.
        return_state: also return the final [h, c].
        unroll: write the time loop out step by step (Keras' `unroll`; more memory and a
            longer compile). A window whose length is unknown when traced (a symbolic
            build) runs the loop: the same outputs. Default False.

    Input shape: `(batch, time, features)`. Output: `(batch, time, units)` (or
    `(batch, units)`), then h and c `(batch, units)` with `return_state`.

    Reference: Melis, Kočiský & Blunsom 2020, "Mogrifier LSTM" (ICLR; arXiv 1909.01792);
    deepmind/lamb lamb/tiled_lstm.py, lamb/utils.py (low_rank_factorization).
    """

    def __init__(self, units, rounds=5, rank=None, state_dropout=0.0, cap_input_gate=False,
                 mogrifier_bias=True, forget_bias=1.0, init="keras", seed=None,
                 return_sequences=True, return_state=False, unroll=False, **kwargs):
        super().__init__(**kwargs)
        if int(units) < 1:
            raise ValueError(f"MogrifierLSTM: units must be >= 1; got {units}.")
        if isinstance(rounds, bool) or int(rounds) != rounds or int(rounds) < 0:
            raise ValueError(f"MogrifierLSTM: rounds must be an integer >= 0; got {rounds!r}.")
        if rank is not None and (isinstance(rank, bool) or int(rank) != rank or int(rank) < 0):
            raise ValueError(f"MogrifierLSTM: rank must be None or 0 (full matrices) or an "
                             f"integer >= 1; got {rank!r}.")
        state_dropout = float(state_dropout)
        if not 0.0 <= state_dropout < 1.0:
            raise ValueError(f"MogrifierLSTM: state_dropout must be in [0, 1); got "
                             f"{state_dropout}.")
        if init not in INITS:
            raise ValueError(f"MogrifierLSTM: init must be one of {', '.join(map(repr, INITS))}"
                             f"; got init={init!r}.")
        self.units = int(units)
        self.rounds = int(rounds)
        self.rank = int(rank) or None if rank is not None else None  # 0: full, as lamb
        self.state_dropout = state_dropout
        self.cap_input_gate = bool(cap_input_gate)
        self.mogrifier_bias = bool(mogrifier_bias)
        self.forget_bias = float(forget_bias)
        self.init = init
        self.seed = seed
        self.return_sequences = bool(return_sequences)
        self.return_state = bool(return_state)
        self.unroll = bool(unroll)
        self.seed_generator = keras.random.SeedGenerator(seed)
        self.supports_masking = True  # `mask` is consumed (held state), not propagated
        self.mogrifier_kernels, self.mogrifier_right, self.mogrifier_biases = [], [], []

    # ---- weights -----------------------------------------------------------------------
    def build(self, sequences_shape, initial_state_shape=None):
        if self.built:
            return
        features = int(sequences_shape[-1])
        n = self.units
        self.input_dim = features
        if self.init == "keras":
            kernel_init, recurrent_init = "glorot_uniform", "orthogonal"
            bias_init = _GateBias(n, self.forget_bias, None)
        else:
            kernel_init, recurrent_init = _fan_in_initializer(), _fan_in_initializer()
            bias_init = _GateBias(n, self.forget_bias, math.sqrt(1.3 / n))
        self.kernel = self.add_weight(shape=(features, 4 * n), name="kernel",
                                      initializer=kernel_init)
        self.recurrent_kernel = self.add_weight(shape=(n, 4 * n), name="recurrent_kernel",
                                                initializer=recurrent_init)
        self.bias = self.add_weight(shape=(4 * n,), name="bias", initializer=bias_init)
        for j in range(self.rounds):
            # round j (0-based) gates x from h when even, h from x when odd
            rows, cols = (n, features) if j % 2 == 0 else (features, n)
            if self.rank is None:
                self.mogrifier_kernels.append(self.add_weight(
                    shape=(rows, cols), name=f"mogrifier_{j}", initializer=_fan_in_initializer()))
            else:
                self.mogrifier_kernels.append(self.add_weight(
                    shape=(rows, self.rank), name=f"mogrifier_{j}_left",
                    initializer=_low_rank_factor_initializer(rows, self.rank)))
                self.mogrifier_right.append(self.add_weight(
                    shape=(self.rank, cols), name=f"mogrifier_{j}_right",
                    initializer=_low_rank_factor_initializer(rows, self.rank)))
            if self.mogrifier_bias:
                self.mogrifier_biases.append(self.add_weight(
                    shape=(cols,), name=f"mogrifier_{j}_bias", initializer="zeros"))
        self.built = True

    def mogrifier_matrix(self, j):
        """The full matrix of round j (0-based; the paper's Q^{j+1} or R^{j+1} in row form):
        `(units, features)` for even j, `(features, units)` for odd j."""
        if self.rank is None:
            return ops.convert_to_tensor(self.mogrifier_kernels[j])
        return ops.matmul(self.mogrifier_kernels[j], self.mogrifier_right[j])

    # ---- the computation ---------------------------------------------------------------
    def _round_weights(self, dtype):
        rounds = []
        for j in range(self.rounds):
            left = ops.cast(self.mogrifier_kernels[j], dtype)
            right = None if self.rank is None else ops.cast(self.mogrifier_right[j], dtype)
            bias = ops.cast(self.mogrifier_biases[j], dtype) if self.mogrifier_bias else None
            rounds.append((left, right, bias))
        return rounds

    @staticmethod
    def _gate(v, left, right, bias):
        z = ops.matmul(v, left)
        if right is not None:
            z = ops.matmul(z, right)
        if bias is not None:
            z = z + bias
        return 2.0 * ops.sigmoid(z)

    def mogrify(self, x, h):
        """(x^up, h^up) of `x` `(batch, features)` and `h` `(batch, units)`."""
        return self._mogrify(x, h, self._round_weights(x.dtype))

    def _mogrify(self, x, h, rounds):
        for j, (left, right, bias) in enumerate(rounds):
            if j % 2 == 0:
                x = x * self._gate(h, left, right, bias)
            else:
                h = h * self._gate(x, left, right, bias)
        return x, h

    def state_dropout_mask(self, batch, dtype):
        """A fresh (batch, units) mask of 0 and 1 / (1 - p), one row per stream."""
        keep = 1.0 - self.state_dropout
        kept = ops.cast(per_stream_uniform((batch, self.units), self.seed_generator) < keep,
                        dtype)
        return kept / backends.current().constant(keep, kept)

    def call(self, sequences, initial_state=None, mask=None, training=False):
        dtype = sequences.dtype
        batch = ops.shape(sequences)[0]
        if initial_state is None:
            zeros = ops.zeros((batch, self.units), dtype)
            initial_state = [zeros, zeros]
        initial_state = [ops.cast(s, dtype) for s in initial_state]
        if isinstance(mask, (list, tuple)):
            mask = mask[0]
        weights = ops.concatenate([ops.cast(self.kernel, dtype),
                                   ops.cast(self.recurrent_kernel, dtype)], axis=0)
        bias = ops.cast(self.bias, dtype)
        rounds = self._round_weights(dtype)
        drop = None
        if training and self.state_dropout > 0.0:
            drop = self.state_dropout_mask(batch, dtype)

        def step(x_t, states):
            h_prev, c_prev = states
            h_in = h_prev if drop is None else h_prev * drop
            x_up, h_up = self._mogrify(x_t, h_in, rounds)
            z = ops.matmul(ops.concatenate([x_up, h_up], axis=-1), weights) + bias
            z_i, z_f, z_g, z_o = ops.split(z, 4, axis=-1)
            i, f = ops.sigmoid(z_i), ops.sigmoid(z_f)
            if self.cap_input_gate:
                i = ops.minimum(i, 1.0 - f)
            c = f * c_prev + i * ops.tanh(z_g)
            h = ops.sigmoid(z_o) * ops.tanh(c)
            return h, [h, c]

        unroll = self.unroll and isinstance(sequences.shape[1], int)
        last, outputs, states = backends.current().rnn_loop(
            step, sequences, initial_state, mask=mask, go_backwards=False, unroll=unroll,
            zero_output_for_mask=True, return_all_outputs=self.return_sequences)
        if unroll and mask is not None and self.return_sequences:
            # Keras' unrolled loop on JAX repeats the last output at masked steps instead
            # of zeroing them (zero_output_for_mask); the loop zeroes them itself
            outputs = outputs * ops.cast(mask, outputs.dtype)[:, :, None]
        output = outputs if self.return_sequences else last
        if self.return_state:
            return [output] + list(states)
        return output

    def compute_mask(self, sequences, mask=None):
        return None

    def compute_output_shape(self, sequences_shape, initial_state_shape=None):
        batch = sequences_shape[0]
        output = ((batch, sequences_shape[1], self.units) if self.return_sequences
                  else (batch, self.units))
        if self.return_state:
            return [output, (batch, self.units), (batch, self.units)]
        return output

    def get_config(self):
        config = super().get_config()
        config.update(units=self.units, rounds=self.rounds, rank=self.rank,
                      state_dropout=self.state_dropout, cap_input_gate=self.cap_input_gate,
                      mogrifier_bias=self.mogrifier_bias, forget_bias=self.forget_bias,
                      init=self.init, seed=self.seed, return_sequences=self.return_sequences,
                      return_state=self.return_state, unroll=self.unroll)
        return config


@keras.saving.register_keras_serializable(package="tflm")
class _GateBias(keras.initializers.Initializer):
    """The (4 units,) LSTM bias: zeros (stddev None) or TN(0, stddev), plus `forget_bias`
    on the forget gate's slice (Keras' gate order i, f, g, o)."""

    def __init__(self, units, forget_bias=1.0, stddev=None, seed=None):
        self.units, self.forget_bias, self.stddev = int(units), float(forget_bias), stddev
        self.seed = seed
        self._normal = (None if stddev is None
                        else keras.initializers.TruncatedNormal(stddev=stddev, seed=seed))

    def __call__(self, shape, dtype=None):
        n = self.units
        offset = ops.concatenate([ops.zeros((n,)), ops.full((n,), self.forget_bias),
                                  ops.zeros((2 * n,))])
        offset = ops.cast(offset, dtype or "float32")
        if self._normal is None:
            return offset
        return self._normal(shape, dtype) + offset

    def get_config(self):
        return {"units": self.units, "forget_bias": self.forget_bias, "stddev": self.stddev,
                "seed": self.seed}
