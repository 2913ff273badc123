"""`LanguageModel`: a `keras.Model` that trains and evaluates over BPTT windows."""

import contextlib

import keras
from keras import ops

from tflm.backends.stream_state import make_stream_state
from tflm.backends.train_step import lm_train_step
from tflm.losses import token_nll
from tflm.metrics import Perplexity, TokenMeanNLL
from tflm.padding import real_position_weights


class ResetTrainingStreams(keras.callbacks.Callback):
    """Zero the training streams' state at the start of every epoch (a new pass)."""

    def on_epoch_begin(self, epoch, logs=None):
        self.model.reset_stream_states("train")


class LanguageModel(keras.Model):
    """Base class of recurrent language models trained on contiguous streams.

    A subclass defines `state_sizes()` (hidden size of each recurrent layer) and
    `forward_with_state(tokens, states, training) -> (log_probs, new_states)`, a pure
    function of its inputs (not named `forward`: that is torch.nn.Module's call hook).
    This class adds what `model.fit` / `evaluate` / `predict` need:

    - the LSTM state of every stream is carried from one window to the next (per replica),
      without gradient across windows, separately for training and for inference; it is
      zeroed at the start of every epoch and of every `evaluate` / `predict` (DESIGN
      contract 3; no `stateful=True`). On JAX the jitted steps are stateless, so the state
      lives in non-trainable variables of the batch's shape (not weights, not saved), made
      when fit / evaluate / predict start; each distinct window length compiles the step
      once, so pad the windows (`lm_dataset(..., pad_to_multiple=4)`): input positions
      holding `tflm.data.PAD_ID` carry no loss, do not move the state and do not count in
      T (`tflm.padding`);
    - the train step (see `tflm.backends.train_step`): loss = token-mean NLL +
      `sum(model.losses)`, global-norm clipping at `clip_norm`, L2 `weight_decay`, gradient
      scaled by window length / `bptt` (the reference's per-window learning rate);
    - metrics over the whole pass: `loss` and `nll` token-weighted means, `perplexity` =
      exp(total NLL / total tokens), and the last step's gradient norm.

    Args:
        bptt: nominal window length for the learning-rate scaling. Default 70.
        clip_norm: global gradient-norm clip (None or 0 disables). Default 0.25.
        weight_decay: L2 coefficient added to the clipped gradient (torch SGD style; the
            reference uses 1.2e-6). Default 0.
        scale_by_window: scale each step by T / bptt. Default True.
        carry_state: carry LSTM state across windows. Default True.
        flooding_level: flood level b (Ishida et al. 2020): train on |L - b| + b; None
            disables. Default None.

    Compile with an optimizer only: `model.compile(optimizer=keras.optimizers.SGD(30))`;
    the loss is the NLL of the log-probabilities the model returns.
    """

    def __init__(self, bptt=70, clip_norm=0.25, weight_decay=0.0, scale_by_window=True,
                 carry_state=True, flooding_level=None, **kwargs):
        super().__init__(**kwargs)
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
        self._streams = None
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
    def _stream_store(self, training):
        if self._streams is None:
            self._streams = {"train": make_stream_state(self.state_sizes()),
                             "eval": make_stream_state(self.state_sizes())}
        return self._streams["train" if training else "eval"]

    def create_stream_states(self):
        """Create the state stores now (call under `strategy.scope()` when distributed)."""
        self._stream_store(True)

    def reset_stream_states(self, which="all"):
        """Zero the carried state: "train", "eval" or "all"."""
        if self._streams is None:
            return
        for name in (("train", "eval") if which == "all" else (which,)):
            self._streams[name].reset()

    # ---- JAX: the carried state is non-trainable variables of a fixed batch shape ------
    @property
    def variables(self):
        variables = super().variables
        if self._streams is not None and keras.backend.backend() == "jax":
            for name in ("train", "eval"):
                variables = variables + self._streams[name].variables()
        return variables

    def _ensure_jax_streams(self, training, batch_size):
        """Create the JAX state variables for `batch_size` streams (outside jit)."""
        if keras.backend.backend() != "jax" or not self.carry_state or batch_size is None:
            return
        if getattr(self, "_jax_state", None) and not getattr(self, "_jax_state_synced", True):
            return  # a training loop holds the live state; the variable list must not change
        self._stream_store(training).ensure(int(batch_size))

    def _prepare_tf_streams(self, training, batch_size):
        """TensorFlow: build the model and create the stores before the step is traced
        (variables made inside the first trace make tf.function trace it twice) and size
        them for `batch_size` global rows outside any compiled step (XLA cannot resize a
        variable)."""
        if keras.backend.backend() != "tensorflow":
            return
        strategy = self._distribute_strategy
        with (strategy.scope() if strategy is not None else contextlib.nullcontext()):
            if not self.built and type(self).build is not keras.Model.build:
                self.build((None, None))  # a subclass that builds itself from token shape
            if not self.carry_state:
                return
            store = self._stream_store(training)
        replicas = 1 if strategy is None else strategy.num_replicas_in_sync
        if batch_size is not None and batch_size % replicas == 0:
            store.ensure(batch_size // replicas)

    def _symbolic_build(self, iterator=None, data_batch=None):
        # JAX fit / evaluate / train_on_batch / test_on_batch pass here with the data before
        # the jitted step fetches the variable state: make the stream variables now.
        mode = getattr(self, "_jax_stream_mode", None)
        if keras.backend.backend() == "jax" and self.carry_state and mode is not None:
            if data_batch is None and iterator is not None:
                for _, _, data_or_iterator in iterator:
                    if isinstance(data_or_iterator, (list, tuple)):
                        data_batch = data_or_iterator[0]
                    else:
                        data_batch = next(data_or_iterator)
                    break
            if data_batch is not None:
                from keras.src.trainers.data_adapters import data_adapter_utils
                x, _, _ = data_adapter_utils.unpack_x_y_sample_weight(data_batch)
                self._ensure_jax_streams(mode == "train", _leading_dim(x))
        return super()._symbolic_build(iterator=iterator, data_batch=data_batch)

    def call(self, tokens, training=False):
        if not self.carry_state:
            log_probs, _ = self.forward_with_state(tokens, None, training=training)
            return log_probs
        store = self._stream_store(training)
        states = store.read(ops.shape(tokens)[0], self.compute_dtype)
        log_probs, new_states = self.forward_with_state(tokens, states, training=training)
        store.write(new_states)
        return log_probs

    # ---- loss and metrics --------------------------------------------------------------
    def compute_lm_loss(self, y, log_probs, sample_weight=None, extra_losses=None,
                        inputs=None):
        """(loss, NLL sum, token count) for one window; loss adds `self.losses` (or
        `extra_losses` when given: the losses a stateless JAX call collected). With the
        window's `inputs`, padded positions (`tflm.data.PAD_ID`) carry no weight."""
        nll = token_nll(y, log_probs)
        if inputs is None:
            weights = ops.ones_like(nll)
        else:
            weights = real_position_weights(inputs)
        if sample_weight is not None:
            weights = ops.cast(sample_weight, "float32") * weights
        nll_sum = ops.sum(nll * weights)
        tokens = ops.sum(weights)
        loss = nll_sum / ops.maximum(tokens, 1.0)
        extra = self.losses if extra_losses is None else list(extra_losses)
        if extra:
            loss = loss + ops.sum(ops.stack([ops.cast(l, "float32") for l in extra]))
        return loss, nll_sum, tokens

    def update_lm_metrics(self, loss, nll_sum, tokens, grad_norm=None):
        self.loss_tracker.update_from_totals(loss * tokens, tokens)
        self.nll_tracker.update_from_totals(nll_sum, tokens)
        self.perplexity_tracker.update_from_totals(nll_sum, tokens)
        logs = {"loss": self.loss_tracker.result(), "nll": self.nll_tracker.result(),
                "perplexity": self.perplexity_tracker.result()}
        if grad_norm is not None:
            self.grad_norm_tracker.update_state(grad_norm)
            logs["grad_norm"] = self.grad_norm_tracker.result()
        if self._multi_worker():
            # Keras reduces per-step logs with reduce(MEAN, axis=0) across workers, which
            # needs at least one dimension; the epoch logs come from the metrics themselves.
            logs = {k: ops.reshape(v, (1,)) for k, v in logs.items()}
        return logs

    def _multi_worker(self):
        strategy = getattr(self, "_distribute_strategy", None)
        if strategy is None or keras.backend.backend() != "tensorflow":
            return False
        import tensorflow as tf
        return (isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)
                and strategy.extended._in_multi_worker_mode())

    @property
    def metrics(self):
        return [self.loss_tracker, self.nll_tracker, self.perplexity_tracker,
                self.grad_norm_tracker]

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
        return lm_train_step(self, *args)

    def test_step(self, *args):
        if keras.backend.backend() == "jax":
            from tflm.backends.jax_step import jax_test_step
            return jax_test_step(self, *args)
        (data,) = args
        from keras.src.trainers.data_adapters import data_adapter_utils
        x, y, sample_weight = data_adapter_utils.unpack_x_y_sample_weight(data)
        log_probs = self(x, training=False)
        loss, nll_sum, tokens = self.compute_lm_loss(y, log_probs, sample_weight, inputs=x)
        logs = self.update_lm_metrics(loss, nll_sum, tokens)
        return logs

    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        # Keras (TF trainer) builds a distributed model by all-reducing a sample batch across
        # replicas, which fails for integer token windows under MultiWorkerMirroredStrategy.
        # A language model builds itself from a dummy window instead; then only the optimizer
        # is left to build, under the strategy's scope.
        if keras.backend.backend() != "tensorflow" or self._distribute_strategy is None:
            return super()._maybe_symbolic_build(iterator=iterator, data_batch=data_batch)
        with self.distribute_strategy.scope():
            if not self.built:
                self.build()
            self._symbolic_build(data_batch=None)

    # ---- passes over a split start from zero state --------------------------------------
    def fit(self, *args, callbacks=None, **kwargs):
        kwargs.setdefault("shuffle", False)  # windows must stay in stream order
        callbacks = list(callbacks or [])
        if not any(isinstance(c, ResetTrainingStreams) for c in callbacks):
            callbacks.append(ResetTrainingStreams())
        self._prepare_tf_streams(True, _data_batch_size(args, kwargs))
        with self._jax_stream_scope("train"):
            return super().fit(*args, callbacks=callbacks, **kwargs)

    def evaluate(self, *args, **kwargs):
        self._prepare_tf_streams(False, _data_batch_size(args, kwargs))
        self.reset_stream_states("eval")
        with self._jax_stream_scope("eval"):
            return super().evaluate(*args, **kwargs)

    def predict(self, x, batch_size=None, *args, **kwargs):
        self._prepare_tf_streams(False, _predict_batch_size(x, batch_size))
        self.reset_stream_states("eval")
        if keras.backend.backend() == "jax":
            self._ensure_jax_streams(False, _predict_batch_size(x, batch_size))
        return super().predict(x, batch_size, *args, **kwargs)

    def train_on_batch(self, x, *args, **kwargs):
        self._prepare_tf_streams(True, _leading_dim(x))
        with self._jax_stream_scope("train"):
            return super().train_on_batch(x, *args, **kwargs)

    def test_on_batch(self, x, *args, **kwargs):
        self._prepare_tf_streams(False, _leading_dim(x))
        with self._jax_stream_scope("eval"):
            return super().test_on_batch(x, *args, **kwargs)

    def predict_on_batch(self, x):
        self._prepare_tf_streams(False, _leading_dim(x))
        if keras.backend.backend() == "jax":
            self._ensure_jax_streams(False, _leading_dim(x))
        return super().predict_on_batch(x)

    @contextlib.contextmanager
    def _jax_stream_scope(self, mode):
        """While fit / evaluate / *_on_batch runs, tell `_symbolic_build` which store."""
        previous = getattr(self, "_jax_stream_mode", None)
        self._jax_stream_mode = mode
        try:
            yield
        finally:
            self._jax_stream_mode = previous

    def get_config(self):
        config = super().get_config()
        config.update(bptt=self.bptt, clip_norm=self.clip_norm, weight_decay=self.weight_decay,
                      scale_by_window=self.scale_by_window, carry_state=self.carry_state,
                      flooding_level=self.flooding_level)
        return config


def _leading_dim(x):
    """The static batch size of the first input tensor, or None."""
    from keras import tree
    for item in tree.flatten(x):
        shape = getattr(item, "shape", None)
        if shape is not None and len(shape) and shape[0] is not None:
            return int(shape[0])
    return None


def _data_batch_size(args, kwargs):
    """Rows per batch of fit / evaluate's `x` (positional or keyword), or None."""
    x = args[0] if args else kwargs.get("x")
    batch_size = args[2] if len(args) > 2 else kwargs.get("batch_size")
    if x is None or type(x).__name__.startswith("Distributed"):
        return None  # distributed datasets: per-replica rows are the strategy's business
    try:
        return _predict_batch_size(x, batch_size)
    except (TypeError, ValueError, AttributeError):
        return None


def _predict_batch_size(x, batch_size):
    """Batch size `predict` will use: arrays are cut in `batch_size` (32) rows, a
    tf.data.Dataset gives its element spec; None when unknown."""
    spec = getattr(x, "element_spec", None)
    if spec is not None:
        return _leading_dim(spec)
    n = _leading_dim(x)
    if n is None:
        return None
    return min(n, int(batch_size or 32))
