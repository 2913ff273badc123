"""A study's trials on Ray Tune: one Tune trial per study trial, each a normal `zoo.train`
run folder.

Ray Tune (an optional dependency: `pip install 'tflm[study]'`) is the engine the issue and
the field expect: local by default (`ray.init` starts a cluster of this machine's CPUs and
GPUs), `address` joins a running cluster (`ray start --head` on one machine, `ray start
--address HEAD:6379` on the others) with no change to the study. Tune schedules the trials
on the cluster's resources (one CPU a trial; one GPU a trial where the cluster has GPUs),
retries a trial whose process failed (`max_failures` times: a crash, a lost node; the retry
continues the run folder from its last epoch checkpoint) and reports the ones that failed
for good. A trial that stops on an error of its configuration or files (`zoo.errors.UserError`,
a missing corpus, a checkpoint that cannot be read) is reported at once, not retried: the
same error would come again. A worker process carries on from one trial to the next
(Tune's `reuse_actors`: the framework is imported once per worker, not once per trial), and
a local cluster's workers run at the driver's CPU priority (`_worker_priority`).

What a trial did lives in its run folder, not in Tune's state: a study (or a search) run
again submits only the trials whose folders are not finished (`zoo.runs.run_state`): a
finished or diverged trial is skipped, an interrupted one resumes with `--resume`'s
machinery, a new one trains. Tune's own records go to a folder of the caller's
(`STUDY/engine/`, `SEARCH/engine/`). `python -m zoo.study` and `python -m zoo.search` run
their trials here.
"""

import contextlib
import os
import pathlib
import signal
import threading

from zoo.errors import UserError
from zoo.runs import atomic_files
from zoo.runs.run_state import DIVERGED_FILE, run_state
from zoo.studies.measures import measure_trial, missing

ENGINE_MISSING = ("zoo.study runs its trials on Ray Tune, which is not installed here: "
                  "pip install 'tflm[study]' (Ray Tune and Optuna) or pip install 'ray[tune]', "
                  "then run the same command again.")
JOIN_FAILED = ("could not join the Ray cluster at {address} ({error}). Check that it runs "
               "(`ray status` on its head). A cluster started with `ray start --head` on Ray "
               "2.59 or later asks for its token: set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN "
               "to what `ray get-auth-token` prints on the head, then run the same command "
               "again.")
DONE = ("finished", "diverged")
NICENESS_ENV = "RAY_worker_niceness"


def failures_text(failed):
    """The lines a command's table ends with for `failed` ({trial: error}, `run_trials`'):
    empty when none failed."""
    if not failed:
        return ""
    return "\nFailed after retries: " + "; ".join(f"{k}: {v}" for k, v in failed.items()) + "\n"


def import_tune():
    """(ray, ray.tune), or a `UserError` that says how to install them."""
    try:
        # deferred: an optional extra, imported only where trials are to run
        import ray
        from ray import tune
    except ImportError as err:
        raise UserError(ENGINE_MISSING) from err
    return ray, tune


def _needs_work(path, measures):
    state = run_state(path)
    return state not in DONE or (state == "finished" and bool(missing(path, measures)))


def train_trial(tune_config, plans, data_dir, measures=()):
    """Tune's function trainable, in a Ray worker: train (or resume, or skip) one trial's
    run folder, then take the study's `measures` it lacks (`zoo.studies.measures`). Returns
    {"state": its run_state afterwards, "error": the one line of a user-fixable error, or
    ""}."""
    config, path = plans[tune_config["trial"]]
    path = pathlib.Path(path)
    state = run_state(path)
    if state in DONE:
        return {"state": state, "error": _measure(path, measures, data_dir)}
    # deferred: the frameworks load in the worker, not in the driver that plans
    import keras
    from tflm.callbacks import TrainingDiverged
    from tflm.data import CorpusNotFoundError
    from zoo.runs.checkpoint import CheckpointError
    from zoo.runs.training import run
    keras.utils.clear_session()  # a reused worker's previous trial
    error = ""
    try:
        run(None if state == "interrupted" else config, path, data_dir=data_dir, verbose=2,
            resume=state == "interrupted")
    except TrainingDiverged as err:
        atomic_files.write_json(path / DIVERGED_FILE, {"message": str(err)})
    except (UserError, CorpusNotFoundError, CheckpointError) as err:
        error = f"{type(err).__name__}: {err}"
    return {"state": run_state(path), "error": error or _measure(path, measures, data_dir)}


def _measure(path, measures, data_dir):
    """Take the measures a finished trial lacks; "" or the one line of what failed."""
    if not measures or run_state(path) != "finished":
        return ""
    try:
        measure_trial(path, measures, data_dir)
    except UserError as err:
        return f"{type(err).__name__}: {err}"
    return ""


@contextlib.contextmanager
def _worker_priority(address):
    """While a local cluster starts: its workers at the driver's CPU priority. Ray starts
    them at niceness 15 (`RAY_worker_niceness`), and beside any other busy process (a
    test run, a second study, an editor's indexer) such a trial starves: beside two busy
    processes on a 2-core machine, 207.7 s a tiny trial against 13.4 s at the driver's
    priority (bench/studies/results/engine_overhead.md). A value the user set is kept; a
    cluster joined with `address` keeps its own."""
    if address or NICENESS_ENV in os.environ:
        yield
        return
    os.environ[NICENESS_ENV] = "0"  # read by the raylet ray.init spawns
    try:
        yield
    finally:
        os.environ.pop(NICENESS_ENV, None)


_held = []  # one entry per open one_session(): whether a call inside started Ray


@contextlib.contextmanager
def one_session():
    """One Ray session for every `run_trials` call inside, started by the first call that
    has trials to run and shut down at the end, rather than a cluster started and stopped
    per call: a study's searches and then its trials, a TPE search's batches (a local
    cluster's start and shutdown took 6.5 s on a 2-core CPU beside a test run). Nothing is
    started where nothing is left to run (a finished study run again). Inside another
    one_session(), the outer one holds the session."""
    if _held:
        yield
        return
    _held.append(False)
    try:
        yield
    finally:
        if _held.pop():
            ray, _ = import_tune()
            ray.shutdown()


def run_trials(runs, records, data_dir=None, address=None, workers=None, max_failures=2,
               measures=()):
    """Run the trials of `runs` ([(name, zoo.train configuration, run folder)]) whose
    folders are not done (or finished without one of `measures`), on Ray Tune, its records
    in the folder `records`. Returns {trial name: error text} for the trials that failed
    after their retries (empty when none did)."""
    measures = tuple(measures)
    pending = [(name, config, pathlib.Path(path).resolve()) for name, config, path in runs
               if _needs_work(path, measures)]
    if not pending:
        return {}
    ray, tune = import_tune()
    # Ray and Tune install their own Ctrl-C handlers; the caller's come back afterwards
    main_thread = threading.current_thread() is threading.main_thread()
    handlers = ({s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
                if main_thread else {})
    started = not ray.is_initialized()
    if started:
        env = {k: os.environ[k] for k in ("KERAS_BACKEND", "TFLM_DATA_DIR") if k in os.environ}
        with _worker_priority(address):
            try:
                # "local": a cluster of our own even where `ray start` runs one here (ray.init
                # would join that one, and refuse our num_cpus)
                ray.init(address=address or "local", num_cpus=None if address else workers,
                         include_dashboard=False, configure_logging=False,
                         runtime_env={"env_vars": env} if env else None)
            except ConnectionError as err:
                raise UserError(JOIN_FAILED.format(address=address, error=err)) from err
        if _held:  # the one_session() around this call shuts it down
            _held[-1], started = True, False
    try:
        gpus = ray.cluster_resources().get("GPU", 0)
        plans = {name: (config, str(path)) for name, config, path in pending}
        trainable = tune.with_resources(
            tune.with_parameters(train_trial, plans=plans,
                                 data_dir=str(pathlib.Path(data_dir).resolve())
                                 if data_dir else None, measures=measures),
            {"cpu": 1, "gpu": 1} if gpus else {"cpu": 1})
        tuner = tune.Tuner(
            trainable, param_space={"trial": tune.grid_search(list(plans))},
            tune_config=tune.TuneConfig(max_concurrent_trials=workers, reuse_actors=True),
            run_config=tune.RunConfig(storage_path=str(pathlib.Path(records).resolve()),
                                      verbose=1,
                                      failure_config=tune.FailureConfig(
                                          max_failures=max_failures)))
        results = tuner.fit()
        failed = {}
        for result in results:
            if result.error is not None:
                lines = str(result.error).strip().splitlines() or [type(result.error).__name__]
                failed[result.config["trial"]] = lines[-1]
            elif (result.metrics or {}).get("error"):
                failed[result.config["trial"]] = result.metrics["error"]
        return failed
    finally:
        if started:
            ray.shutdown()
        for number, handler in handlers.items():
            if handler is not None:
                signal.signal(number, handler)
