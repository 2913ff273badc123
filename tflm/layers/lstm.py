"""LSTM with DropConnect on the recurrent kernel (AWD-LSTM's weight drop), cuDNN path kept."""

import keras
from keras import ops
from keras.src import backend as keras_backend  # backend.lstm / backend.rnn: the fused kernels


@keras.saving.register_keras_serializable(package="tflm")
class WeightDropLSTM(keras.layers.LSTM):
    """`keras.layers.LSTM` whose hidden-to-hidden matrix gets DropConnect.

        U~ = U * M / (1 - p),   M ~ Bernoulli(1 - p) element-wise, shape (units, 4 units)

    One mask is drawn per forward call (per BPTT window) and shared by every time step and
    every sequence of the batch; inference uses U unchanged. The dropped matrix is an ordinary
    tensor handed to the backend's fused LSTM, so the cuDNN kernel still runs on TensorFlow
    and PyTorch GPUs (PyTorch through `tflm.backends.torch_lstm`, which also gives a CPU the
    fused oneDNN kernel); JAX GPUs get cuDNN also for padded windows, with per-sequence
    lengths (`tflm.backends.jax_lstm`). Otherwise (TensorFlow CPU, JAX CPU) the layer runs
    its own loop with the same dropped matrix, computing the input projection x W + b for
    all steps at once and only h U~ inside the loop. Gradients flow to U through the mask
    (dU = M / (1 - p) * dU~).

    Args:
        units: hidden size.
        weight_dropout: p in [0, 1), DropConnect rate on the recurrent kernel. Default 0.5.
        seed: int seed of the mask's `SeedGenerator`.
        **lstm_kwargs: any `keras.layers.LSTM` argument (`return_sequences`,
            `return_state`, `dropout`, `use_cudnn`, initializers, ...). `recurrent_dropout`
            cannot be combined with `weight_dropout > 0` (both drop the recurrent path and the
            former disables cuDNN).

    Input shape: `(batch, time, features)`. Output shape: as `keras.layers.LSTM`.

    Example:
    >>> lstm = WeightDropLSTM(32, weight_dropout=0.5, return_sequences=True, return_state=True)
    >>> y, h, c = lstm(np.zeros((2, 7, 8), "float32"), training=True)

    Reference: Wan et al. 2013 (DropConnect); Merity et al. 2018 (AWD-LSTM, WeightDrop).
    """

    def __init__(self, units, weight_dropout=0.5, seed=None, **lstm_kwargs):
        weight_dropout = float(weight_dropout)
        if not 0.0 <= weight_dropout < 1.0:
            raise ValueError(
                f"WeightDropLSTM: weight_dropout must be in [0, 1); got {weight_dropout}.")
        if weight_dropout > 0 and lstm_kwargs.get("recurrent_dropout", 0.0):
            raise ValueError(
                "WeightDropLSTM: recurrent_dropout="
                f"{lstm_kwargs['recurrent_dropout']} cannot be combined with weight_dropout="
                f"{weight_dropout}; use weight_dropout (DropConnect) alone.")
        super().__init__(units, seed=seed, **lstm_kwargs)
        self.weight_dropout = weight_dropout
        self.weight_drop_seed = seed
        self.weight_drop_seed_generator = keras.random.SeedGenerator(seed)

    def recurrent_kernel_mask(self):
        """A fresh DropConnect mask for U: 0 or 1/(1-p), shape (units, 4 units)."""
        keep = 1.0 - self.weight_dropout
        shape = tuple(self.cell.recurrent_kernel.shape)
        kept = keras.random.uniform(shape, seed=self.weight_drop_seed_generator) < keep
        return ops.cast(kept, self.cell.recurrent_kernel.dtype) / keep

    def _recurrent_kernel(self, training):
        kernel = self.cell.recurrent_kernel
        if training and self.weight_dropout > 0.0:
            return ops.convert_to_tensor(kernel) * self.recurrent_kernel_mask()
        return kernel

    def inner_loop(self, sequences, initial_state, mask, training=False):
        if isinstance(mask, (list, tuple)):
            mask = mask[0]
        if self.recurrent_dropout:
            return super().inner_loop(sequences, initial_state, mask, training=training)
        cell = self.cell
        if training and 0.0 < self.dropout < 1.0:
            input_mask = cell.get_dropout_mask(sequences[:, 0, :])
            sequences = sequences * ops.expand_dims(input_mask, axis=1)
        recurrent_kernel = self._recurrent_kernel(training)
        if self.use_cudnn in ("auto", True):
            fused = self._torch_fused_loop(sequences, initial_state, mask, recurrent_kernel)
            if fused is not None:
                return fused
            try:
                out = keras_backend.lstm(
                    sequences, initial_state[0], initial_state[1], mask,
                    kernel=cell.kernel, recurrent_kernel=recurrent_kernel, bias=cell.bias,
                    activation=cell.activation,
                    recurrent_activation=cell.recurrent_activation,
                    return_sequences=self.return_sequences, go_backwards=self.go_backwards,
                    unroll=self.unroll)
                if keras_backend.backend() == "tensorflow":
                    self.supports_jit = False
                return out
            except NotImplementedError:
                pass
            try:
                return self._jax_cudnn_masked(sequences, initial_state, mask, recurrent_kernel)
            except NotImplementedError:
                pass
        if self.use_cudnn is True:
            raise ValueError(
                "WeightDropLSTM: use_cudnn=True but cuDNN is not available for this layer "
                "configuration or device; pass use_cudnn='auto' to use the portable loop.")
        return self._portable_loop(sequences, initial_state, mask, recurrent_kernel)

    def _torch_fused_loop(self, sequences, initial_state, mask, recurrent_kernel):
        """PyTorch: its fused kernel (cuDNN on a GPU, oneDNN on a CPU, where Keras would run
        a Python loop per step) when the layer is the standard LSTM (tanh / sigmoid, no
        mask, forwards); None otherwise."""
        from keras.src import activations
        cell = self.cell
        if (keras_backend.backend() != "torch" or mask is not None or self.go_backwards
                or self.unroll or cell.activation is not activations.tanh
                or cell.recurrent_activation is not activations.sigmoid):
            return None
        from tflm.backends.torch_lstm import fused_lstm
        return fused_lstm(sequences, initial_state[0], initial_state[1],
                          ops.convert_to_tensor(cell.kernel),
                          ops.convert_to_tensor(recurrent_kernel),
                          None if cell.bias is None else ops.convert_to_tensor(cell.bias),
                          return_sequences=self.return_sequences)

    def _jax_cudnn_masked(self, sequences, initial_state, mask, recurrent_kernel):
        """JAX with a mask of real positions (padded windows; every window under `jit`):
        cuDNN with per-sequence lengths on a GPU, where Keras would loop. Raises
        `NotImplementedError` where that does not apply."""
        from keras.src import activations
        cell = self.cell
        if (keras_backend.backend() != "jax" or mask is None or self.go_backwards
                or self.unroll or cell.activation is not activations.tanh
                or cell.recurrent_activation is not activations.sigmoid):
            raise NotImplementedError
        from tflm.backends.jax_lstm import cudnn_lstm_with_lengths
        return cudnn_lstm_with_lengths(
            sequences, initial_state[0], initial_state[1], ops.convert_to_tensor(cell.kernel),
            ops.convert_to_tensor(recurrent_kernel),
            None if cell.bias is None else ops.convert_to_tensor(cell.bias), mask,
            return_sequences=self.return_sequences)

    def _portable_loop(self, sequences, initial_state, mask, recurrent_kernel):
        """The LSTM recursion with a given recurrent matrix (gate order i, f, c, o)."""
        cell = self.cell
        kernel = ops.cast(cell.kernel, sequences.dtype)
        recurrent_kernel = ops.cast(recurrent_kernel, sequences.dtype)
        projected = ops.matmul(sequences, kernel)
        if cell.bias is not None:
            projected = projected + ops.cast(cell.bias, sequences.dtype)

        def step(z_x, states):
            h_prev, c_prev = states
            z = z_x + ops.matmul(h_prev, recurrent_kernel)
            z_i, z_f, z_c, z_o = ops.split(z, 4, axis=-1)
            i = cell.recurrent_activation(z_i)
            f = cell.recurrent_activation(z_f)
            c = f * c_prev + i * cell.activation(z_c)
            h = cell.recurrent_activation(z_o) * cell.activation(c)
            return h, [h, c]

        return keras_backend.rnn(
            step, projected, list(initial_state), go_backwards=self.go_backwards, mask=mask,
            unroll=self.unroll, input_length=sequences.shape[1],
            zero_output_for_mask=self.zero_output_for_mask,
            return_all_outputs=self.return_sequences)

    def get_config(self):
        config = super().get_config()
        config.update(weight_dropout=self.weight_dropout, seed=self.weight_drop_seed)
        return config
