"""LSTM with DropConnect on the recurrent kernel (AWD-LSTM's weight drop), cuDNN path kept."""

import keras
from keras import ops

from tflm import backends
from tflm.backends.lstm_kernels import CellWeights, kernel_for_use_cudnn, lstm_window
from tflm.layers.init import check_init, torch_uniform


@keras.saving.register_keras_serializable(package="tflm")
class WeightDropLSTM(keras.layers.LSTM):
    """`keras.layers.LSTM` whose hidden-to-hidden matrix gets DropConnect.

        U~ = U * M / (1 - p),   M ~ Bernoulli(1 - p) element-wise, shape (units, 4 units)

    One mask is drawn per forward call (per BPTT window) and shared by every time step and
    every sequence of the batch; inference uses U unchanged. The dropped matrix is an ordinary
    tensor handed to the kernel `tflm.backends.lstm_kernels.lstm_window` picks: the
    backend's fused kernel where it has one (cuDNN on TensorFlow, JAX and PyTorch GPUs, JAX
    also for padded windows with per-sequence lengths; PyTorch's oneDNN kernel on a CPU),
    else a portable loop with the same dropped matrix that computes the input projection
    x W + b for all steps at once and only h U~ inside the loop (TensorFlow CPU, JAX CPU).
    `use_cudnn` chooses: "auto" (default), True (the fused kernel or a ValueError), False
    (the portable loop); `last_kernel` says which ran ("fused" or "portable"). Gradients
    flow to U through the mask (dU = M / (1 - p) * dU~).

    The mask is shared by the whole batch, as the reference `WeightDrop` masks the matrix
    once per forward; under a `tf.distribute` strategy every replica draws the same mask from
    its copy of the seed state, so the whole global batch shares it (unlike the per-stream
    masks of `tflm.layers.LockedDropout`).

    Parametrization and initialisation: by default those of `keras.layers.LSTM` (one bias b,
    glorot / orthogonal kernels, unit forget bias). The reference code's `torch.nn.LSTM` has
    two trained biases, z = x W + b_ih + h U + b_hh: both receive the same gradient, so
    their sum moves twice as far per SGD step, and both count in the clipping norm and the
    L2 term. `recurrent_bias=True` adds b_hh (the kernels run with b_ih + b_hh);
    `init="pytorch"` draws every weight and bias from U(-1/sqrt(units), 1/sqrt(units)) with
    no forget-gate offset, as `torch.nn.LSTM.reset_parameters` does (`tflm.layers.init`).

    Args:
        units: hidden size.
        weight_dropout: p in [0, 1), DropConnect rate on the recurrent kernel. Default 0.5.
        seed: int seed of the mask's `SeedGenerator`.
        recurrent_bias: also train PyTorch's second bias b_hh. Default False.
        init: "keras" (default) or "pytorch"; initializers passed explicitly win.
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

    def __init__(self, units, weight_dropout=0.5, seed=None, recurrent_bias=False, init="keras",
                 **lstm_kwargs):
        self.init = check_init("WeightDropLSTM", init)
        if init == "pytorch":
            for key in ("kernel_initializer", "recurrent_initializer", "bias_initializer"):
                lstm_kwargs.setdefault(key, torch_uniform(units))
            lstm_kwargs.setdefault("unit_forget_bias", False)
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
        self.last_kernel = None
        self.recurrent_bias = None
        self.use_recurrent_bias = bool(recurrent_bias)
        if self.use_recurrent_bias and not self.use_bias:
            raise ValueError("WeightDropLSTM: recurrent_bias=True needs use_bias=True.")

    def build(self, sequences_shape, initial_state_shape=None):
        super().build(sequences_shape, initial_state_shape)
        if self.use_recurrent_bias and self.recurrent_bias is None:
            self.recurrent_bias = self.add_weight(
                shape=(4 * self.units,), name="recurrent_bias",
                # Keras-style: b_hh starts at 0, so b_ih + b_hh is Keras' initial bias.
                initializer=(self.cell.bias_initializer if self.init == "pytorch"
                             else "zeros"))

    def _cell_weights(self):
        """The cell's weights as the kernels read them, with b_ih + b_hh as the bias."""
        cell = self.cell
        bias = cell.bias
        if self.recurrent_bias is not None:
            bias = ops.add(ops.convert_to_tensor(bias), ops.convert_to_tensor(self.recurrent_bias))
        return CellWeights(cell.kernel, bias, cell.activation, cell.recurrent_activation)

    def recurrent_kernel_mask(self):
        """A fresh DropConnect mask for U: 0 or 1/(1-p), shape (units, 4 units)."""
        keep = 1.0 - self.weight_dropout
        shape = tuple(self.cell.recurrent_kernel.shape)
        kept = backends.current().uniform(shape, self.weight_drop_seed_generator) < keep
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
        window = lstm_window(
            self._cell_weights(), sequences, list(initial_state), mask, self._recurrent_kernel(training),
            kernel=kernel_for_use_cudnn(self.use_cudnn),
            return_sequences=self.return_sequences, go_backwards=self.go_backwards,
            unroll=self.unroll, zero_output_for_mask=self.zero_output_for_mask,
            training=bool(training))
        self.last_kernel = window.kernel
        if not window.xla_compatible:
            self.supports_jit = False  # cuDNN ops are not XLA-compatible (as keras.layers.LSTM)
        return window.last_output, window.outputs, window.states

    def get_config(self):
        config = super().get_config()
        config.update(weight_dropout=self.weight_dropout, seed=self.weight_drop_seed,
                      recurrent_bias=self.use_recurrent_bias, init=self.init)
        return config
