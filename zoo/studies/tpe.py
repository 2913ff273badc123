"""Bayesian optimisation for `python -m zoo.search --algorithm tpe`: Optuna's TPE sampler
(Bergstra et al. 2011; Zhang 2018 §9 names Bayesian optimisation as the next step after
his random search) asks for trials, the studies' engine trains them on Ray Tune, and Optuna
is told each one's validation perplexity (minimised).

    repeat until `trials` trials have trained:
        ask `workers` trials (the engine trains them side by side); a draw that breaks the
            space's constraints is told "pruned" at once and asked again, as the random
            search redraws (it is not trained and not counted)
        train them (`run_batch`); tell each its valid perplexity, or "failed" (diverged, or
            failed after the engine's retries)

The state is Optuna's study in `OUT/optuna.db` (SQLite, study "search"), with each trial's
values as a user attribute: a search stopped and started again loads it, trains again (from
their checkpoints) the trials that were asked and not told, and asks only what is left.
Trial k's folder is `OUT/trial_<k>` (Optuna's trial number; rejected draws leave gaps).
TPE's first `n_startup_trials` (10) draws are random, as Optuna's sampler makes them.

The space's distributions map onto Optuna's: `uniform` -> suggest_float, `log_uniform` ->
suggest_float(log=True), `int` -> suggest_int (ends included), `choice` ->
suggest_categorical, `value` fixed, `same_as` copied.
"""

from zoo.errors import UserError
from zoo.runs.search_space import satisfies

OPTUNA_MISSING = ("zoo.search --algorithm tpe uses Optuna, which is not installed here: "
                  "pip install 'tflm[study]' (Ray Tune and Optuna) or pip install optuna, "
                  "then run the same command again.")
STORAGE = "optuna.db"
MAX_REJECTED = 1000


def import_optuna():
    """optuna, or a `UserError` that says how to install it."""
    try:
        # deferred: an optional extra, imported only for a TPE search
        import optuna
    except ImportError as err:
        raise UserError(OPTUNA_MISSING) from err
    return optuna


def suggest(trial, space):
    """{field: value} for `space`'s fields, asked of an Optuna `trial`."""
    values = {}
    for field, spec in space["fields"].items():
        kind, arg = next(iter(spec.items()))
        if kind == "uniform":
            values[field] = trial.suggest_float(field, float(arg[0]), float(arg[1]))
        elif kind == "log_uniform":
            values[field] = trial.suggest_float(field, float(arg[0]), float(arg[1]), log=True)
        elif kind == "int":
            values[field] = trial.suggest_int(field, int(arg[0]), int(arg[1]))
        elif kind == "choice":
            values[field] = trial.suggest_categorical(field, arg)
        elif kind == "value":
            values[field] = arg
    for field, spec in space["fields"].items():
        if "same_as" in spec:
            values[field] = values[spec["same_as"]]
    return {f: values[f] for f in space["fields"]}


def tpe_search(space, trials, seed, folder, workers, run_batch):
    """Ask, train and tell until `trials` trials have trained. `run_batch([(number,
    values)])` trains those trials and returns {number: valid perplexity or None (diverged,
    failed)}. Returns the numbers of the trained trials, in order."""
    optuna = import_optuna()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    states = optuna.trial.TrialState
    study = optuna.create_study(study_name="search", direction="minimize",
                                storage=f"sqlite:///{folder / STORAGE}", load_if_exists=True,
                                sampler=optuna.samplers.TPESampler(seed=seed))

    def trained():
        return [t for t in study.get_trials(deepcopy=False)
                if not t.user_attrs.get("rejected")]

    rejected = 0
    while True:
        batch = [(t.number, t.user_attrs["values"]) for t in trained()
                 if t.state == states.RUNNING]  # asked, never told: a stopped search's
        if not batch:
            left = trials - len(trained())
            if left <= 0:
                break
            while len(batch) < min(workers or 1, left):
                trial = study.ask()
                values = suggest(trial, space)
                if not satisfies(space, values):
                    trial.set_user_attr("rejected", True)
                    study.tell(trial, state=states.PRUNED)
                    rejected += 1
                    if rejected > MAX_REJECTED:
                        raise UserError(f"search space {space.get('name', '')!r}: TPE drew "
                                        f"{MAX_REJECTED} values that break its constraints; "
                                        "widen the ranges or relax the constraints.")
                    continue
                trial.set_user_attr("values", values)
                batch.append((trial.number, values))
        for number, value in run_batch(batch).items():
            if value is None:
                study.tell(number, state=states.FAIL)
            else:
                study.tell(number, value)
    return [t.number for t in trained()]
