"""The language-model train and test steps for the JAX backend (stateless, jit-compiled).

Keras' JAX trainer calls `train_step(state, data)` under `jax.jit` with
`state = (trainable, non_trainable, optimizer, metrics)` variable values and expects
`(logs, new_state)` back; nothing may be mutated. The step does what the TensorFlow and
PyTorch steps of `tflm.backends.train_step` do (see that module for the formulas):

    loss = token-mean NLL + sum(losses added during the forward pass)     (AR, TAR, ...)
    g    = grad(loss);  g = g * min(1, clip_norm / ||g||) + weight_decay * theta;  g *= T/bptt
    optimizer.stateless_apply(g)

The LSTM state carried between windows lives in non-trainable variables of a fixed batch
shape (`tflm.backends.stream_state.JaxStreamState`), so it enters the jitted step as part of
`non_trainable` and leaves it updated, like a BatchNormalization statistic. A different
window length T retraces the step once per distinct T (jit specializes on shapes): pad the
windows to a multiple of 4 (`lm_dataset(..., pad_to_multiple=4)`) to compile a few programs.

Distributed JAX training (`keras.distribution`) is not covered: the gradient is the local
one and clipping would be per shard.
"""

import jax
from keras.src import backend as keras_backend
from keras.src.trainers.data_adapters import data_adapter_utils

from tflm.backends.train_step import _processed


def _optimizer_scope(model, optimizer_variables):
    return keras_backend.StatelessScope(
        state_mapping=list(zip(model.optimizer.variables, optimizer_variables)))


def _metric_updates(model, metrics_variables, loss, nll_sum, tokens, grad_norm=None):
    """Update the metric trackers statelessly; returns (logs, new metric values)."""
    mapping = list(zip(model.metrics_variables, metrics_variables))
    with keras_backend.StatelessScope(state_mapping=mapping) as scope:
        logs = model.update_lm_metrics(loss, nll_sum, tokens, grad_norm=grad_norm)
    new_values = []
    for ref, value in mapping:
        current = scope.get_current_value(ref)
        new_values.append(value if current is None else current)
    return logs, new_values


def jax_train_step(model, state, data):
    """One training step: `(logs, new_state)` from `state` and a batch `data`."""
    trainable, non_trainable, optimizer_variables, metrics_variables = state
    x, y, sample_weight = data_adapter_utils.unpack_x_y_sample_weight(data)
    loss_scaled = getattr(model.optimizer, "dynamic_scale", None) is not None

    def loss_fn(trainable_values, non_trainable_values):
        log_probs, new_non_trainable, losses = model.stateless_call(
            trainable_values, non_trainable_values, x, training=True, return_losses=True)
        loss, nll_sum, tokens = model.compute_lm_loss(y, log_probs, sample_weight,
                                                      extra_losses=losses, inputs=x)
        scaled = loss
        if loss_scaled:
            with _optimizer_scope(model, optimizer_variables):
                scaled = model.optimizer.scale_loss(loss)
        return scaled, (loss, nll_sum, tokens, new_non_trainable)

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
    (_, (loss, nll_sum, tokens, non_trainable)), grads = grad_fn(trainable, non_trainable)
    with _optimizer_scope(model, optimizer_variables):
        grads, norm = _processed(model, list(grads), list(trainable), x, loss)
    trainable, optimizer_variables = model.optimizer.stateless_apply(
        optimizer_variables, grads, trainable)
    logs, metrics_variables = _metric_updates(model, metrics_variables, loss, nll_sum, tokens,
                                              grad_norm=norm)
    return logs, (trainable, non_trainable, optimizer_variables, metrics_variables)


def jax_test_step(model, state, data):
    """One evaluation step (no dropout, no extra losses): `(logs, new_state)`."""
    trainable, non_trainable, metrics_variables = state
    x, y, sample_weight = data_adapter_utils.unpack_x_y_sample_weight(data)
    log_probs, non_trainable = model.stateless_call(trainable, non_trainable, x,
                                                    training=False)
    loss, nll_sum, tokens = model.compute_lm_loss(y, log_probs, sample_weight, extra_losses=[],
                                                  inputs=x)
    logs, metrics_variables = _metric_updates(model, metrics_variables, loss, nll_sum, tokens)
    return logs, (trainable, non_trainable, metrics_variables)
