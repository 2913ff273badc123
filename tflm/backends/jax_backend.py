"""JAX: stateless jit-compiled train and test steps, state in variables, cuDNN LSTM.

Keras' JAX trainer calls `train_step(state, data)` under `jax.jit` with
`state = (trainable, non_trainable, optimizer, metrics)` variable values and expects
`(logs, new_state)` back; nothing may be mutated. The step does what the TensorFlow and
PyTorch steps do (the gradient logic is `tflm.backends.gradients`).

The LSTM state carried between windows lives in non-trainable variables of a fixed batch
shape (`tflm.backends.jax_streams`), so it enters the jitted step as part of
`non_trainable` and leaves it updated, like a BatchNormalization statistic. A different
window length T retraces the step once per distinct T (jit specializes on shapes): pad the
windows to a multiple of 4 (`lm_dataset(..., pad_to_multiple=4)`) to compile a few programs.
With `model.pad_to_compiled_lengths`, `compile(steps_per_execution=k)` trains k windows in
one compiled scan and one dispatch (`tflm.backends.scanned_steps`), where Keras' own loop
would dispatch each step.

Distributed JAX training (`keras.distribution`) is not covered: the gradient is the local
one and clipping would be per shard.
"""

import weakref

import jax
import keras

from tflm.backends import (compiled_lengths, jax_lstm, jax_mixture_target_log_probs,
                           jax_target_log_probs, jax_threefry, scanned_steps)
from tflm.backends.base import Backend, states_or_zeros, window_nll
from tflm.backends.gradients import loss_scale, process_gradients
from tflm.backends.jax_streams import JaxStreamState
from tflm.data.pad_id import PAD_ID


def _optimizer_scope(model, optimizer_variables):
    return keras.StatelessScope(
        state_mapping=list(zip(model.optimizer.variables, optimizer_variables)))


def _metric_updates(model, metrics_variables, loss, nll_sum, tokens, grad_norm=None,
                    non_trainable=None):
    """Update the metric trackers statelessly; returns (logs, new metric values). The
    step's non-trainable values (`non_trainable`) are what reported variables read."""
    mapping = list(zip(model.metrics_variables, metrics_variables))
    reads = [] if non_trainable is None else list(zip(model.non_trainable_variables,
                                                      non_trainable))
    with keras.StatelessScope(state_mapping=mapping + reads) as scope:
        logs = model.update_lm_metrics(loss, nll_sum, tokens, grad_norm=grad_norm)
    new_values = []
    for ref, value in mapping:
        current = scope.get_current_value(ref)
        new_values.append(value if current is None else current)
    return logs, new_values


class JaxBackend(Backend):
    name = "jax"
    requires_batch_size = True  # the state variables must exist before jit fetches them

    def __init__(self):
        self._window_steps = weakref.WeakKeyDictionary()  # model -> jitted window step
        self._window_forwards = weakref.WeakKeyDictionary()  # model -> jitted forward

    def make_train_function(self, model, make, force=False):
        """Keras' jitted training function; with `model.pad_to_compiled_lengths` its
        windows padded to lengths compiled already where that costs less than a compile
        (`tflm.backends.compiled_lengths`), and with `steps_per_execution` k > 1 too, k
        steps in one program and one dispatch (`tflm.backends.scanned_steps`)."""
        before = model.train_function
        result = make(force)
        self._pad_steps(model, "train_function", before, model.train_step)
        return result

    def make_test_function(self, model, make, force=False):
        """Keras' jitted evaluation function, padded as `make_train_function`'s (with
        `steps_per_execution` k > 1, Keras' loop of k single steps)."""
        before = model.test_function
        result = make(force)
        self._pad_steps(model, "test_function", before, model.test_step)
        return result

    @staticmethod
    def _pad_steps(model, attribute, before, step):
        function = getattr(model, attribute)
        if (function is None or function is before
                or not getattr(model, "pad_to_compiled_lengths", False)
                or model.run_eagerly or not model.jit_compile):
            return
        shortest = getattr(model, "shortest_compiled_length", None) if attribute == \
            "train_function" else None
        lengths = compiled_lengths.CompiledLengths(shortest)
        if model.steps_per_execution == 1:
            function = compiled_lengths.padding_steps(function, lengths,
                                                      jax.block_until_ready, PAD_ID)
        elif attribute == "train_function" and keras.distribution.distribution() is None:
            function = scanned_steps.scanned_steps(step, model.steps_per_execution, lengths,
                                                   jax.block_until_ready, PAD_ID)
        else:
            # Keras' loop of single steps, unpadded: evaluation passes have few windows of
            # at most two lengths (a scan's empty slots would cost more than their
            # dispatches), and under a distribution its shardings are Keras' business
            return
        setattr(model, attribute, function)

    def make_stream_state(self, sizes):
        return JaxStreamState(sizes)

    def carried_variables(self, model):
        return [v for store in model.stream_states() for v in store.variables()]

    def prepare_pass(self, model, training, batch_size, nested=False):
        """Create the state variables for `batch_size` streams, outside `jit`. While another
        pass of the model runs (validation inside fit) its compiled loop holds the variable
        list, so existing variables are never replaced then (only missing ones are made)."""
        if not model.carry_state or batch_size is None:
            return
        store = model.stream_state(training)
        if nested and store.variables():
            return
        store.ensure(int(batch_size))

    def train_step(self, model, state, data):
        """One training step: `(logs, new_state)` from `state` and a batch `data`."""
        trainable, non_trainable, optimizer_variables, metrics_variables = state
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        loss_scaled = loss_scale(model.optimizer) is not None

        def loss_fn(trainable_values, non_trainable_values):
            log_probs, new_non_trainable, losses = model.stateless_call(
                trainable_values, non_trainable_values, x, training=True, return_losses=True,
                targets=y)
            loss, nll_sum, tokens = model.compute_lm_loss(y, log_probs, sample_weight,
                                                          extra_losses=losses, inputs=x,
                                                          training=True)
            scaled = loss
            if loss_scaled:
                with _optimizer_scope(model, optimizer_variables):
                    scaled = model.optimizer.scale_loss(loss)
            return scaled, (loss, nll_sum, tokens, new_non_trainable)

        grad_fn = jax.value_and_grad(loss_fn, has_aux=True)
        (_, (loss, nll_sum, tokens, non_trainable)), grads = grad_fn(trainable, non_trainable)
        with _optimizer_scope(model, optimizer_variables) as scope:
            grads, norm = process_gradients(self, model, list(grads), list(trainable), x, loss)
        # process_gradients may update optimizer state (AveragedSGD's lagged window scale)
        optimizer_variables = [scope.get_current_value(v) for v in model.optimizer.variables]
        trainable, optimizer_variables = model.optimizer.stateless_apply(
            optimizer_variables, grads, trainable)
        logs, metrics_variables = _metric_updates(model, metrics_variables, loss, nll_sum,
                                                  tokens, grad_norm=norm,
                                                  non_trainable=non_trainable)
        return logs, (trainable, non_trainable, optimizer_variables, metrics_variables)

    def test_step(self, model, state, data):
        """One evaluation step (no dropout, no extra losses): `(logs, new_state)`."""
        trainable, non_trainable, metrics_variables = state
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        log_probs, non_trainable = model.stateless_call(trainable, non_trainable, x,
                                                        training=False)
        loss, nll_sum, tokens = model.compute_lm_loss(y, log_probs, sample_weight,
                                                      extra_losses=[], inputs=x)
        logs, metrics_variables = _metric_updates(model, metrics_variables, loss, nll_sum,
                                                  tokens, non_trainable=non_trainable)
        return logs, (trainable, non_trainable, metrics_variables)

    def window_log_probs(self, model, tokens, states):
        """`forward_with_state` in evaluation mode with every variable read from the traced
        values (a `StatelessScope`), jitted once per model and window shape."""
        if not model.built:
            model.build()
        variables = model.variables
        forward = self._window_forwards.get(model)
        if forward is None:
            model_ref = weakref.ref(model)  # the cache must not keep the model alive

            def run(values, tokens, states):
                with keras.StatelessScope(state_mapping=list(zip(variables, values))):
                    log_probs, new_states = model_ref().forward_with_state(
                        tokens, states, training=False)
                return log_probs, [tuple(p) for p in new_states]

            forward = jax.jit(run)
            self._window_forwards[model] = forward
        states = states_or_zeros(model, tokens, states)
        return forward([v.value for v in variables], jax.numpy.asarray(tokens, "int32"),
                       [tuple(p) for p in states])

    def window_gradients(self, model, tokens, targets, states):
        """`jax.value_and_grad` of the forward pass with the trainable variables read from
        the traced values (a `StatelessScope`), jitted once per model and window shape."""
        variables = model.trainable_variables
        step = self._window_steps.get(model)
        if step is None:
            model_ref = weakref.ref(model)  # the cache must not keep the model alive

            def loss_fn(values, tokens, targets, states):
                with keras.StatelessScope(state_mapping=list(zip(variables, values))):
                    log_probs, new_states = model_ref().forward_with_state(
                        tokens, states, training=False)
                return window_nll(log_probs, targets), [tuple(p) for p in new_states]

            step = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))
            self._window_steps[model] = step
        states = states_or_zeros(model, tokens, states)
        (loss, new_states), grads = step([v.value for v in variables],
                                         jax.numpy.asarray(tokens, "int32"),
                                         jax.numpy.asarray(targets, "int32"),
                                         [tuple(p) for p in states])
        return loss, list(grads), new_states

    def picks_targets_in_training(self):
        return True

    def target_log_probs(self, h, weight, bias, targets, mask=None):
        """Chunk by chunk up to the window's extent (`tflm.backends.jax_target_log_probs`):
        no `(batch, time, V)` tensor, no compute for the positions padded in every row."""
        return jax_target_log_probs.target_log_probs(h, weight, bias, targets, mask)

    def mixture_target_log_probs(self, h, log_prior, weight, bias, targets, mask=None):
        """Chunk by chunk up to the window's extent
        (`tflm.backends.jax_mixture_target_log_probs`): no `(batch, time, K, V)` tensor."""
        return jax_mixture_target_log_probs.mixture_target_log_probs(
            h, log_prior, weight, bias, targets, mask)

    def uniform(self, shape, seed):
        """From a `SeedGenerator`: Threefry-2x32-20 keyed by its state, written in
        jax.numpy (`tflm.backends.jax_threefry`: the same generator as `jax.random`'s,
        compiled and run in about half the time); other seeds: `keras.random.uniform`."""
        if not isinstance(seed, keras.random.SeedGenerator):
            return super().uniform(shape, seed)
        state = jax.numpy.asarray(seed.next(), jax.numpy.uint32)
        return jax_threefry.uniform((state[0], state[1]), shape)

    def is_concrete(self, tensor):
        return not isinstance(tensor, jax.core.Tracer)

    def fused_lstm(self, cell, inputs, initial_state, mask, recurrent_kernel, *,
                   return_sequences, go_backwards, unroll):
        """Keras' cuDNN LSTM (unmasked), else cuDNN with per-sequence lengths for a mask of
        real positions (`tflm.backends.jax_lstm`); both on a GPU only."""
        try:
            last, outputs, states = self.keras_fused_lstm(
                cell, inputs, initial_state, mask, recurrent_kernel,
                return_sequences=return_sequences, go_backwards=go_backwards, unroll=unroll)
            return last, outputs, states, True
        except NotImplementedError:
            pass
        if (mask is None or go_backwards or unroll
                or cell.activation is not keras.activations.tanh
                or cell.recurrent_activation is not keras.activations.sigmoid):
            raise NotImplementedError("no fused JAX LSTM for this call")
        last, outputs, states = jax_lstm.cudnn_lstm_with_lengths(
            inputs, initial_state[0], initial_state[1], keras.ops.convert_to_tensor(cell.kernel),
            keras.ops.convert_to_tensor(recurrent_kernel),
            None if cell.bias is None else keras.ops.convert_to_tensor(cell.bias), mask,
            return_sequences=return_sequences)
        return last, outputs, states, True
