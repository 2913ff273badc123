"""Every use of a private Keras API in tflm, in one place (docs/design.md, contract 8).

Keras 3 keeps a few things tflm needs in `keras.src` or behind underscore names. Each is
used here and nowhere else, with a comment saying why no public API serves;
`tests/tflm/test_compat.py` checks every one against the installed Keras (that it exists, takes
the arguments used here and behaves as relied on), so a Keras release that changes one
fails that test by name instead of breaking training silently. Everything else in tflm,
zoo, tools and bench uses public APIs only (PyTorch's included: `torch.lstm` is in
`torch.__all__`); the private PyTorch attributes and the one private JAX function used are
here too.
"""

import contextlib
import sys

from keras.src import backend as keras_backend
from keras.src.backend.common.stateless_scope import in_stateless_scope as _in_stateless_scope
from keras.src.backend.common.symbolic_scope import in_symbolic_scope as _in_symbolic_scope


def fused_lstm(inputs, initial_h, initial_c, mask, kernel, recurrent_kernel, bias, *,
               activation, recurrent_activation, return_sequences, go_backwards, unroll):
    """The backend's fused LSTM (cuDNN on TensorFlow / JAX / PyTorch GPUs).

    Returns `(last_output, outputs, [h, c])`; raises `NotImplementedError` where no fused
    kernel applies (a CPU, an unsupported activation, a mask JAX's cuDNN cannot take).
    """
    # keras.src.backend.lstm: the only entry point to Keras' cuDNN LSTM. keras.layers.LSTM
    # calls it with its own recurrent-kernel variable; DropConnect (WeightDropLSTM) must
    # call it with the dropped matrix, and no public API takes a recurrent matrix.
    return keras_backend.lstm(inputs, initial_h, initial_c, mask, kernel=kernel,
                              recurrent_kernel=recurrent_kernel, bias=bias,
                              activation=activation, recurrent_activation=recurrent_activation,
                              return_sequences=return_sequences, go_backwards=go_backwards,
                              unroll=unroll)


def rnn_loop(step_function, inputs, initial_states, *, mask, go_backwards, unroll,
             zero_output_for_mask, return_all_outputs):
    """Keras' RNN time loop: `(last_output, outputs, new_states)`.

    `step_function(x_t, states) -> (output_t, new_states)`; masked steps keep the previous
    states (and give zero outputs when `zero_output_for_mask`).
    """
    # keras.src.backend.rnn: the loop keras.layers.LSTM itself runs when no fused kernel
    # applies, with Keras' masking, go_backwards and unroll semantics on every backend
    # (tf.while_loop, lax.scan, a Python loop). The public keras.ops.scan has no mask, on
    # TensorFlow its per-step outputs must mirror the carry (c would be stacked too), and
    # it is no faster: `python -m bench.training.lstm_loop` (bench/training/results/lstm_loop.md) measured scan /
    # rnn at 0.87-1.13x on TensorFlow, 0.98-1.02x on JAX and 1.22-1.33x on PyTorch.
    return keras_backend.rnn(step_function, inputs, list(initial_states),
                             go_backwards=go_backwards, mask=mask, unroll=unroll,
                             input_length=inputs.shape[1],
                             zero_output_for_mask=zero_output_for_mask,
                             return_all_outputs=return_all_outputs)


def optimizer_variable_index(optimizer, variable):
    """The position of `variable` among the variables `optimizer` was built on."""
    # Optimizer._get_variable_index: how Keras' own optimizers (SGD momentum, Adam) find a
    # variable's slot inside `update_step`; there is no public lookup, and under
    # tf.distribute `update_step` sees per-replica components whose identity only this
    # method maps back (through Keras' backend-specific `_var_key`).
    return optimizer._get_variable_index(variable)


def nested_layers(layer):
    """`layer` and every layer inside it, recursively (each once)."""
    # Layer._flatten_layers: Keras 3 has no public recursive sublayer walk (`Model.layers`
    # lists direct children only and a plain Layer has no `layers`).
    return layer._flatten_layers(include_self=True, recursive=True)


def torch_tensor_version(tensor):
    """PyTorch's in-place modification counter of `tensor`: it changes whenever the
    tensor's data is written in place (an optimizer step, `Variable.assign`)."""
    # Tensor._version: the counter autograd itself checks; PyTorch has no public way to
    # tell whether a tensor was written since it was last read.
    return tensor._version


def onednn_linear(x, weight, bias):
    """`x weight^T + bias` by oneDNN, dense in and out: `x` (m, in) float32 contiguous,
    `weight` (out, in), `bias` (out,) or None, all on a CPU."""
    # torch._C._nn.mkldnn_linear: the only entry point to oneDNN's fp32 inner product for
    # dense tensors. PyTorch's public matmul and F.linear go to its BLAS (MKL in the x86
    # wheels) and reach oneDNN only for reduced precisions.
    import torch  # deferred: PyTorch is optional; its backend alone calls this
    return torch._C._nn.mkldnn_linear(x.to_mkldnn(), weight, bias).to_dense()


def onednn_linear_backward(x, grad, weight, bias_defined):
    """`(dx, dweight, dbias)` of `onednn_linear` for the output gradient `grad` (m, out);
    `dbias` is None unless `bias_defined`."""
    # aten::mkldnn_linear_backward_input / _weights: the backward of mkldnn_linear, in
    # torch.ops.aten (undocumented; tests/tflm/test_compat.py checks them against NumPy).
    import torch  # deferred: PyTorch is optional; its backend alone calls this
    g = grad.contiguous().to_mkldnn()
    dx = torch.ops.aten.mkldnn_linear_backward_input(list(x.shape), g, weight).to_dense()
    dweight, dbias = torch.ops.aten.mkldnn_linear_backward_weights(g, x.to_mkldnn(), weight,
                                                                   bias_defined)
    return dx, dweight, dbias if bias_defined else None


def in_symbolic_scope():
    """True while Keras traces a function for shapes only (`compute_output_spec`)."""
    # keras.src.backend.common.symbolic_scope.in_symbolic_scope: `keras.SymbolicScope` is
    # public but nothing public tells whether one is active.
    return _in_symbolic_scope()


def keras_variable_storage(variable):
    """The tensor a Keras variable holds, to be written in place: what its `value` reads
    (under an autocast scope, `value` is a cast copy of it); None inside a
    `keras.StatelessScope`, whose assignments are collected, not made."""
    # keras.src.backend.common.stateless_scope.in_stateless_scope: `keras.StatelessScope`
    # is public but nothing public tells whether one is active; Variable._value: the
    # storage behind `value`, with no public name.
    if _in_stateless_scope():
        return None
    return getattr(variable, "_value", None)


def keras_clear_losses(layer):
    """Drop the losses `layer` and the layers inside it added in their last call
    (`add_loss`), as Keras' outermost `Layer.__call__` does when a call starts."""
    # Layer._clear_losses: what that call runs; nothing public clears `layer.losses`.
    layer._clear_losses()


def keras_mask(tensor):
    """The Keras mask attached to `tensor` (`Embedding(mask_zero=True)` attaches one), or
    None."""
    # keras.src.backend.get_keras_mask: `Layer.__call__` fills a layer's `mask` argument
    # from it; nothing public reads it.
    return keras_backend.get_keras_mask(tensor)


def keras_call_is_plain(layer):
    """Whether Keras' `Layer.__call__` of `layer` would run `layer.call` as it is, as far
    as its call-independent state goes: no autocast scope to open or leave (a mixed
    precision policy, or a scope another layer's call opened), no rematerialization
    (`keras.RematScope` at construction), and, on PyTorch, no forward or backward hook on
    the module or registered globally (`torch.nn.Module.__call__` runs those)."""
    # keras.src.backend.get_autocast_scope and Layer._remat_mode: what `Layer.__call__` and
    # `Operation.__call__` read; nothing public tells whether either is set.
    if (layer.compute_dtype != layer.variable_dtype
            or keras_backend.get_autocast_scope() is not None):
        return False
    if getattr(layer, "_remat_mode", None) is not None:
        return False
    if keras_backend.backend() != "torch":
        return True
    # torch.nn.Module's hook dictionaries, module and global: what Module.__call__ itself
    # checks before its fast path; PyTorch has no public query for registered hooks.
    from torch.nn.modules import module as torch_module  # deferred: PyTorch is optional
    return not (layer._forward_hooks or layer._forward_pre_hooks or layer._backward_hooks
                or layer._backward_pre_hooks or torch_module._global_forward_hooks
                or torch_module._global_forward_pre_hooks
                or torch_module._global_backward_hooks
                or torch_module._global_backward_pre_hooks)


def jax_backend_started():
    """True once JAX has started its backends (XLA read `XLA_FLAGS` then, once)."""
    # jax._src.xla_bridge.backends_are_initialized: the public jax.devices() and
    # jax.extend.backend.backends() start the backends when asked; nothing public only asks.
    if "jax" not in sys.modules:
        return False
    from jax._src import xla_bridge  # deferred: asking must not import JAX
    return xla_bridge.backends_are_initialized()


class TokenWindowBuild:
    """Mixin for a `keras.Model` fed integer token windows: lets it build itself under a
    `tf.distribute` strategy instead of through Keras' sample-batch reduction.

    The model implements `build_under_strategy()`: build what must exist before the
    train / test step is traced and return True, or return False to let Keras build.
    """

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        # TensorFlowTrainer._maybe_symbolic_build (keras/src/backend/tensorflow/trainer.py)
        # runs in fit / evaluate / *_on_batch before tracing. Under a strategy it builds the
        # model from one sample batch reduced (MEAN) across replicas, which
        # MultiWorkerMirroredStrategy cannot do for integer token windows (a collective on
        # int32). No public hook replaces this step, so the language model overrides it and
        # builds from its own dummy window; JAX and PyTorch trainers never call it.
        if self.build_under_strategy():
            return None
        return super()._maybe_symbolic_build(iterator=iterator, data_batch=data_batch)


class WholeUpdateStep:
    """Mixin for a `keras.optimizers.Optimizer`: `update_variables(grads, variables,
    learning_rate)` may update every variable at once; returning False falls back to
    Keras' loop of `update_step` per variable.

    The optimizer implements `update_variables`."""

    def _backend_update_step(self, grads, trainable_variables, learning_rate):
        # BaseOptimizer._backend_update_step (keras/src/optimizers/base_optimizer.py) is the
        # one place that loops `update_step` over the variables; Keras' own PyTorch
        # optimizers override it the same way (torch_parallel_optimizer.py) to update all
        # variables with `torch._foreach_*`. TensorFlow's override (tf.distribute) stays
        # in charge wherever `update_variables` declines.
        if self.update_variables(grads, trainable_variables, learning_rate):
            return None
        return super()._backend_update_step(grads, trainable_variables, learning_rate)


def torch_assert_async(condition, message):
    """Fail when the boolean 0-d tensor `condition` is false, without the host waiting for
    the device (a device-side assertion on a GPU); traceable by `torch.compile`."""
    # torch._assert_async: no public PyTorch op asserts without a host read.
    import torch  # deferred: PyTorch is optional; its backend alone calls this
    torch._assert_async(condition, message)


@contextlib.contextmanager
def torch_autograd_inside_operator():
    """Within: autograd records again inside a custom operator's implementation
    (`torch.library.custom_op`), which PyTorch runs with autograd's dispatch keys
    excluded, so that the operator can differentiate what it runs."""
    # torch._C's thread-local dispatch key sets and _ForceDispatchKeyGuard: the dispatcher
    # excludes the autograd keys below an operator's autograd kernel
    # (_AutoDispatchBelowAutograd); nothing public lifts that exclusion.
    import torch  # deferred: PyTorch is optional; its backend alone calls this
    keys = torch._C.DispatchKey
    excluded = torch._C._dispatch_tls_local_exclude_set()
    for key in (keys.AutogradFunctionality, keys.AutogradOther, keys.AutogradNestedTensor):
        excluded = excluded - torch._C.DispatchKeySet(key)
    with torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), excluded):
        yield


def torch_foreach_norm(tensors):
    """The 2-norm of each tensor in `tensors` (a list of PyTorch tensors), as a list."""
    # torch._foreach_norm: the multi-tensor kernel torch.nn.utils.clip_grad_norm_ uses; a
    # launch per group of tensors on a GPU instead of two per tensor. No public equivalent.
    import torch  # deferred: PyTorch is optional; its backend alone calls this
    return torch._foreach_norm(tensors)


def torch_foreach_mul(tensors, factor):
    """`[t * factor for t in tensors]` by PyTorch's multi-tensor kernel (`factor` a 0-d
    tensor, kept on its device: no host sync)."""
    # torch._foreach_mul (Tensor overload): as torch_foreach_norm; what torch.optim and
    # clip_grad_norm_ use internally.
    import torch  # deferred: PyTorch is optional; its backend alone calls this
    return torch._foreach_mul(tensors, factor)


def torch_foreach_sub_(tensors, others):
    """`t -= o` for each pair, in place, by PyTorch's multi-tensor kernel."""
    # torch._foreach_sub_: as torch_foreach_norm (torch.optim.SGD's foreach path).
    import torch  # deferred: PyTorch is optional; its backend alone calls this
    torch._foreach_sub_(tensors, others)


def torch_foreach_add_(tensors, others):
    """`t += o` for each pair, in place, by PyTorch's multi-tensor kernel."""
    # torch._foreach_add_: as torch_foreach_norm.
    import torch  # deferred: PyTorch is optional; its backend alone calls this
    torch._foreach_add_(tensors, others)
