"""TensorFlow: graph train step with the replica all-reduce, state in variables, cuDNN LSTM."""

import weakref

import keras
import tensorflow as tf

from tflm import compat
from tflm.backends.base import Backend, states_or_zeros, window_nll
from tflm.backends.gradients import loss_scale, process_gradients
from tflm.backends.tensorflow_streams import TensorFlowStreamState
from tflm.data.pad_id import PAD_ID
from tflm.distribute import is_multi_worker


def _distributed(strategy):
    """True for a strategy that is more than the default one-device strategy."""
    return strategy.num_replicas_in_sync > 1 or is_multi_worker(strategy)


def _per_replica_loss(loss):
    """The replica's share of the global loss: the optimizer sums the replicas' updates."""
    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    return loss if replicas == 1 else loss * tf.cast(1.0 / replicas, loss.dtype)


class TensorFlowBackend(Backend):
    name = "tensorflow"

    def __init__(self):
        self._window_steps = weakref.WeakKeyDictionary()  # model -> compiled window step
        self._window_forwards = weakref.WeakKeyDictionary()  # model -> compiled forward

    def make_stream_state(self, sizes):
        return TensorFlowStreamState(sizes)

    def prepare_pass(self, model, training, batch_size, nested=False):
        """Build the model and create the stores before the step is traced (variables made
        inside the first trace make tf.function trace it twice) and size them for
        `batch_size` global rows outside any compiled step (XLA cannot resize a variable)."""
        strategy = model.distribute_strategy
        with strategy.scope():
            if not model.built and type(model).build is not keras.Model.build:
                model.build((None, None))  # a subclass that builds itself from token shape
            if not model.carry_state:
                return
            store = model.stream_state(training)
        replicas = strategy.num_replicas_in_sync
        if batch_size is not None and batch_size % replicas == 0:
            store.ensure(batch_size // replicas)

    def build_under_strategy(self, model):
        """Under a strategy, build the model from its own dummy window and the optimizer,
        so Keras does not build from a replica-reduced sample batch (see
        `tflm.compat.TokenWindowBuild`).

        Without one, Keras defers building to the first trace of the step; a built model's
        optimizer is built here all the same: variables created inside that trace make
        `tf.function` trace the step twice (once creating them, once more without), 1.4 s
        of the 200 / 400 x 3 PTB model's first training step."""
        strategy = model.distribute_strategy
        if not _distributed(strategy):
            if model.built and model.optimizer is not None and not model.optimizer.built:
                model.optimizer.build(model.trainable_variables)
            return False
        with strategy.scope():
            if not model.built:
                model.build()
            if model.optimizer is not None and not model.optimizer.built:
                model.optimizer.build(model.trainable_variables)
        return True

    def train_step(self, model, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        with tf.GradientTape() as tape:
            log_probs = model(x, training=True, targets=y)
            loss, nll_sum, tokens = model.compute_lm_loss(y, log_probs, sample_weight,
                                                          inputs=x, training=True)
            replica_loss = _per_replica_loss(loss)
            if loss_scale(model.optimizer) is not None:
                replica_loss = model.optimizer.scale_loss(replica_loss)
        variables = model.trainable_variables
        grads = tape.gradient(replica_loss, variables)
        replica_ctx = tf.distribute.get_replica_context()
        num_replicas = 1 if replica_ctx is None else replica_ctx.num_replicas_in_sync
        global_loss = loss
        if num_replicas > 1:
            # Clip on the all-reduced (global) gradient; the optimizer sums again, hence / R.
            present = [i for i, g in enumerate(grads) if g is not None]
            reduced = replica_ctx.all_reduce(tf.distribute.ReduceOp.SUM,
                                             [grads[i] for i in present] + [replica_loss])
            for i, g in zip(present, reduced[:-1]):
                grads[i] = g
            global_loss = reduced[-1]
            if loss_scale(model.optimizer) is not None:
                global_loss = global_loss / model.optimizer.dynamic_scale
        grads, norm = process_gradients(self, model, grads, variables, x, global_loss,
                                        num_replicas)
        model.optimizer.apply(grads, variables)
        return model.update_lm_metrics(loss, nll_sum, tokens, grad_norm=norm)

    def make_test_function(self, model, make, force=False):
        """Keras' evaluation function; XLA-compiled when `model.xla_evaluation` is set,
        even on a CPU where Keras' `jit_compile="auto"` turns XLA off.

        Why: on a CPU the LSTM's time loop runs op by op in TensorFlow's executor, and at
        batch 1 that overhead dominates an evaluation step: the whole PTB test split at
        batch 1 took 29.9-30.4 s for the 200 / 400 x 3 model op by op and 19.7-22.2 s
        under XLA, same perplexity (bench/RESULTS.md in git history; JAX's compiled step: 13 s).
        Evaluation windows are all bptt long but the last, so XLA compiles about twice per
        batch size. Training keeps Keras' choice: its random window lengths would
        recompile almost every step. Not applied under a distribution strategy (Keras
        keeps XLA off there), when XLA is on already, or when a layer says
        `supports_jit = False`."""
        if (not getattr(model, "xla_evaluation", False) or model.run_eagerly
                or model.jit_compile or _distributed(model.distribute_strategy)
                or (model.test_function is not None and not force)
                or not all(layer.supports_jit for layer in compat.nested_layers(model))):
            return make(force)
        model.jit_compile = True
        try:
            return make(force)
        finally:
            model.jit_compile = False

    def window_gradients(self, model, tokens, targets, states):
        """One compiled function per model (retraced per window shape): the tape over
        `forward_with_state` in evaluation mode."""
        step = self._window_steps.get(model)
        if step is None:
            variables = model.trainable_variables
            model_ref = weakref.ref(model)  # the cache must not keep the model alive

            @tf.function(reduce_retracing=True)
            def step(tokens, targets, states):
                with tf.GradientTape() as tape:
                    log_probs, new_states = model_ref().forward_with_state(
                        tokens, states, training=False)
                    loss = window_nll(log_probs, targets)
                grads = tape.gradient(loss, variables,
                                      unconnected_gradients=tf.UnconnectedGradients.ZERO)
                return loss, grads, [tuple(pair) for pair in new_states]

            self._window_steps[model] = step
        states = states_or_zeros(model, tokens, states)
        loss, grads, new_states = step(tf.convert_to_tensor(tokens, tf.int32),
                                       tf.convert_to_tensor(targets, tf.int32),
                                       [tuple(pair) for pair in states])
        return loss, list(grads), [tuple(pair) for pair in new_states]

    def window_log_probs(self, model, tokens, states):
        """`forward_with_state` in evaluation mode, one `tf.function` per model (retraced
        per window shape), XLA-compiled where every layer supports it.

        Why XLA: at batch 1 (the Q_theta export) a time step is a 1-row matrix-vector
        product per layer plus a dozen small ops, and TensorFlow's executor spends about as
        long dispatching those ops as the products take; XLA fuses them into the loop
        body. The PTB preset's export: 1.2 -> 0.63 ms a row on one 2-core CPU
        (bench/RESULTS.md in git history). A model whose layers say `supports_jit = False`, that runs under
        a distribution strategy, or that XLA cannot compile (its first call fails) gets the
        plain graph function."""
        forward = self._window_forwards.get(model)
        if not model.built:
            model.build()
        states = [tuple(p) for p in states_or_zeros(model, tokens, states)]
        tokens = tf.convert_to_tensor(tokens, tf.int32)
        if forward is None:
            jit = (not _distributed(model.distribute_strategy)
                   and all(layer.supports_jit for layer in compat.nested_layers(model)))
            forward = self._window_forward(model, jit)
            if jit:
                try:
                    result = forward(tokens, states)
                except (tf.errors.InvalidArgumentError, tf.errors.UnimplementedError,
                        tf.errors.InternalError):
                    forward = self._window_forward(model, jit=False)
                else:
                    self._window_forwards[model] = forward
                    return result
            self._window_forwards[model] = forward
        return forward(tokens, states)

    @staticmethod
    def _window_forward(model, jit):
        model_ref = weakref.ref(model)  # the cache must not keep the model alive

        @tf.function(reduce_retracing=True, jit_compile=jit)
        def forward(tokens, states):
            log_probs, new_states = model_ref().forward_with_state(tokens, states,
                                                                   training=False)
            return log_probs, [tuple(pair) for pair in new_states]

        return forward

    def step_logs(self, model, logs):
        if is_multi_worker(model.distribute_strategy):
            # Keras reduces per-step logs with reduce(MEAN, axis=0) across workers, which
            # needs at least one dimension; the epoch logs come from the metrics themselves.
            return {k: tf.reshape(v, (1,)) for k, v in logs.items()}
        return logs

    def is_concrete(self, tensor):
        return tf.executing_eagerly()

    def written_lstm_backward(self):
        """Not under `MultiWorkerMirroredStrategy`: there Grappler's constant folding gives
        the written loop a 0-row initial state ("Incompatible shapes: [0,12] vs. [2,1]" in
        test_distribute's multi-worker test; it passes with constant folding off), so
        multi-worker training differentiates the loop by autodiff, as before."""
        return not isinstance(tf.distribute.get_strategy(),
                              tf.distribute.MultiWorkerMirroredStrategy)

    def averages_under_one_cond(self):
        """Yes, outside a `tf.distribute` strategy: a `cond` per variable cost the
        200 / 400 x 3 PTB model's first training step about 0.4 s (a branch-function pair
        each to trace, and grappler's work on them). Under a strategy `update_step` runs per
        replica component in the cross-replica context, where the averages are assigned."""
        return not tf.distribute.has_strategy()

    def unpadded_check(self, model):
        """`tf.debugging.assert_none_equal` on the tokens, except under XLA
        (`model.jit_compile`), where an assertion compiles to nothing."""
        if model.jit_compile:
            return None

        def check(tokens):
            tf.debugging.assert_none_equal(
                tokens, tf.constant(PAD_ID, tokens.dtype),
                message=f"{type(model).__name__}.padded_windows is False but a training "
                        f"window holds padding (token id {PAD_ID}); set "
                        "model.padded_windows = True for padded windows.")

        return check

    def pick_targets(self, log_probs, targets):
        """`tf.gather` with batch dimensions. Keras' `take_along_axis` gathers with
        broadcast indices whose gradient scatters through a dense (B T V) segment sum:
        32 ms of a 305 ms training step of the 200 / 400 x 3 PTB model at batch 20 x 35
        (one CPU thread); this one's costs 1 ms."""
        return tf.gather(log_probs, targets, batch_dims=len(targets.shape))

    def squared_norm(self, gradient):
        """||g||^2 of a gradient, `tf.IndexedSlices` included: the slices of a gathered
        variable (an untied input embedding, the rows a sampled softmax scores) repeat a row
        once per lookup, and after a replica all-reduce once per replica, so the rows are
        summed per index before squaring (the dense gradient's norm, as
        `torch.nn.utils.clip_grad_norm_` sees it); squaring the slices' values would
        undercount every repeated row."""
        if isinstance(gradient, tf.IndexedSlices):
            rows, position = tf.unique(gradient.indices)
            summed = tf.math.unsorted_segment_sum(gradient.values, position, tf.shape(rows)[0])
            return tf.reduce_sum(tf.square(tf.cast(summed, tf.float32)))
        return super().squared_norm(gradient)

    def global_batch_block(self):
        """The replica's block under a `tf.distribute` strategy: Keras splits each global
        batch into contiguous per-replica blocks in replica order (`tflm.distribute`), and
        `replica_id_in_sync_group` counts replicas over all workers. `(0, 1)` without a
        strategy, with one replica, or in a cross-replica context."""
        ctx = tf.distribute.get_replica_context()
        if ctx is None or ctx.num_replicas_in_sync == 1:
            return 0, 1
        return ctx.replica_id_in_sync_group, ctx.num_replicas_in_sync

    def fused_lstm(self, cell, inputs, initial_state, mask, recurrent_kernel, *,
                   return_sequences, go_backwards, unroll):
        last, outputs, states = self.keras_fused_lstm(
            cell, inputs, initial_state, mask, recurrent_kernel,
            return_sequences=return_sequences, go_backwards=go_backwards, unroll=unroll)
        return last, outputs, states, False  # cuDNN ops are not XLA-compatible
