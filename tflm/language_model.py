"""`LanguageModel`: a `keras.Model` that trains and evaluates over BPTT windows."""

import contextlib

import keras
from keras import ops

from tflm import backends, compat, generation
from tflm.batch_size import batch_size_of, leading_dim
from tflm.compat import TokenWindowBuild, nested_layers
from tflm.layers.candidate_sampler import CandidateSampler
from tflm.losses import sampled_token_nll, token_nll
from tflm.metrics import Perplexity, TokenMeanNLL
from tflm.padding import promised_unpadded, real_position_weights


class ResetTrainingStreams(keras.callbacks.Callback):
    """Zero the training streams' state at the start of every epoch (a new pass)."""

    def on_epoch_begin(self, epoch, logs=None):
        self.model.reset_stream_states("train")


class LanguageModel(TokenWindowBuild, keras.Model):
    """Base class of recurrent language models trained on contiguous streams.

    A subclass defines `state_sizes()` (hidden size of each recurrent layer) and
    `forward_with_state(tokens, states, training) -> (log_probs, new_states)`, a pure
    function of its inputs (not named `forward`: that is torch.nn.Module's call hook).
    This class adds what `model.fit` / `evaluate` / `predict` need:

    - the LSTM state of every stream is carried from one window to the next (per replica),
      without gradient across windows, separately for training and for inference; it is
      zeroed at the start of every epoch and of every `evaluate` / `predict(stream=True)`
      (docs/design.md, contract 3; no `stateful=True`). On JAX the jitted steps are
      stateless, so the state lives in non-trainable variables of the batch's shape (not
      weights, not saved), made when fit / evaluate / predict start; each distinct window
      length compiles the step once, so pad the windows (`lm_dataset(...,
      pad_to_multiple=4)`): input positions holding `tflm.data.PAD_ID` carry no loss, do
      not move the state and do not count in T (`tflm.padding`);
    - the train step (see `tflm.backends.gradients`): loss = token-mean NLL +
      `sum(model.losses)`, global-norm clipping at `clip_norm`, L2 `weight_decay`, gradient
      scaled by window length / `bptt` (the reference's per-window learning rate);
    - metrics over the whole pass: `loss` and `nll` token-weighted means, `perplexity` =
      exp(total NLL / total tokens), and the last step's gradient norm; with
      `log_window_values = True` also the window's own `window_loss`, `window_nll` and
      `window_tokens` in every step's logs (for benchmarks that time single steps).

    Inference state, explicitly:

    - `model(x)` starts every call from zero state and keeps nothing: the same input gives
      the same output. `model.forward_with_state(x, states)` returns the new states for
      you to pass on.
    - `with model.streaming(): model(x1); model(x2)` carries the state from each call to
      the next (consecutive windows of the same streams); `model.reset_states()` zeros it.
    - `predict(x)` and `predict_on_batch(x)` treat every batch as independent rows (zero
      state per batch, as Keras' `predict`); `predict(windows, stream=True)` carries the
      state across the batches of one call, for a split's windows in stream order
      (`tflm.data.lm_dataset(..., train=False)`).
    - `fit`, `evaluate`, `train_on_batch` and `test_on_batch` carry it: their batches are
      consecutive windows of the same streams, as the reference trains and evaluates.

    `model.xla_evaluation = True` compiles evaluate's step (and fit's validation) with XLA
    on TensorFlow even where Keras' `jit_compile="auto"` would not (a CPU), where the
    executor's per-op overhead dominates small evaluation steps
    (`TensorFlowBackend.make_test_function`); `zoo.train` sets it. Other backends compile
    their steps already (JAX) or run eagerly (PyTorch; with `jit_compile=True` its train
    step's forward pass is compiled: `tflm.backends.torch_compiled_step`).

    Everything that differs between TensorFlow, JAX and PyTorch is behind
    `tflm.backends.current()`; `traced_steps` counts the Python executions of the train and
    test steps (the traces under tf.function / jax.jit; every step on PyTorch).

    Args:
        bptt: nominal window length for the learning-rate scaling. Default 70.
        clip_norm: global gradient-norm clip (None or 0 disables). Default 0.25.
        weight_decay: L2 coefficient added to the clipped gradient (torch SGD style; the
            reference uses 1.2e-6). Default 0.
        scale_by_window: scale each step by T / bptt. Default True.
        carry_state: carry LSTM state across windows. Default True.
        flooding_level: flood level b (Ishida et al. 2020): train on |L - b| + b; None
            disables. Default None.
        loss_reduction: "token_mean" (default: the NLL averaged over the window's tokens,
            the AWD-LSTM family's) or "sum_over_time" (the NLL summed over the window's
            time steps and averaged over its B streams, sum_{b,t} NLL / B, as TensorFlow's
            PTB tutorial `sequence_loss(average_across_timesteps=False)`: the gradient, its
            clipping and so the learning rate act on T times the token mean; Zaremba et
            al. 2014's lr 1.0 means this). The "loss" in the logs is this objective.

    Compile with an optimizer only: `model.compile(optimizer=keras.optimizers.SGD(30))`;
    the loss is the NLL of the log-probabilities the model returns.
    """

    LOSS_REDUCTIONS = ("token_mean", "sum_over_time")

    def __init__(self, bptt=70, clip_norm=0.25, weight_decay=0.0, scale_by_window=True,
                 carry_state=True, flooding_level=None, loss_reduction="token_mean",
                 **kwargs):
        super().__init__(**kwargs)
        if loss_reduction not in self.LOSS_REDUCTIONS:
            raise ValueError(f"loss_reduction must be one of {', '.join(self.LOSS_REDUCTIONS)}"
                             f"; got {loss_reduction!r}.")
        self.loss_reduction = loss_reduction
        if int(bptt) < 1:
            raise ValueError(f"bptt must be >= 1; got {bptt}.")
        if clip_norm is not None and float(clip_norm) < 0:
            raise ValueError(f"clip_norm must be >= 0 or None; got {clip_norm}.")
        self.bptt = int(bptt)
        self.clip_norm = None if not clip_norm else float(clip_norm)
        if float(weight_decay) < 0:
            raise ValueError(f"weight_decay must be >= 0; got {weight_decay}.")
        self.weight_decay = float(weight_decay)
        self.scale_by_window = bool(scale_by_window)
        self.flooding_level = None if flooding_level is None else float(flooding_level)
        self.carry_state = bool(carry_state)
        self.log_window_values = False
        self.traced_steps = {"train": 0, "test": 0}
        self._streams = None
        self._passes_running = 0
        self._carrying = 0  # > 0: call() carries the stream state (a pass, streaming())
        self._predict_streams = None  # the `stream` the predict function was traced with
        self.loss_tracker = TokenMeanNLL(name="loss")
        self.nll_tracker = TokenMeanNLL(name="nll")
        self.perplexity_tracker = Perplexity(name="perplexity")
        self.grad_norm_tracker = keras.metrics.Mean(name="grad_norm")

    # ---- to implement ------------------------------------------------------------------
    def state_sizes(self):
        raise NotImplementedError

    def forward_with_state(self, tokens, states=None, training=False):
        raise NotImplementedError

    # ---- stream state ------------------------------------------------------------------
    def stream_state(self, training):
        """The store (`tflm.backends.streams`) of the training or the inference streams."""
        if self._streams is None:
            backend = backends.current()
            self._streams = {"train": backend.make_stream_state(self.state_sizes()),
                             "eval": backend.make_stream_state(self.state_sizes())}
        return self._streams["train" if training else "eval"]

    def stream_states(self):
        """The stores made so far, training first (none before the first call or pass)."""
        return [] if self._streams is None else [self._streams["train"], self._streams["eval"]]

    def create_stream_states(self):
        """Create the state stores now (call under `strategy.scope()` when distributed)."""
        self.stream_state(True)

    def reset_states(self):
        """Zero the carried state of every stream (training and inference)."""
        self.reset_stream_states()

    @contextlib.contextmanager
    def streaming(self):
        """Within this block, direct calls `model(x)` carry the LSTM state from one call to
        the next (windows of the same streams, in order); outside it every call starts
        from zero state. The carried state is not zeroed on entry: `reset_states()`."""
        self._carrying += 1
        try:
            yield self
        finally:
            self._carrying -= 1

    def reset_stream_states(self, which="all"):
        """Zero the carried state: "train", "eval" or "all"."""
        if self._streams is None:
            return
        for name in (("train", "eval") if which == "all" else (which,)):
            self._streams[name].reset()

    @property
    def variables(self):
        # JAX carries the stream state through its jitted steps as non-trainable variables
        # (not weights: not saved); other backends list none here.
        return super().variables + backends.current().carried_variables(self)

    def build_under_strategy(self):
        """Called by Keras' TensorFlow trainer before tracing (`tflm.compat.TokenWindowBuild`):
        builds the model and optimizer under a distribution strategy, True when it did; without
        one, builds a built model's optimizer (one trace of the step, not two) and is False."""
        return backends.current().build_under_strategy(self)

    @property
    def uses_targets(self):
        """Whether the forward pass reads the window's targets in training (a head with
        AdvSoft); then the train steps call `model(x, training=True, targets=y)` and
        `forward_with_state` receives `targets=`. False by default."""
        return False

    @property
    def samples_in_training(self):
        """Whether the forward pass in training (given the targets) returns log-probabilities
        over sampled candidates with the target in column 0 (a head trained by importance
        sampling, `tflm.losses.importance_sampled_log_probs`); the training loss then reads
        column 0. False by default."""
        return False

    @property
    def picks_targets_in_training(self):
        """Whether the forward pass in training, given the targets, returns only their
        log-probabilities, `(batch, time, 1)` (where the backend computes them apart from
        the rest of the vocabulary: `Backend.picks_targets_in_training`); the training loss
        then reads column 0. False by default."""
        return False

    # Whether training windows may hold `PAD_ID` positions. False: the traced train step
    # assumes none and runs the mask-free LSTM loop, where the backend can check that at
    # run time (`Backend.unpadded_check`: TensorFlow outside XLA; a padded window then
    # fails with an error naming this flag); elsewhere the mask stays. On TensorFlow the
    # 200 / 400 x 3 PTB model's step took 4% less time and its first (traced) step 0.45 s
    # less (bench/RESULTS.md, in git history). `python -m zoo.train` sets it from the run's padding.
    padded_windows = True

    def call(self, tokens, training=False, targets=None):
        check = None
        if training and self.padded_windows is False:
            check = backends.current().unpadded_check(self)
        with promised_unpadded(check):
            return self._call(tokens, training, targets)

    def _call(self, tokens, training, targets):
        extra = {"targets": targets} if (targets is not None and training
                                          and self.uses_targets) else {}
        # A shapes-only trace neither reads nor writes the carried state: Keras' symbolic
        # build in fit / evaluate runs the model eagerly on dummy tokens on PyTorch, and the
        # state it left made the first window of every pass start from it.
        if not (self.carry_state and self._carrying) or compat.in_symbolic_scope():
            log_probs, _ = self.forward_with_state(tokens, None, training=training, **extra)
            return log_probs
        store = self.stream_state(training)
        states = store.read(ops.shape(tokens)[0], self.compute_dtype)
        log_probs, new_states = self.forward_with_state(tokens, states, training=training,
                                                        **extra)
        store.write(new_states)
        return log_probs

    # ---- loss and metrics --------------------------------------------------------------
    def compute_lm_loss(self, y, log_probs, sample_weight=None, extra_losses=None,
                        inputs=None, training=False):
        """(loss, NLL sum, token count) for one window; loss adds `self.losses` (or
        `extra_losses` when given: the losses a stateless JAX call collected). With the
        window's `inputs`, padded positions (`tflm.data.PAD_ID`) carry no weight.
        `training`: the train steps' forward pass, whose log-probabilities are over sampled
        candidates when `samples_in_training` (then the NLL, and the training loss and
        perplexity in the logs, are the sampled objective's)."""
        if training and self.samples_in_training:
            nll = sampled_token_nll(log_probs)
        elif training and self.picks_targets_in_training:
            nll = -ops.cast(log_probs[..., 0], "float32")
        else:
            nll = token_nll(y, log_probs)
        if inputs is None:
            weights = ops.ones_like(nll)
        else:
            weights = real_position_weights(inputs)
        if sample_weight is not None:
            weights = ops.cast(sample_weight, "float32") * weights
        nll_sum = ops.sum(nll * weights)
        tokens = ops.sum(weights)
        if self.loss_reduction == "sum_over_time":  # sum_t mean_b: per stream, not per token
            loss = nll_sum / _as_float(ops.shape(nll)[0])
        else:
            loss = nll_sum / ops.maximum(tokens, backends.current().constant(1.0, tokens))
        extra = self.losses if extra_losses is None else list(extra_losses)
        if extra:
            loss = loss + ops.sum(ops.stack([ops.cast(l, "float32") for l in extra]))
        return loss, nll_sum, tokens

    def window_scale(self, x):
        """T / bptt for a window `x` of T real positions (padding left out; 1.0 when the
        model does not scale), the factor of its training step
        (`tflm.backends.gradients.process_gradients`).

        T is the window's real length. The references (salesforce/awd-lstm-lm and
        zihangdai/mos `main.py`) scale by the length they drew, which is the real one except
        for the last window of an epoch, cut short by the end of the data (`get_batch`'s
        min(seq_len, len - 1 - i)): there they step with the drawn length's larger rate,
        on the few positions left, just before the epoch's validation. We use the real
        length, so every token of an epoch gets the same rate (the drawn length is not part
        of the data a step receives). Measured with main.py's own model and step
        (`bench/reproductions/last_window_step.py`, a reduced AWD-LSTM after 3 epochs): its
        rule raised the validation perplexity after that step by 11 / 20 / 32 % with 30 / 10
        / 3 positions left, ours moved it by -2 to -7 %. That is the difference between our
        early validation curves and main.py's (ours lower, main.py's wider spread:
        `bench/reproductions/results/reference_curves.md`); it also makes main.py's
        non-monotonic switch to averaging see noisier validations. Each preset that follows
        those scripts states it under "deviations"."""
        if not self.scale_by_window:
            return 1.0
        real = ops.sum(real_position_weights(x)) / _as_float(ops.shape(x)[0])
        return real / float(self.bptt)

    def update_lm_metrics(self, loss, nll_sum, tokens, grad_norm=None):
        # the totals' operands cast once (float64: `tflm.metrics.totals_dtype`), not once
        # per tracker
        dtype = self.nll_tracker.total_nll.dtype
        nll_cast, tokens_cast = ops.cast(nll_sum, dtype), ops.cast(tokens, dtype)
        self.loss_tracker.update_from_totals(loss * tokens, tokens_cast)
        self.nll_tracker.update_from_totals(nll_cast, tokens_cast)
        self.perplexity_tracker.update_from_totals(nll_cast, tokens_cast)
        logs = {"loss": self.loss_tracker.result(), "nll": self.nll_tracker.result(),
                "perplexity": self.perplexity_tracker.result()}
        if grad_norm is not None:
            self.grad_norm_tracker.update_state(grad_norm)
            logs["grad_norm"] = self.grad_norm_tracker.result()
        for name, variable in self.reported_variables():
            logs[name] = ops.convert_to_tensor(variable)
        if self.log_window_values:
            one = backends.current().constant(1.0, tokens)
            logs.update(window_loss=loss, window_nll=nll_sum / ops.maximum(tokens, one),
                        window_tokens=tokens)
        return backends.current().step_logs(self, logs)

    def reported_variables(self):
        """`(name, variable)` for each scalar a layer inside the model reports per step: a
        layer lists the names of its non-trainable scalar variables in `reported_variables`
        (`tflm.layers.NeuralODELogits`: "nfe", its last solve's number of evaluations). The
        logs carry the value after the step's forward pass."""
        return [(name, getattr(layer, name)) for layer in nested_layers(self)
                if layer is not self for name in getattr(layer, "reported_variables", ())
                if isinstance(getattr(layer, name, None), keras.Variable)]

    def parameter_count(self):
        """The model's parameters as papers count them: every weight, trained or frozen,
        except bookkeeping: a `CandidateSampler`'s proposal (2 V non-trainable values) and
        the counters layers report (`reported_variables`, e.g. NeuralODELogits' `nfe`).
        `count_params()` counts those too."""
        skip = {id(v) for layer in nested_layers(self) if isinstance(layer, CandidateSampler)
                for v in layer.weights}
        skip |= {id(v) for _, v in self.reported_variables()}
        return _size(v for v in self.weights if id(v) not in skip)

    def trainable_parameter_count(self):
        """The weights training updates (`trainable_weights`): `parameter_count()` less the
        frozen ones, e.g. a frozen PLIF's slopes (Parthiban 2020 Table 5.16 counts these)."""
        return _size(self.trainable_weights)

    @property
    def metrics(self):
        return [self.loss_tracker, self.nll_tracker, self.perplexity_tracker,
                self.grad_norm_tracker]

    def get_metrics_result(self):
        """The pass's results from the metrics' totals, under the keys the steps log.

        Keras ends a pass (fit's epoch logs, evaluate's return, validation) with these when
        their keys equal the last step's logs, else with that step's logs. Under
        MirroredStrategy a step's logs are each replica's own results averaged over the
        replicas: the mean of the replicas' perplexities, 0.5-2.6 % above exp(NLL / tokens)
        of the whole pass (Jensen; bench/training/results/scaling.md). Here the NLL and token totals
        are summed over replicas first. `grad_norm` is included once a train step has
        updated it in this pass, the layers' `reported_variables` always (their values after
        the last step); with `log_window_values` the keys differ and Keras keeps the last
        step's logs.
        """
        results = {m.name: m.result()
                   for m in (self.loss_tracker, self.nll_tracker, self.perplexity_tracker)}
        if float(ops.convert_to_numpy(self.grad_norm_tracker.count)) > 0:
            results["grad_norm"] = self.grad_norm_tracker.result()
        for name, variable in self.reported_variables():
            results[name] = ops.convert_to_tensor(variable)
        return results

    def compile(self, optimizer="sgd", loss=None, **kwargs):
        if loss is not None:
            raise ValueError(
                f"{type(self).__name__} computes its own loss (NLL of the log-probabilities "
                f"it returns, plus model.losses); compile it without `loss` (got {loss!r}).")
        super().compile(optimizer=optimizer, **kwargs)

    def compile_from_config(self, config):
        config = keras.saving.deserialize_keras_object(config)
        config.pop("loss", None)
        self.compile(**config)
        if self.built and self.optimizer is not None:
            self.optimizer.build(self.trainable_variables)

    def train_step(self, *args):
        # TensorFlow / PyTorch: train_step(data); JAX: train_step(state, data), stateless.
        self.traced_steps["train"] += 1
        return backends.current().train_step(self, *args)

    def test_step(self, *args):
        self.traced_steps["test"] += 1
        return backends.current().test_step(self, *args)

    # XLA for evaluation where the backend would not use it (TensorFlow on a CPU): see
    # `tflm.backends.tensorflow_backend.TensorFlowBackend.make_test_function`.
    xla_evaluation = False

    def make_test_function(self, force=False):
        return backends.current().make_test_function(self, super().make_test_function, force)

    # Where each window length compiles a program of its own (JAX), run a window at a
    # longer length compiled already while padding it costs less than compiling it would
    # (`tflm.backends.compiled_lengths`; the model masks the `PAD_ID` positions out).
    pad_to_compiled_lengths = False
    # With it, the one length every training window no longer than this runs at (longer
    # ones at their own; None: the ski-rental rule):
    # `tflm.backends.compiled_lengths.CompiledLengths(shortest)`.
    shortest_compiled_length = None

    def make_train_function(self, force=False):
        return backends.current().make_train_function(self, super().make_train_function,
                                                      force)

    # ---- passes over a split start from zero state --------------------------------------
    @contextlib.contextmanager
    def _pass(self, training, data, batch_size=None, carry=True):
        """Prepare the carried state for a pass over `data`; yields the data to pass on (a
        generator whose first batch was read to learn the batch size comes back whole).
        `carry`: the pass's batches are consecutive windows (the state goes from one to the
        next); else every batch starts from zero state."""
        data = self._prepare_pass(training, data, batch_size)
        self._passes_running += 1
        with self._carrying_state(carry):
            try:
                yield data
            finally:
                self._passes_running -= 1

    @contextlib.contextmanager
    def _carrying_state(self, carry=True):
        self._carrying += int(carry)
        try:
            yield
        finally:
            self._carrying -= int(carry)

    def _predict_mode(self, stream):
        """The predict function is traced with or without carrying; retrace on a change."""
        if self._predict_streams is not None and self._predict_streams != stream:
            self.make_predict_function(force=True)
        self._predict_streams = stream

    def _prepare_pass(self, training, data, batch_size=None):
        backend = backends.current()
        nested = self._passes_running > 0  # e.g. validation inside fit: never peek again
        size, data = batch_size_of(data, batch_size,
                                   peek=backend.requires_batch_size and not nested)
        backend.prepare_pass(self, training, size, nested=nested)
        return data

    def fit(self, x=None, y=None, batch_size=None, *args, callbacks=None,
            validation_data=None, **kwargs):
        kwargs.setdefault("shuffle", False)  # windows must stay in stream order
        callbacks = list(callbacks or [])
        if not any(isinstance(c, ResetTrainingStreams) for c in callbacks):
            callbacks.append(ResetTrainingStreams())
        if validation_data is not None and self._passes_running == 0:
            # Size the evaluation state now: JAX must not add variables inside fit.
            val_batch = kwargs.get("validation_batch_size") or batch_size
            if isinstance(validation_data, (tuple, list)):
                validation_data = (self._prepare_pass(False, validation_data[0], val_batch),
                                   *validation_data[1:])
            else:
                validation_data = self._prepare_pass(False, validation_data, val_batch)
        with self._pass(True, x, batch_size) as x:
            return super().fit(x, y, batch_size, *args, callbacks=callbacks,
                               validation_data=validation_data, **kwargs)

    def evaluate(self, x=None, y=None, batch_size=None, *args, **kwargs):
        with self._pass(False, x, batch_size) as x:
            self.reset_stream_states("eval")
            return super().evaluate(x, y, batch_size, *args, **kwargs)

    def predict(self, x, batch_size=None, *args, stream=False, **kwargs):
        """Keras' `predict`; every batch from zero state, or with `stream=True` the state
        carried across the batches (consecutive windows of the same streams)."""
        with self._pass(False, x, batch_size, carry=stream) as x:
            self.reset_stream_states("eval")
            self._predict_mode(bool(stream))
            return super().predict(x, batch_size, *args, **kwargs)

    def train_on_batch(self, x, *args, **kwargs):
        backends.current().prepare_pass(self, True, leading_dim(x))
        with self._carrying_state():
            return super().train_on_batch(x, *args, **kwargs)

    def test_on_batch(self, x, *args, **kwargs):
        backends.current().prepare_pass(self, False, leading_dim(x))
        with self._carrying_state():
            return super().test_on_batch(x, *args, **kwargs)

    def predict_on_batch(self, x):
        """Keras' `predict_on_batch`, from zero state (the rows of `x` are independent)."""
        self._predict_mode(False)
        return super().predict_on_batch(x)

    @contextlib.contextmanager
    def streaming_predictions(self, batch_size):
        """Within this block, yields `predict(window)`: Keras' compiled `predict_on_batch`
        with the inference state carried from one window to the next (the `batch_size`
        streams start from zero). What `generate` feeds its windows to."""
        backends.current().prepare_pass(self, False, int(batch_size))
        self.reset_stream_states("eval")
        self._predict_mode(True)
        with self._carrying_state():
            yield super().predict_on_batch

    # ---- generation, the KerasHub way ----------------------------------------------------
    def generate(self, inputs, max_length, sampler=None, seed=None, stop_token_ids=None,
                 strip_prompt=False, vocabulary=None):
        """Continue the prompts `inputs` (strings, or token ids) to `max_length` tokens with
        `sampler` ("greedy", "random", "top_k", "top_p" or a `tflm.samplers.Sampler`;
        None: "random"), the LSTM state as the cache, a compiled step per window, the draw
        seeded on the host (the same words on every backend). See `tflm.generation`."""
        return generation.generate(self, inputs, max_length, sampler, seed, stop_token_ids,
                                   strip_prompt, vocabulary)

    def score(self, token_ids, padding_mask=None, scoring_mode="logits", target_ids=None):
        """KerasHub's `score`: log-probabilities (B, T, V) of `token_ids` from zero state,
        or with `scoring_mode="loss"` the per-token NLL of `target_ids`. See
        `tflm.generation.score`."""
        return generation.score(self, token_ids, padding_mask, scoring_mode, target_ids)

    def get_config(self):
        config = super().get_config()
        config.update(bptt=self.bptt, clip_norm=self.clip_norm, weight_decay=self.weight_decay,
                      scale_by_window=self.scale_by_window, carry_state=self.carry_state,
                      flooding_level=self.flooding_level, loss_reduction=self.loss_reduction)
        return config


def _as_float(size):
    """A dimension as a divisor: a Python number as it is (dividing by it keeps it on the
    host), a dynamic size (TensorFlow) cast to float32."""
    return float(size) if isinstance(size, int) else ops.cast(size, "float32")


def _size(variables):
    """The number of values in `variables`."""
    total = 0
    for v in variables:
        size = 1
        for dim in v.shape:
            size *= int(dim)
        total += size
    return total
