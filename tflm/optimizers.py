"""SGD with per-variable learning-rate multipliers, and averaged SGD (NT-ASGD / ET-ASGD).

`AveragedSGD` is plain SGD that, once averaging has started, also keeps the running mean of
its iterates in one extra copy of the weights. Averaging is started by the trigger callbacks
of `tflm.triggers` (`NonMonotonicTrigger`, `EpochTrigger`) or by hand; the averaged weights
are swapped in for validation and saving with `averaged_weights(model)`.

Which iterates enter the average (the exact semantics of `torch.optim.ASGD(lr, t0=0,
lambd=0.)` that salesforce/awd-lstm-lm creates at the switch): number the SGD steps taken
after averaging started k = 1, 2, ... and call theta_k the weights right after step k. The
average after step k is

    avg_1 = theta_1
    avg_k = mean(theta_2, ..., theta_k)            for k >= 2

computed as avg_k = avg_{k-1} + mu_k (theta_k - avg_{k-1}) with mu_k = 1 / max(1, k - 1)
(mu_1 = mu_2 = 1 copy the iterate; mu_3 = 1/2, mu_4 = 1/3, ...). This is torch's recursion:
its `mu` for step k is computed at the end of step k - 1 as 1 / max(1, (k - 1) - t0), so with
t0 = 0 the first averaged iterate is overwritten at the second step and the mean runs over
theta_2..theta_k. `AveragedSGD` reproduces it: `average_count` holds k, and avg_k is
`mean(theta_2..theta_k)` (k - 1 iterates) once k >= 2. (mu is computed as 1/(k - 1) in the
variable's dtype; torch rounds a double to float32, which can differ in the last bit.)

The gradient g of every step is whatever the train step hands to `apply`; in
`LanguageModel` that is the clipped gradient plus the L2 term, times the window's factor:
T / bptt while plain SGD runs (the reference's per-window learning rate), and once
averaging runs the factor torch.optim.ASGD really applies, T(k-1) / bptt, one window late
(`AveragedSGD.lagged_window_scale`), with its `weight_decay` inside the same factor.
"""

import contextlib
import math

import keras
from keras import ops

from tflm import backends, compat


def _as_float_lr(learning_rate):
    """Keras wants a Python float (or a schedule/callable); accept ints such as 30."""
    if isinstance(learning_rate, bool):
        raise ValueError(f"learning_rate must be a number; got {learning_rate!r}.")
    if isinstance(learning_rate, int):
        learning_rate = float(learning_rate)
    if isinstance(learning_rate, float):
        if not math.isfinite(learning_rate) or learning_rate < 0:
            raise ValueError(f"learning_rate must be a finite number >= 0; got {learning_rate}.")
    return learning_rate


def _check_multipliers(multipliers):
    if multipliers is None:
        return {}
    if not isinstance(multipliers, dict):
        raise ValueError("learning_rate_multipliers must be a dict {variable path or "
                         f"substring: multiplier}}; got {multipliers!r}.")
    out = {}
    for key, value in multipliers.items():
        if not isinstance(key, str) or not key:
            raise ValueError(f"learning_rate_multipliers keys must be non-empty strings "
                             f"(variable paths or substrings); got {key!r}.")
        try:
            value = float(value)
        except (TypeError, ValueError):
            value = float("nan")
        if not math.isfinite(value) or value < 0:
            raise ValueError(f"learning_rate_multipliers[{key!r}] must be a finite number "
                             f">= 0; got {multipliers[key]!r}.")
        out[key] = value
    return out


def _copy_of(variable):
    """A fresh tensor holding `variable`'s value. Assigning a variable's own tensor to
    another would make both share one buffer on JAX, and a jitted step given both (Keras
    donates the weights and the optimizer's variables) fails: "donate the same buffer
    twice"."""
    return ops.copy(ops.convert_to_tensor(variable))


def _blend(variable, old, k):
    """The running average after k averaged steps, with the new iterate theta:
    old + (theta - old) / max(k, 1), and theta itself while k <= 1 (torch.optim.ASGD
    copies when mu = 1)."""
    theta = ops.convert_to_tensor(variable)
    one = ops.cast(1.0, variable.dtype)
    mu = ops.divide(one, ops.maximum(ops.cast(k, variable.dtype), one))
    blended = ops.add(old, ops.multiply(ops.subtract(theta, old), mu))
    return ops.where(ops.less_equal(k, 1), theta, blended)


class _Untracked:
    """A list kept out of the optimizer's variable tracking (a list attribute of model
    variables would add them to `optimizer.variables`)."""

    def __init__(self, items):
        self.items = list(items)


def _variable_path(variable):
    return getattr(variable, "path", None) or str(variable.name)


def resolve_multipliers(multipliers, variables):
    """The multiplier of each variable: an exact path match wins, else the substring keys
    contained in the path (they must agree), else 1.0. A key matching no variable is an
    error (it is almost always a typo)."""
    paths = [_variable_path(v) for v in variables]
    out = []
    for path in paths:
        if path in multipliers:
            out.append(multipliers[path])
            continue
        hits = [k for k in multipliers if k in path]
        values = {multipliers[k] for k in hits}
        if len(values) > 1:
            raise ValueError(
                f"variable {path!r} matches learning_rate_multipliers keys "
                f"{sorted(hits)} with different multipliers; use its full path as the key.")
        out.append(values.pop() if values else 1.0)
    unused = [k for k in multipliers if not any(k in path for path in paths)]
    if unused:
        shown = ", ".join(paths[:12]) + (", ..." if len(paths) > 12 else "")
        raise ValueError(f"learning_rate_multipliers key(s) {unused} match no trainable "
                         f"variable; the variable paths are: {shown}.")
    return out


@keras.saving.register_keras_serializable(package="tflm")
class SGD(compat.WholeUpdateStep, keras.optimizers.Optimizer):
    """Plain SGD with optional per-variable learning-rate multipliers.

        theta <- theta - learning_rate * m(theta) * g

    where m is 1 unless `learning_rate_multipliers` names the variable. With no multipliers
    the update is bit-for-bit `keras.optimizers.SGD` (no momentum). Weight decay and
    gradient clipping of the language models are done by their train step.

    Args:
        learning_rate: float, schedule or callable. Default 30.0 (AWD-LSTM on WikiText-2).
        learning_rate_multipliers: dict {variable path or substring of it: multiplier},
            e.g. `{"pre_slopes": 0.02 / 30}` gives `PLIFLayer`'s slopes a learning rate of
            0.02 while the rest of the model uses 30 (the reference optimizes them in their
            own parameter group). Paths are `variable.path` ("awdlstm/plif/pre_slopes").
            An exact path match wins over substrings; a key that matches
            no variable raises when the optimizer is built. Default None.
        name: optimizer name. Other keyword arguments go to `keras.optimizers.Optimizer`.

    Example:

    >>> opt = SGD(20.0, learning_rate_multipliers={"pre_slopes": 0.02 / 20})
    >>> model.compile(optimizer=opt)
    """

    def __init__(self, learning_rate=30.0, learning_rate_multipliers=None, name=None,
                 **kwargs):
        super().__init__(learning_rate=_as_float_lr(learning_rate), name=name, **kwargs)
        self.learning_rate_multipliers = _check_multipliers(learning_rate_multipliers)
        self._multipliers = []
        self._built_on = _Untracked([])

    def build(self, variables):
        if self.built:
            return
        super().build(variables)
        self._built_on = _Untracked(variables)
        self._multipliers = resolve_multipliers(self.learning_rate_multipliers, variables)

    def multiplier_of(self, variable):
        """The learning-rate multiplier the built optimizer uses for `variable`."""
        return self._multipliers[compat.optimizer_variable_index(self, variable)]

    def _sgd_step(self, gradient, variable, learning_rate):
        learning_rate = ops.cast(learning_rate, variable.dtype)
        multiplier = self._multipliers[compat.optimizer_variable_index(self, variable)]
        if multiplier != 1.0:
            learning_rate = ops.multiply(learning_rate, ops.cast(multiplier, variable.dtype))
        gradient = ops.cast(gradient, variable.dtype)
        self.assign_sub(variable, ops.multiply(gradient, learning_rate))

    def update_step(self, gradient, variable, learning_rate):
        self._sgd_step(gradient, variable, learning_rate)

    def _steps_are_plain_sgd(self):
        """Whether this step's `update_step`s would only be `_sgd_step`s."""
        return (type(self).update_step is SGD.update_step
                and type(self)._sgd_step is SGD._sgd_step)

    def update_variables(self, grads, variables, learning_rate):
        """Every variable's `_sgd_step` at once, a group per multiplier, where the backend
        updates lists of variables together (`Backend.updates_together`: PyTorch); the
        same arithmetic, so the same bits. False (Keras' loop of `update_step`) elsewhere."""
        pairs = [(g, v) for g, v in zip(grads, variables) if g is not None]
        backend = backends.current()
        if not self._steps_are_plain_sgd() or not backend.updates_together(
                [v for _, v in pairs], [g for g, _ in pairs]):
            return False
        groups = {}
        for gradient, variable in pairs:
            multiplier = self._multipliers[compat.optimizer_variable_index(self, variable)]
            group = groups.setdefault(multiplier, ([], []))
            group[0].append(variable)
            group[1].append(gradient)
        rate = ops.cast(learning_rate, "float32")
        for multiplier, (group, gradients) in groups.items():
            scaled = rate if multiplier == 1.0 else ops.multiply(
                rate, ops.cast(multiplier, "float32"))
            backend.subtract_scaled(group, gradients, scaled)
        return True

    def get_config(self):
        config = super().get_config()
        config["learning_rate_multipliers"] = dict(self.learning_rate_multipliers)
        return config


@keras.saving.register_keras_serializable(package="tflm")
class AveragedSGD(SGD):
    """Averaged SGD: SGD whose iterates are averaged once averaging has started.

    Until averaging starts this is exactly `SGD` (the weights follow the same bits). From
    then on, after every step k = 1, 2, ... (theta_k = the weights after step k):

        theta_k = theta_{k-1} - lr * m * g_k
        avg_k   = theta_k                                   k <= 2
        avg_k   = avg_{k-1} + (theta_k - avg_{k-1}) / (k - 1)    k >= 3
                = mean(theta_2, ..., theta_k)

    which is `torch.optim.ASGD(lr, t0=0, lambd=0.)`, the optimizer salesforce/awd-lstm-lm
    switches to (see the module docstring for why theta_1 drops out). The model keeps
    training on the raw iterates theta; the average is a separate copy of the weights (one
    optimizer variable per trainable variable, plus two scalar counters; nothing grows with
    the number of steps). Swap it in for evaluation and saving with `averaged_weights(model)`.

    Averaging starts at step `start_averaging` (the step taken when `optimizer.iterations`
    equals it is averaged step k = 1), or when `start_averaging_now()` is called (the next
    step is k = 1), which is what the triggers in `tflm.triggers` do. `restart_averaging()`
    drops the average and starts a new one (finetuning).

    Args:
        learning_rate: float, schedule or callable. Default 30.0.
        start_averaging: iteration at which averaging starts, or None (not yet; a trigger
            or `start_averaging_now()` starts it). Default None.
        learning_rate_multipliers: see `SGD`. Default None.
        name: optimizer name. Other keyword arguments go to `keras.optimizers.Optimizer`
            (`gradient_accumulation_steps` is not supported).

    Example:

    >>> from tflm.triggers import NonMonotonicTrigger
    >>> model.compile(optimizer=AveragedSGD(30.0))
    >>> model.fit(train, validation_data=valid, epochs=500,
    ...           callbacks=[NonMonotonicTrigger(patience=5)])
    >>> with averaged_weights(model):
    ...     model.evaluate(test)

    Reference: Polyak & Juditsky 1992, "Acceleration of stochastic approximation by
    averaging"; Merity, Keskar & Socher 2018, "Regularizing and Optimizing LSTM Language
    Models" §3 (NT-ASGD); Parthiban 2020 thesis §4.3.2.2 (ET-ASGD).
    """

    def __init__(self, learning_rate=30.0, start_averaging=None,
                 learning_rate_multipliers=None, name=None, **kwargs):
        if kwargs.get("gradient_accumulation_steps"):
            raise ValueError("AveragedSGD averages the iterate of every optimizer step and "
                             "does not support gradient_accumulation_steps="
                             f"{kwargs['gradient_accumulation_steps']!r}; accumulate in the "
                             "data pipeline (a larger batch) instead.")
        super().__init__(learning_rate=learning_rate,
                         learning_rate_multipliers=learning_rate_multipliers, name=name,
                         **kwargs)
        if start_averaging is not None and (
                isinstance(start_averaging, bool) or not isinstance(start_averaging, (int, float))
                or int(start_averaging) != start_averaging or int(start_averaging) < 0):
            raise ValueError("start_averaging must be None or an iteration number >= 0; "
                             f"got {start_averaging!r}.")
        start = -1 if start_averaging is None else int(start_averaging)
        self._averaging_start = self.add_variable(
            shape=(), dtype=self.iterations.dtype, name="averaging_start",
            initializer=keras.initializers.Constant(start), aggregation="only_first_replica")
        self._average_count = self.add_variable(
            shape=(), dtype=self.iterations.dtype, name="average_count",
            initializer="zeros", aggregation="only_first_replica")
        self._previous_window_scale = self.add_variable(
            shape=(), dtype="float32", name="previous_window_scale", initializer="ones",
            aggregation="only_first_replica")
        self._averages = []
        self._average_loaded = False
        self._averaging_known = None  # eager steps: whether this one is averaged
        self._deferred_averages = None

    # ---- graph-side state --------------------------------------------------------------
    def build(self, variables):
        if self.built:
            return
        super().build(variables)
        self._averages = self.add_optimizer_variables(variables, "asgd_average")

    def _averaging_active(self):
        start = ops.convert_to_tensor(self._averaging_start)
        return ops.logical_and(ops.greater_equal(start, backends.current().constant(0, start)),
                               ops.greater_equal(ops.convert_to_tensor(self.iterations), start))

    def update_step(self, gradient, variable, learning_rate):
        self._sgd_step(gradient, variable, learning_rate)
        average = self._averages[compat.optimizer_variable_index(self, variable)]
        if average is None or self._averaging_known is False:
            return
        if self._deferred_averages is not None:  # averaged in `apply`, all under one cond
            self._deferred_averages.append((variable, average))
            return
        k = ops.convert_to_tensor(self._average_count)  # averaged steps before this one
        old = ops.convert_to_tensor(average)
        if self._averaging_known:  # an eager step known to be averaged: no `cond` to read
            self.assign(average, _blend(variable, old, k))
            return
        # A traced step (TensorFlow graph, JAX) holds both branches but runs one: before
        # averaging starts the average is not recomputed (it was, and discarded, in every
        # SGD-phase step: ~5 % of a step of the 200 / 400 x 3 PTB model).
        self.assign(average, ops.cond(self._averaging_active(),
                                      lambda: _blend(variable, old, k), lambda: old))

    def _steps_are_plain_sgd(self):
        """Only SGD steps this time: an eager step that knows averaging is off."""
        return (self._averaging_known is False
                and type(self).update_step is AveragedSGD.update_step
                and type(self)._sgd_step is SGD._sgd_step)

    def _average_deferred(self, pending, active):
        """The averages of the variables `update_step` deferred, under one `cond` on
        `active`, where the backend says so (`Backend.averages_under_one_cond`); without the
        `cond` where an eager step knows it is averaged."""
        k = ops.convert_to_tensor(self._average_count)
        olds = [ops.convert_to_tensor(average) for _, average in pending]
        def blended():
            return [_blend(variable, old, k) for (variable, _), old in zip(pending, olds)]

        new = blended() if self._averaging_known else ops.cond(active, blended, lambda: olds)
        for (_, average), value in zip(pending, new):
            self.assign(average, value)

    def lagged_window_scale(self, window_scale):
        """The step-size factor torch.optim.ASGD gives this window: T(k-1) / bptt.

        The references set the group's lr to lr * T(k) / bptt before `optimizer.step()` and
        restore it after; SGD uses it at once, but ASGD steps with the eta it stored at the
        end of the previous step (eta = that step's group lr, lambd = 0), and a fresh ASGD
        stores the first step's own lr. So averaged step k = 1 is scaled by T(1) / bptt and
        step k >= 2 by T(k-1) / bptt. Called by the train step with T(k) / bptt (before
        `apply`); returns the factor to use and remembers T(k) / bptt."""
        scale = ops.cast(window_scale, "float32")
        count = ops.convert_to_tensor(self._average_count)
        lag = ops.logical_and(self._averaging_active(), ops.greater_equal(
            count, backends.current().constant(1, count)))
        out = ops.where(lag, ops.convert_to_tensor(self._previous_window_scale), scale)
        self._previous_window_scale.assign(scale)
        return out

    def apply(self, grads, trainable_variables=None):
        if len(grads) == 0:
            return
        active = self._averaging_active()  # before `apply` increments the iteration count
        backend = backends.current()
        # Eager steps (PyTorch, eager TensorFlow) know whether this step is averaged: when it
        # is not, the averages are left alone entirely, as torch.optim.SGD before the switch;
        # when it is, each is blended without a `cond` on a device value. The same test as
        # `active`'s, on the host: PyTorch keeps the two counts there (`Backend.host_scalar`),
        # so a step reads neither back from the device.
        iteration = None
        if backend.is_concrete(active):
            start = backend.host_scalar(self._averaging_start)
            iteration = backend.host_scalar(self.iterations)
            self._averaging_known = start >= 0 and iteration >= start
        self._deferred_averages = [] if backend.averages_under_one_cond() else None
        try:
            super().apply(grads, trainable_variables)
            if iteration is not None:  # Keras' apply counted this step: one assign_add(1)
                backend.host_scalar_written(self.iterations, iteration + 1)
            if self._deferred_averages:
                self._average_deferred(self._deferred_averages, active)
        finally:
            self._averaging_known = None
            self._deferred_averages = None
        backend.assign_add(self._average_count, ops.cast(active, self._average_count.dtype))

    # ---- Python-side control -----------------------------------------------------------
    @property
    def start_iteration(self):
        """The iteration at which averaging starts(ed), or None."""
        start = int(ops.convert_to_numpy(self._averaging_start))
        return None if start < 0 else start

    @property
    def is_averaging(self):
        """True once the steps being taken enter the average."""
        start = self.start_iteration
        return start is not None and int(ops.convert_to_numpy(self.iterations)) >= start

    @property
    def average_count(self):
        """k: the number of averaged steps so far (the average holds max(1, k - 1) iterates)."""
        return int(ops.convert_to_numpy(self._average_count))

    @property
    def has_average(self):
        """True when there is an average to swap in (averaging on, at least one step)."""
        return self.is_averaging and self.average_count > 0

    @property
    def average_variables(self):
        """The averaged copies, aligned with the variables the optimizer was built on."""
        return list(self._averages)

    def _copy_weights_into_averages(self):
        for variable, average in zip(self._built_on.items, self._averages):
            if average is not None:
                average.assign(_copy_of(variable))

    def start_averaging_now(self):
        """Average from the next step on (k = 1 at the next step). No-op when averaging is
        already on. The averages are set to the current weights (so a variable that never
        receives a gradient averages to its constant value)."""
        if self.is_averaging:
            return
        self.restart_averaging()

    def restart_averaging(self):
        """Drop the current average and start a new one with the next step (finetuning)."""
        if self._average_loaded:
            raise RuntimeError("cannot restart averaging while the averaged weights are "
                               "loaded into the model; leave `averaged_weights` first.")
        self._averaging_start.assign(
            ops.copy(ops.cast(self.iterations, self._averaging_start.dtype)))
        self._average_count.assign(ops.zeros((), self._average_count.dtype))
        if self.built:
            self._copy_weights_into_averages()

    def stop_averaging(self):
        """Back to plain SGD (the average is kept but no longer updated or swapped in)."""
        self._averaging_start.assign(ops.cast(-1, self._averaging_start.dtype))

    def averaged_pairs(self, variables=None):
        """(model variable, its average) for `variables` (default: all it was built on)."""
        if not self.built:
            raise ValueError("the optimizer is not built yet (no training step taken); "
                             "call optimizer.build(model.trainable_variables) first.")
        if variables is None:
            pairs = zip(self._built_on.items, self._averages)
        else:
            pairs = [(v, self._averages[compat.optimizer_variable_index(self, v)])
                     for v in variables]
        return [(v, a) for v, a in pairs if a is not None]

    def swap_average_weights(self, variables=None):
        """Exchange the values of the model variables and their averages, in place.

        An involution: calling it twice restores both bit for bit, and it needs no memory
        beyond one variable at a time. While swapped, the optimizer's average variables
        hold the raw iterates, so save with `averaged_weights` (which copies) instead.

        Args:
            variables: the model variables to swap (default: all it was built on).
        """
        for variable, average in self.averaged_pairs(variables):
            raw = ops.copy(ops.convert_to_tensor(variable))
            variable.assign(_copy_of(average))
            average.assign(raw)

    def load_average_weights(self):
        """Copy the average into the model variables; return the raw weights to restore with
        `restore_weights`, or None (nothing done) when there is no average yet or it is
        already loaded. Prefer the `averaged_weights(model)` context manager."""
        if self._average_loaded or not self.has_average:
            return None
        pairs = self.averaged_pairs()
        backup = [ops.copy(ops.convert_to_tensor(v)) for v, _ in pairs]
        for variable, average in pairs:
            variable.assign(_copy_of(average))
        self._average_loaded = True
        return backup

    def restore_weights(self, backup):
        """Put back the raw weights returned by `load_average_weights` (bit for bit)."""
        if backup is None:
            return
        for (variable, _), raw in zip(self.averaged_pairs(), backup):
            variable.assign(raw)
        self._average_loaded = False

    def get_config(self):
        config = super().get_config()
        config["start_averaging"] = self.start_iteration
        return config


@keras.saving.register_keras_serializable(package="tflm")
class Adam(keras.optimizers.Optimizer):
    """Adam as `torch.optim.Adam`, with the step size of each window scaled by T / bptt.

        m_t = b1 m_{t-1} + (1 - b1) g_t,      v_t = b2 v_{t-1} + (1 - b2) g_t^2
        theta_t = theta_{t-1} - (lr * s_t / (1 - b1^t)) * m_t / (sqrt(v_t) / sqrt(1 - b2^t) + eps)

    with s_t the window factor the train step sets (`set_window_scale`; T / bptt in
    `tflm.LanguageModel`, 1 elsewhere). The references scale the learning rate of a window
    (`optimizer.param_groups[0]['lr'] = lr * seq_len / bptt`): for SGD that equals scaling
    the gradient, for Adam it does not (Adam is invariant to the gradient's scale), so this
    optimizer takes the factor into its step size and the train step leaves the gradient
    unscaled (`tflm.backends.gradients.process_gradients`). eps is added after the bias
    correction of v, as torch does (Keras' Adam adds it before, a different step while
    1 - b2^t is small). L2 weight decay is the train step's (`weight_decay` of
    `LanguageModel`: added to the clipped gradient, as torch.optim.Adam's `weight_decay`).

    Args:
        learning_rate: lr. Default 0.001 (torch's).
        beta_1, beta_2, epsilon: torch's defaults 0.9, 0.999, 1e-8.

    Reference: Kingma & Ba 2015; salesforce/awd-lstm-lm main.py (`--optimizer adam`, used by
    its character-level commands).
    """

    scales_learning_rate = True

    def __init__(self, learning_rate=0.001, beta_1=0.9, beta_2=0.999, epsilon=1e-8,
                 name=None, **kwargs):
        super().__init__(learning_rate=_as_float_lr(learning_rate), name=name, **kwargs)
        self.beta_1, self.beta_2, self.epsilon = float(beta_1), float(beta_2), float(epsilon)
        self._window_scale = self.add_variable(
            shape=(), dtype="float32", name="window_scale", initializer="ones",
            aggregation="only_first_replica")

    def build(self, variables):
        if self.built:
            return
        super().build(variables)
        self._m = self.add_optimizer_variables(variables, "m")
        self._v = self.add_optimizer_variables(variables, "v")

    def set_window_scale(self, scale):
        """The factor s of the next step's learning rate."""
        self._window_scale.assign(backends.current().constant(scale, self._window_scale))

    def update_step(self, gradient, variable, learning_rate):
        index = compat.optimizer_variable_index(self, variable)
        m, v = self._m[index], self._v[index]
        dtype = variable.dtype
        gradient = ops.cast(gradient, dtype)
        backend = backends.current()  # its constants: no copy from the host per variable

        def const(value):
            return backend.constant(value, gradient)

        t = ops.cast(ops.add(self.iterations, backend.constant(1, self.iterations)), dtype)
        beta_1, beta_2 = const(self.beta_1), const(self.beta_2)
        self.assign(m, ops.add(ops.multiply(beta_1, m),
                               ops.multiply(const(1.0 - self.beta_1), gradient)))
        self.assign(v, ops.add(ops.multiply(beta_2, v),
                               ops.multiply(const(1.0 - self.beta_2), ops.square(gradient))))
        correction_1 = ops.subtract(const(1.0), ops.power(beta_1, t))
        correction_2 = ops.subtract(const(1.0), ops.power(beta_2, t))
        step = ops.divide(ops.multiply(ops.cast(learning_rate, dtype),
                                       ops.cast(self._window_scale, dtype)), correction_1)
        denom = ops.add(ops.divide(ops.sqrt(v), ops.sqrt(correction_2)), const(self.epsilon))
        self.assign_sub(variable, ops.multiply(step, ops.divide(m, denom)))

    def get_config(self):
        config = super().get_config()
        config.update(beta_1=self.beta_1, beta_2=self.beta_2, epsilon=self.epsilon)
        return config


def learning_rate_scaler(model_or_optimizer):
    """The optimizer that takes the window factor into its learning rate (`Adam`), looking
    inside loss-scale wrappers, or None."""
    opt = getattr(model_or_optimizer, "optimizer", model_or_optimizer)
    for _ in range(4):
        if getattr(opt, "scales_learning_rate", False):
            return opt
        opt = getattr(opt, "inner_optimizer", None)
    return None


def find_averaged_optimizer(model_or_optimizer):
    """The `AveragedSGD` of a model or optimizer (looking inside loss-scale wrappers), or
    None."""
    opt = getattr(model_or_optimizer, "optimizer", model_or_optimizer)
    for _ in range(4):
        if isinstance(opt, AveragedSGD):
            return opt
        opt = getattr(opt, "inner_optimizer", None)
    return None


@contextlib.contextmanager
def averaged_weights(model):
    """Context manager: the model holds the averaged weights inside, its raw weights after.

    On entry the averages of the model's `AveragedSGD` are copied into the model variables
    (a temporary copy of the raw weights is kept); on exit the raw weights are copied back,
    bit for bit, even if the block raises. The optimizer's own variables are untouched, so a
    `model.save` inside the block writes the averaged model with a consistent optimizer
    state (what the reference's "Saving Averaged!" checkpoint holds). It does nothing when
    the model's optimizer is not averaging yet (or is not an `AveragedSGD`), and nested uses
    do nothing. Yields True when averaged weights are in the model.

    Example:

    >>> with averaged_weights(model) as averaged:
    ...     model.save("best.keras")
    """
    opt = find_averaged_optimizer(model)
    backup = None if opt is None else opt.load_average_weights()
    try:
        yield backup is not None
    finally:
        if backup is not None:
            opt.restore_weights(backup)


def start_finetune(model):
    """Start the finetuning stage: average again, starting from the averaged weights.

    Copies the current average into the model (when there is one: e.g. a model that was
    just trained with NT-ASGD; a model loaded from a checkpoint saved inside
    `averaged_weights` already holds them), then restarts averaging from the next step.
    This is the reference's finetune.py: load the averaged model, create a fresh
    `ASGD(t0=0, lambd=0)`, and stop with the non-monotonic rule
    (`NonMonotonicTrigger(on_trigger="stop")`).

    Returns the model's `AveragedSGD`.
    """
    opt = find_averaged_optimizer(model)
    if opt is None:
        raise TypeError("start_finetune needs a model compiled with tflm.optimizers."
                        f"AveragedSGD; model.optimizer is {type(model.optimizer).__name__}.")
    if not opt.built:
        opt.build(model.trainable_variables)
    if opt.has_average:
        for variable, average in opt.averaged_pairs():
            variable.assign(_copy_of(average))
    opt.restart_averaging()
    return opt
