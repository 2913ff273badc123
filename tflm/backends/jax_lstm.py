"""JAX's cuDNN LSTM for right-padded windows (a GPU only).

Keras' JAX backend runs `jax.experimental.rnn.lstm` (cuDNN) only without a mask; a padded
window (`tflm.padding`) has a mask, and inside `jit` every window gets one, so Keras would
fall back to a `lax.scan` loop on a GPU. cuDNN takes per-sequence lengths instead:

    lengths[b] = sum_t mask[b, t]          (right padding: the real positions come first)
    W_ih = kernel^T, W_hh = U~^T, b_ih = b, b_hh = 0, flattened in that order (gates i, f, c, o)

and returns the state after `lengths[b]` steps (zeros as outputs at padded positions).
"""

import jax
import jax.numpy as jnp


def _on_gpu():
    return jax.default_backend() == "gpu"


def _cudnn_lstm():
    from jax.experimental.rnn import lstm  # deferred: experimental API, run on a GPU only
    return lstm


def cudnn_lstm_with_lengths(inputs, initial_h, initial_c, kernel, recurrent_kernel, bias,
                            mask, return_sequences=True):
    """(last output, outputs, [h, c]), as Keras' fused LSTM (`tflm.compat.fused_lstm`)
    returns them.

    Raises `NotImplementedError` off a GPU or when cuDNN refuses the call (the caller then
    runs the masked loop)."""
    if not _on_gpu():
        raise NotImplementedError("cuDNN LSTM needs a GPU")

    given = inputs.dtype
    # cuDNN's RNN in jaxlib lowers float32 and float16 only: bfloat16 (mixed_bfloat16) runs
    # in float32 and returns in bfloat16
    dtype = jnp.float32 if given == jnp.bfloat16 else given
    inputs = jnp.asarray(inputs, dtype)
    input_size, four_n = kernel.shape
    hidden_size = four_n // 4
    bias = jnp.zeros((four_n,), dtype) if bias is None else jnp.asarray(bias, dtype)
    weights = jnp.concatenate([
        jnp.asarray(kernel, dtype).T.ravel(), jnp.asarray(recurrent_kernel, dtype).T.ravel(),
        bias, jnp.zeros((four_n,), dtype)])
    lengths = jnp.sum(jnp.asarray(mask, jnp.int32), axis=1)
    try:
        outputs, h, c = _cudnn_lstm()(
            inputs, jnp.asarray(initial_h, dtype)[None], jnp.asarray(initial_c, dtype)[None],
            weights, lengths, input_size=int(input_size), hidden_size=int(hidden_size),
            num_layers=1, dropout=0.0, bidirectional=False)
    except (RuntimeError, TypeError, ValueError) as err:
        raise NotImplementedError(f"cuDNN LSTM failed: {err}") from err
    h, c, outputs = (jnp.asarray(x, given) for x in (h[0], c[0], outputs))
    return h, (outputs if return_sequences else h[:, None]), [h, c]
