"""The interface every backend object implements, with the defaults eager backends share.

`tflm.LanguageModel` holds the language-model logic once (loss, metrics, the carried state
between windows, resets per pass) and asks the object `tflm.backends.current()` returns for
everything that differs between Keras backends:

    make_stream_state(sizes)       where each stream's (h, c) is kept between windows
    carried_variables(model)       variables that must travel through a compiled step (JAX)
    prepare_pass(model, training, batch_size, nested)
                                   build / size the state before fit, evaluate, predict, ...
    build_under_strategy(model)    build before a tf.distribute trace (TensorFlow)
    train_step(model, *args)       one optimizer step (see `tflm.backends.gradients`)
    test_step(model, *args)        one evaluation step
    make_train_function(model, make, force)
    make_test_function(model, make, force)
                                   Keras' training / evaluation function (`make`: Keras' own
                                   builder), compiled as the backend sees fit (XLA on
                                   TensorFlow when `model.xla_evaluation`; on JAX windows
                                   padded to compiled lengths when
                                   `model.pad_to_compiled_lengths`)
    step_logs(model, logs)         per-step logs as the trainer wants them
    is_concrete(tensor)            whether the tensor's values are known now
    pick_targets(log_probs, targets)
                                   log_probs[..., targets]: the loss's gather
    picks_targets_in_training()    whether the train step asks a softmax, MoS or MoC output
                                   layer for the targets' log-probabilities alone
    target_log_probs(h, weight, bias, targets, mask)
                                   log softmax(h weight^T + bias) at the targets
    mixture_target_log_probs(h, log_prior, weight, bias, targets, mask)
                                   log sum_k pi_k softmax(h_k weight^T + bias) at the
                                   targets (a mixture of softmaxes)
    written_lstm_backward()        whether the portable LSTM may take `lstm_backward`
    unpadded_check(model)          a runtime check that traced tokens hold no padding, or
                                   None (`LanguageModel.padded_windows`)
    averages_under_one_cond()      whether `AveragedSGD` updates all its averages under one
                                   `cond` (else one per variable)
    linear(x, weight, bias)        x weight^T + bias: the output layer's logits
    global_batch_block()           which block of the global batch this replica holds
    uniform(shape, seed)           float32 uniforms in [0, 1) from a SeedGenerator: the
                                   dropout masks' draws
    normal(shape, seed, dtype)     standard normals from a SeedGenerator: the embedding
                                   noise's draws (PyTorch: seeded from the host, as uniform)
    constant(value, like)          a Python number as a 0-d tensor beside `like`, for an op
                                   with it (PyTorch: made once, not copied at every step)
    host_scalar(variable), host_scalar_written(variable, value)
                                   an integer variable's value on the host (PyTorch: read
                                   from the device only after an outside write)
    rnn_loop(...)                  a recurrent layer's time loop (Keras'; PyTorch: the
                                   written-out one, no per-step read of a time counter)
    fused_lstm(...)                the fused LSTM kernel, or NotImplementedError
    window_gradients(model, x, y, states)
                                   mean NLL of one window and its gradient, evaluation mode
                                   (dynamic evaluation: `zoo.dynamic_eval`)
    window_log_probs(model, x, states)
                                   log-probabilities of one window and the final states,
                                   evaluation mode, compiled where the backend compiles
                                   (Q_theta export: `tools.qmatrix`)
    requires_batch_size            whether a pass must know its batch size before it starts

A new backend is one module in this folder with one subclass of `Backend`, registered in
`tflm/backends/__init__.py`; nothing outside this folder changes (docs/design.md).
"""

import keras
from keras import ops

from tflm import compat
from tflm.backends.streams import EagerStreamState


class Backend:
    """Defaults for an eager backend without a train step (e.g. KERAS_BACKEND=numpy)."""

    name = "eager"
    requires_batch_size = False

    # ---- the state carried between windows --------------------------------------------
    def make_stream_state(self, sizes):
        return EagerStreamState(sizes)

    def carried_variables(self, model):
        return []

    def prepare_pass(self, model, training, batch_size, nested=False):
        """Make `model` ready for a pass over windows of `batch_size` rows (None: unknown).
        `nested`: another pass of the same model is running (validation inside fit)."""

    def build_under_strategy(self, model):
        return False

    # ---- steps ---------------------------------------------------------------------------
    def train_step(self, model, *args):
        raise NotImplementedError(
            f"The language-model train step is implemented for the TensorFlow, JAX and "
            f"PyTorch backends; KERAS_BACKEND={keras.backend.backend()!r} can run the model "
            "forward (model.forward_with_state) but not model.fit.")

    def test_step(self, model, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        log_probs = model(x, training=False)
        # The evaluation loss is the NLL alone on every backend (JAX's stateless step sees
        # no losses either): weight regularizers' penalties are training terms.
        loss, nll_sum, tokens = model.compute_lm_loss(y, log_probs, sample_weight,
                                                      extra_losses=[], inputs=x)
        return model.update_lm_metrics(loss, nll_sum, tokens)

    def make_train_function(self, model, make, force=False):
        """Build the model's training function with Keras' own `make(force)`."""
        return make(force)

    def make_test_function(self, model, make, force=False):
        """Build the model's evaluation function with Keras' own `make(force)`."""
        return make(force)

    def step_logs(self, model, logs):
        return logs

    def squared_norm(self, gradient):
        """||g||^2 of one gradient, float32: the sum of squares of its dense form (a
        backend whose gradients can be sparse sums the repeated rows first)."""
        return ops.sum(ops.square(ops.cast(gradient, "float32")))

    def global_norm(self, gradients):
        """sqrt(sum_i ||g_i||^2) over the list `gradients` (no None), float32 scalar."""
        return ops.sqrt(ops.sum(ops.stack([self.squared_norm(g) for g in gradients])))

    def scale_and_decay(self, gradients, factor, decay=None, variables=None):
        """`g * factor + decay * v` for each gradient g (None stays None) and its variable
        v (`decay` None: `g * factor`), `factor` and `decay` cast to g's dtype."""
        out = []
        for i, g in enumerate(gradients):
            if g is not None:
                g = g * ops.cast(factor, g.dtype)
                if decay is not None:
                    g = g + ops.cast(decay, g.dtype) * ops.cast(variables[i], g.dtype)
            out.append(g)
        return out

    def updates_together(self, variables, gradients):
        """Whether `subtract_scaled` updates these variables together (PyTorch's
        multi-tensor kernels, for dense float32 tensors). False elsewhere: there the step
        is traced and compiled as a whole, and the optimizer's per-variable `update_step`
        stays in charge (TensorFlow's is `tf.distribute`-aware)."""
        return False

    def subtract_scaled(self, variables, gradients, rate):
        """`v -= g * rate` for each variable and its gradient."""
        for variable, gradient in zip(variables, gradients):
            variable.assign_sub(gradient * rate)

    def window_gradients(self, model, tokens, targets, states):
        """`(loss, grads, new_states)` for one window in evaluation mode (no dropout):
        `loss` the mean NLL of `targets` (B, T) given `tokens` (B, T) and the carried
        `states` (None: zeros), `grads` its gradient for each of `model.trainable_variables`
        (zeros for one the loss does not reach), `new_states` the final states, cut from
        the gradient. No variable is changed."""
        raise NotImplementedError(
            f"gradients of a window are implemented for the TensorFlow, JAX and PyTorch "
            f"backends, not KERAS_BACKEND={keras.backend.backend()!r}.")

    def window_log_probs(self, model, tokens, states):
        """`(log_probs, new_states)` of `model.forward_with_state(tokens, states)` in
        evaluation mode (`states` None: zeros). This default runs it eagerly; TensorFlow
        and JAX compile it once per model and window shape (eagerly, the Q_theta export of
        the PTB preset took 3.5x as long per batch-1 row: bench/RESULTS.md in git history)."""
        return model.forward_with_state(tokens, states, training=False)

    # ---- tensors and kernels -------------------------------------------------------------
    def is_concrete(self, tensor):
        return True

    def written_lstm_backward(self):
        """Whether the portable LSTM loop may be differentiated by `lstm_backward` here."""
        return True

    def averages_under_one_cond(self):
        """Whether `tflm.optimizers.AveragedSGD` updates every average under one `cond` on
        "averaging active" after the SGD step, or each in its own `cond` inside
        `update_step` (the default). JAX keeps a cond per variable: with one cond over all
        averages its next step failed with "Attempt to donate the same buffer twice"
        (tests/tflm/test_triggers.py)."""
        return False

    def unpadded_check(self, model):
        """A function placing a runtime check, in `model`'s traced train step, that the
        tokens hold no `PAD_ID`, or None where no such check can run (then the step keeps
        its mask: `LanguageModel.padded_windows`). Eager backends need none: their tokens
        are concrete and `tflm.padding.padding_mask` looks at them."""
        return None

    def call_layer(self, layer, *args, **kwargs):
        """`layer(*args, **kwargs)`. PyTorch runs `layer.call` directly where Keras'
        `Layer.__call__` would change nothing (`tflm.backends.torch_layer_calls`): its eager
        step pays that bookkeeping on the host at every call, the traced steps of the
        other backends once."""
        return layer(*args, **kwargs)

    def linear(self, x, weight, bias=None):
        """`x weight^T + bias`, `weight` `(out, in)` (a tied embedding's layout)."""
        out = ops.matmul(x, ops.transpose(weight))
        return out if bias is None else out + bias

    def pick_targets(self, log_probs, targets):
        """`log_probs[..., targets]`: `(..., V)` and int `(...)` -> `(...)`."""
        picked = ops.take_along_axis(log_probs, ops.expand_dims(targets, -1), axis=-1)
        return ops.squeeze(picked, -1)

    def picks_targets_in_training(self):
        """Whether a model whose output layer can (`picks_targets`: the softmax, MoS and
        MoC heads) computes only the targets' log-probabilities in its train step
        (`target_log_probs`, `mixture_target_log_probs`), its loss reading them as column
        0 (`LanguageModel.picks_targets_in_training`). JAX does (its chunked picks stop at
        a padded window's last real position), and PyTorch (eager: a mixture of softmaxes
        picked forms no log-mixture). TensorFlow does not: XLA compiles its step, and the
        MoS preset's step took as long either way (two models in one process on a 2-core
        CPU, 12 steps each alternated: medians 2,482 / 2,587 ms)."""
        return False

    def target_log_probs(self, h, weight, bias, targets, mask=None):
        """log softmax(h weight^T + bias) at `targets`, `(batch, time)` float32; `weight`
        `(V, d)`, `bias` `(V,)` or None, `mask` `(batch, time)` of the real positions or
        None (a backend may skip the padded positions: their values are unspecified)."""
        logits = ops.cast(self.linear(h, weight, bias), "float32")
        return self.pick_targets(ops.log_softmax(logits, axis=-1), targets)

    def mixture_target_log_probs(self, h, log_prior, weight, bias, targets, mask=None):
        """log sum_k pi_k softmax(h_k weight^T + bias) at `targets`, `(batch, time)` float32:
        `h` `(batch, time, K, d)`, `log_prior` `(batch, time, K)` (log pi), `weight` `(V,
        d)`, `bias` `(V,)` or None, `mask` as `target_log_probs`'. Here each component's
        log-probability of the target, log_softmax(l_k)_y, then their log-sum-exp with the
        prior (the logits picked with `pick_targets`, then their log-sum-exp over V taken
        off: no second `(batch, time, K, V)` tensor)."""
        logits = ops.cast(self.linear(h, weight, bias), "float32")          # (B, T, K, V)
        lse = ops.logsumexp(logits, axis=-1)                                # (B, T, K)
        ids = ops.broadcast_to(ops.expand_dims(targets, -1), ops.shape(lse))
        picked = self.pick_targets(logits, ids) - lse
        return ops.logsumexp(ops.cast(log_prior, "float32") + picked, axis=-1)

    def global_batch_block(self):
        """`(index, count)`: the calling replica holds rows `[index b, (index + 1) b)` of a
        global batch of `count b` rows, `b` its own batch size. `(0, 1)` where a step sees
        the whole global batch: one device, PyTorch, JAX (whose `DataParallel` shards
        global arrays inside one program). `index` may be a tensor.

        Per-stream random draws (`tflm.layers.LockedDropout`) use it to draw for the
        global batch and keep their own block, so each stream's mask is its own on every
        replica, and a replicated step draws exactly the masks one device would."""
        return 0, 1

    def uniform(self, shape, seed):
        """float32 uniforms in [0, 1) of `shape`: `keras.random.uniform(shape, seed=seed)`
        (`seed`: a `keras.random.SeedGenerator`, whose state advances, or anything
        `keras.random` takes). The dropout layers draw their masks here."""
        return keras.random.uniform(shape, seed=seed)

    def normal(self, shape, seed, dtype="float32"):
        """Standard normals of `shape` and `dtype`: `keras.random.normal(shape, dtype=dtype,
        seed=seed)`, as `uniform` (the embedding noise draws here)."""
        return keras.random.normal(shape, dtype=dtype, seed=seed)

    def constant(self, value, like):
        """The Python number `value` as a 0-d tensor of `like`'s dtype, for an op with the
        tensor or variable `like`: `ops.cast(value, dtype)`, what `keras.ops` makes of a
        number there. (Where `value` is already a tensor: cast to that dtype.)"""
        return ops.cast(value, keras.backend.standardize_dtype(like.dtype))

    def assign_add(self, variable, value):
        """`variable.assign_add(value)`: `variable += value`, `value` converted to the
        variable's dtype first."""
        variable.assign_add(value)

    def host_scalar(self, variable):
        """The integer value of the 0-d `variable`, as a Python int: read from the device
        (a wait for the work queued before it, on a GPU)."""
        return int(ops.convert_to_numpy(variable))

    def host_scalar_written(self, variable, value):
        """Tell `host_scalar` that `variable` now holds `value` (the caller's own update of
        it, just made): a backend that keeps host copies need not read it back."""

    def rnn_loop(self, step_function, inputs, initial_states, *, mask, go_backwards, unroll,
                 zero_output_for_mask, return_all_outputs):
        """A recurrent layer's time loop, `(last_output, outputs, new_states)`: Keras' own
        (`compat.rnn_loop`: tf.while_loop, lax.scan, or written out with `unroll`)."""
        return compat.rnn_loop(step_function, inputs, initial_states, mask=mask,
                               go_backwards=go_backwards, unroll=unroll,
                               zero_output_for_mask=zero_output_for_mask,
                               return_all_outputs=return_all_outputs)

    def fused_lstm(self, cell, inputs, initial_state, mask, recurrent_kernel, *,
                   return_sequences, go_backwards, unroll):
        """`(last, outputs, [h, c], xla_compatible)` from the backend's fused LSTM kernel for
        `cell`'s weights with `recurrent_kernel` in place of U; `NotImplementedError` where
        none applies (then `tflm.backends.lstm_kernels` runs the portable loop)."""
        raise NotImplementedError(f"no fused LSTM kernel on {self.name}")

    @staticmethod
    def keras_fused_lstm(cell, inputs, initial_state, mask, recurrent_kernel, *,
                         return_sequences, go_backwards, unroll):
        """Keras' own fused (cuDNN) LSTM for `cell` with `recurrent_kernel` as U:
        `(last, outputs, [h, c])`, or `NotImplementedError` where it does not apply."""
        return compat.fused_lstm(
            inputs, initial_state[0], initial_state[1], mask, cell.kernel, recurrent_kernel,
            cell.bias, activation=cell.activation,
            recurrent_activation=cell.recurrent_activation,
            return_sequences=return_sequences, go_backwards=go_backwards, unroll=unroll)


def window_nll(log_probs, targets):
    """Mean negative log-likelihood of `targets` (B, T) under `log_probs` (B, T, V)."""
    picked = keras.ops.take_along_axis(
        keras.ops.cast(log_probs, "float32"),
        keras.ops.expand_dims(keras.ops.cast(targets, "int32"), -1), axis=-1)
    return -keras.ops.mean(picked)


def states_or_zeros(model, tokens, states):
    """`states`, or zero (h, c) per layer of `model.state_sizes()` for the batch of `tokens`
    (B, T): what a window starts from when no state is carried in."""
    if states is not None:
        return states
    batch = int(tokens.shape[0])
    return [(keras.ops.zeros((batch, size)), keras.ops.zeros((batch, size)))
            for size in model.state_sizes()]
