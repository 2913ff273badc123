"""PyTorch: eager train step (autograd), state held in Python, fused LSTM on any device."""

import keras
import torch

from tflm import compat
from tflm.backends import (torch_compiled_step, torch_host_copies, torch_layer_calls,
                           torch_linear, torch_lstm, torch_mixture_target_log_probs)
from tflm.backends.base import Backend, window_nll
from tflm.backends.gradients import loss_scale, process_gradients
from tflm.data.pad_id import PAD_ID


class TorchBackend(Backend):
    name = "torch"

    def __init__(self):
        super().__init__()
        self._host = torch_host_copies.HostCopies()
        self._constants = {}  # (type, value, dtype, device) -> 0-d tensor

    def train_step(self, model, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        model.zero_grad()
        forward = (torch_compiled_step.compiled_forward_and_loss if model.jit_compile
                   else torch_compiled_step.forward_and_loss)
        loss, nll_sum, tokens = forward(model, x, y, sample_weight)
        scaled = loss if loss_scale(model.optimizer) is None else model.optimizer.scale_loss(loss)
        scaled.backward()
        variables = model.trainable_variables
        grads = [v.value.grad for v in variables]
        with torch.no_grad():
            grads, norm = process_gradients(self, model, grads, variables, x, loss.detach())
            model.optimizer.apply(grads, variables)
        return model.update_lm_metrics(loss, nll_sum, tokens, grad_norm=norm)

    def make_train_function(self, model, make, force=False):
        """Keras' step function, run eagerly: with `jit_compile=True` its forward pass is
        compiled inside `train_step` (`tflm.backends.torch_compiled_step`), where Keras
        would compile the whole step around it."""
        return _without_keras_compile(model, make, force)

    def make_test_function(self, model, make, force=False):
        """Keras' evaluation step, run eagerly (with `jit_compile=True` too)."""
        return _without_keras_compile(model, make, force)

    def is_concrete(self, tensor):
        """False while `torch.compile` traces (`jit_compile=True`): values are unknown."""
        return not torch.compiler.is_compiling()

    def unpadded_check(self, model):
        """While `torch.compile` traces: a device-side assertion (`compat.torch_assert_async`,
        no wait for the device) that the tokens hold no `PAD_ID`. Eagerly none: the tokens
        are concrete and `tflm.padding.padding_mask` looks at them."""
        if not torch.compiler.is_compiling():
            return None

        def check(tokens):
            compat.torch_assert_async(
                torch.all(tokens != PAD_ID),
                f"{type(model).__name__}.padded_windows is False but a training window "
                f"holds padding (token id {PAD_ID}); set model.padded_windows = True for "
                "padded windows.")

        return check

    def picks_targets_in_training(self):
        """True: the mixture of softmaxes (MoS) trains on its targets' log-probabilities
        (`mixture_target_log_probs`: no `(batch, time, K, V)` log-mixture for autograd to
        keep). The `awd_lstm_mos_ptb` preset's step on a 2-core CPU at its own size:
        2,620 / 2,512 ms against 3,364 / 3,031 ms with the batched mixture, two interleaved
        pairs (`bench/heads/results/mos_targets_torch.md`). A softmax's pick is the same
        work as its full log-probabilities (a log_softmax and a gather either way)."""
        return True

    def mixture_target_log_probs(self, h, log_prior, weight, bias, targets, mask=None):
        """The whole window at once (`Backend.mixture_target_log_probs`) up to
        `torch_mixture_target_log_probs.WHOLE_WINDOW_ELEMENTS`; past it chunk by chunk
        under PyTorch's checkpointing (`tflm.backends.torch_mixture_target_log_probs`: one
        chunk's `(rows, K, V)` logits at a time, a GEMM more)."""
        tensor = keras.ops.convert_to_tensor
        h, weight = tensor(h), tensor(weight)
        if not torch_mixture_target_log_probs.runs_in_chunks(h, weight):
            return super().mixture_target_log_probs(h, log_prior, weight, bias, targets, mask)
        return torch_mixture_target_log_probs.mixture_target_log_probs(
            h, tensor(log_prior), weight, None if bias is None else tensor(bias),
            tensor(targets))

    def pick_targets(self, log_probs, targets):
        """`torch.gather` on the last axis. Keras' `take_along_axis` broadcasts the two
        shapes first, and traced by `torch.compile` that fixed the window's length in the
        graph: every new length compiled a graph of its own (`torch_compiled_step`)."""
        log_probs = keras.ops.convert_to_tensor(log_probs)
        index = keras.ops.convert_to_tensor(targets).to(torch.int64)
        return torch.gather(log_probs, -1, index.unsqueeze(-1)).squeeze(-1)

    def window_log_probs(self, model, tokens, states):
        """`forward_with_state` in evaluation mode without autograd's bookkeeping."""
        with torch.no_grad():
            return model.forward_with_state(tokens, states, training=False)

    def window_gradients(self, model, tokens, targets, states):
        variables = model.trainable_variables
        log_probs, new_states = model.forward_with_state(tokens, states, training=False)
        loss = window_nll(log_probs, targets)
        grads = torch.autograd.grad(loss, [v.value for v in variables], allow_unused=True)
        grads = [torch.zeros_like(v.value) if g is None else g
                 for g, v in zip(grads, variables)]
        return (loss.detach(), grads,
                [(h.detach(), c.detach()) for h, c in new_states])

    def uniform(self, shape, seed):
        """From a `SeedGenerator`: `keras.random.uniform`'s numbers, bit for bit, with the
        generator's seed kept on the host (`tflm.backends.torch_host_copies`: no device read and
        no host-to-device copy per mask); the draw on the state's device. While
        `torch.compile` traces (`jit_compile=True`), from PyTorch's generator in the graph
        (`tflm.backends.torch_compiled_step`: not Keras' numbers). Other seeds, a 0-d shape
        and the meta device: `keras.random.uniform`."""
        generator = self._host_seeded(shape, seed)
        if generator is None and not _traced_draw(shape, seed):
            return super().uniform(shape, seed)
        return torch.rand(tuple(int(n) for n in shape), generator=generator,
                          device=seed.state.value.device,
                          dtype=getattr(torch, keras.config.floatx()))

    def normal(self, shape, seed, dtype="float32"):
        """`keras.random.normal`'s numbers, bit for bit, seeded from the host as `uniform`
        (traced: from PyTorch's generator, as `uniform`)."""
        generator = self._host_seeded(shape, seed)
        if generator is None and not _traced_draw(shape, seed):
            return super().normal(shape, seed, dtype)
        return torch.normal(0.0, 1.0, size=tuple(int(n) for n in shape), generator=generator,
                            device=seed.state.value.device,
                            dtype=getattr(torch, keras.backend.standardize_dtype(dtype)))

    def _host_seeded(self, shape, seed):
        """A `torch.Generator` on the seed state's device, seeded as Keras seeds it from
        `seed`'s next state but from the host copy; None where Keras' own draw applies."""
        if (not isinstance(seed, keras.random.SeedGenerator) or not len(shape)
                or torch.compiler.is_compiling() or seed.state.value.is_meta):
            return None
        generator = torch.Generator(device=seed.state.value.device)
        generator.manual_seed(self._host.next_seed(seed, self.assign_add))
        return generator

    def rnn_loop(self, step_function, inputs, initial_states, *, mask, go_backwards, unroll,
                 zero_output_for_mask, return_all_outputs):
        """Keras' loop written out (`unroll`) whatever `unroll` says: in eager PyTorch both
        of Keras' loops are Python loops, but the other one counts time in a tensor, read
        back at every step (on a GPU, a wait for the queued kernels each time: 3 reads a
        step of the Mogrifier's loop, `python -m bench.training.host_syncs --preset
        mogrifier_ptb`), and runs the first step once more to size its outputs. The same
        numbers (tests/tflm/backends/test_torch_rnn_loop.py). Keras 3.15's written-out loop
        fails on a mask with `go_backwards` (that call keeps Keras' choice), and with a
        mask and `zero_output_for_mask` it returns every step's output whatever
        `return_all_outputs` says: it is asked for all, and the last is kept here."""
        if mask is not None and go_backwards:
            return super().rnn_loop(step_function, inputs, initial_states, mask=mask,
                                    go_backwards=go_backwards, unroll=unroll,
                                    zero_output_for_mask=zero_output_for_mask,
                                    return_all_outputs=return_all_outputs)
        last, outputs, states = super().rnn_loop(
            step_function, inputs, initial_states, mask=mask, go_backwards=go_backwards,
            unroll=True, zero_output_for_mask=zero_output_for_mask, return_all_outputs=True)
        return last, outputs if return_all_outputs else outputs[:, -1:], states

    def assign_add(self, variable, value):
        """In place, one `add_` where Keras' `assign_add` adds into a new tensor and copies
        it back (two kernels; a step makes a dozen such updates: the metrics' totals, the
        dropout seeds, the optimizer's counts). The same numbers: `value` is converted to
        the variable's dtype and added, as Keras does. Inside a mixed-precision layer's
        call (an autocast scope) it adds to the variable itself, as Keras does on JAX and
        TensorFlow; Keras 3.15's PyTorch `assign` writes into the float16 copy `value`
        hands out there, and the update is lost. Keras' own path inside a
        `keras.StatelessScope`, for a trainable variable while autograd records, and for a
        value that is not a tensor of the variable's shape on its device."""
        storage = compat.keras_variable_storage(variable)
        if (storage is None or not isinstance(value, torch.Tensor)
                or value.shape != storage.shape or value.device != storage.device
                or (storage.requires_grad and torch.is_grad_enabled())):
            return super().assign_add(variable, value)
        with torch.no_grad():
            storage.add_(value.to(storage.dtype))

    def host_scalar(self, variable):
        """From a host copy while the variable's tensor is unchanged since it was read or
        reported (`tflm.backends.torch_host_copies.HostCopies`); else read once."""
        return self._host.value(variable, lambda tensor: int(tensor.item()))

    def host_scalar_written(self, variable, value):
        self._host.written(variable, int(value))

    def constant(self, value, like):
        """Made once per value, dtype and device, then reused: Keras' PyTorch ops turn a
        Python number into a tensor on the device at every call (`torch.as_tensor`, a copy
        from the host that waits for the GPU's queue), a dozen times in an AWD-LSTM step.
        The same tensor `Backend.constant` makes, bit for bit."""
        if not isinstance(value, (bool, int, float)) or torch.compiler.is_compiling():
            return super().constant(value, like)
        like = keras.ops.convert_to_tensor(like)  # a Keras variable's tensor
        key = (type(value), value, like.dtype, like.device)
        made = self._constants.get(key)
        if made is None:
            made = super().constant(value, like).to(like.device)
            self._constants[key] = made
        return made

    # One multi-tensor kernel launch per list instead of one or two per gradient: on a GPU
    # the eager step is bound by the host's launches (bench/training/results/gpu_training.md).
    def global_norm(self, gradients):
        """torch.nn.utils.clip_grad_norm_'s total norm: the 2-norm of the per-tensor
        2-norms (`compat.torch_foreach_norm`), where every gradient is dense float32."""
        if not _dense_float32(gradients):
            return super().global_norm(gradients)
        return torch.linalg.vector_norm(torch.stack(compat.torch_foreach_norm(gradients)))

    def scale_and_decay(self, gradients, factor, decay=None, variables=None):
        values = [] if decay is None else [keras.ops.convert_to_tensor(v) for v in variables]
        if any(g is None for g in gradients) or not _dense_float32([*gradients, *values]):
            return super().scale_and_decay(gradients, factor, decay, variables)
        out = compat.torch_foreach_mul(gradients, _float32(factor))
        if decay is not None:
            compat.torch_foreach_add_(out, compat.torch_foreach_mul(values, _float32(decay)))
        return list(out)

    def updates_together(self, variables, gradients):
        return _dense_float32(gradients) and _dense_float32(
            [keras.ops.convert_to_tensor(v) for v in variables])

    def subtract_scaled(self, variables, gradients, rate):
        values = [keras.ops.convert_to_tensor(v) for v in variables]
        with torch.no_grad():
            compat.torch_foreach_sub_(values, compat.torch_foreach_mul(gradients,
                                                                       _float32(rate)))

    def call_layer(self, layer, *args, **kwargs):
        return torch_layer_calls.call(layer, *args, **kwargs)

    def linear(self, x, weight, bias=None):
        """oneDNN's GEMMs on an x86 CPU (`tflm.backends.torch_linear`: half MKL's time for
        the tied output layer on an AMD EPYC), else `torch.nn.functional.linear`, which
        adds the bias inside the GEMM (addmm; as a separate broadcast add over the (B, T,
        V) logits it took 13 ms of a ~300 ms training step, torch profiler, one CPU)."""
        return torch_linear.linear(
            keras.ops.convert_to_tensor(x), keras.ops.convert_to_tensor(weight),
            None if bias is None else keras.ops.convert_to_tensor(bias))

    def fused_lstm(self, cell, inputs, initial_state, mask, recurrent_kernel, *,
                   return_sequences, go_backwards, unroll):
        """PyTorch's own fused kernel (cuDNN on a GPU, oneDNN on a CPU, where Keras would
        run a Python loop per step) for the standard LSTM without a mask, forwards
        (`tflm.backends.torch_lstm`); else Keras' cuDNN path (a GPU only)."""
        standard = (cell.activation is keras.activations.tanh
                    and cell.recurrent_activation is keras.activations.sigmoid)
        if standard and mask is None and not go_backwards and not unroll:
            last, outputs, states = torch_lstm.fused_lstm(
                inputs, initial_state[0], initial_state[1],
                keras.ops.convert_to_tensor(cell.kernel),
                keras.ops.convert_to_tensor(recurrent_kernel),
                None if cell.bias is None else keras.ops.convert_to_tensor(cell.bias),
                return_sequences=return_sequences)
            return last, outputs, states, True
        last, outputs, states = self.keras_fused_lstm(
            cell, inputs, initial_state, mask, recurrent_kernel,
            return_sequences=return_sequences, go_backwards=go_backwards, unroll=unroll)
        return last, outputs, states, True


def _without_keras_compile(model, make, force):
    """Keras' `make(force)` with its `torch.compile` of the whole step left out."""
    if not model.jit_compile:
        return make(force)
    model.jit_compile = False  # read by `make` alone, when it builds the function
    try:
        return make(force)
    finally:
        model.jit_compile = True


def _traced_draw(shape, seed):
    """Whether a draw from a `SeedGenerator` happens while `torch.compile` traces: then it
    is drawn in the graph from PyTorch's generator (Keras' seeded draw is
    `torch.compiler.disable`d, a graph break at every mask)."""
    return (torch.compiler.is_compiling() and isinstance(seed, keras.random.SeedGenerator)
            and len(shape) > 0)


def _dense_float32(tensors):
    """Whether every item is a dense (strided) float32 PyTorch tensor, all on one device."""
    return (all(isinstance(t, torch.Tensor) and t.dtype == torch.float32
                and t.layout == torch.strided for t in tensors)
            and len({t.device for t in tensors}) <= 1)


def _float32(factor):
    """A Python number as it is (a scalar the kernels take), else a float32 0-d tensor."""
    return factor if isinstance(factor, (int, float)) else keras.ops.cast(factor, "float32")
