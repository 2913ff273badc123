"""Shared pytest set-up: quiet TensorFlow, default data directory, backend subprocess helper."""

import re
import os
import pathlib

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
os.environ.setdefault("KERAS_BACKEND", "tensorflow")
# No shared JAX compilation cache between tests (test_compilation_cache.py uses its own).
os.environ.setdefault("TFLM_JAX_CACHE_DIR", "off")
# XLA (JAX, and TensorFlow's jit_compile) compiles the tests' many small programs with LLVM
# at -O0: a third less compile time for the JAX tests (test_padding's and test_jax_backend's
# slowest: 63 -> 46 s), the same IEEE arithmetic (XLA's CPU fast-math is off at every
# level), so every tolerance holds. Benchmarks and runs keep XLA's default level.
os.environ.setdefault("XLA_FLAGS", "--xla_backend_optimization_level=0")


def _with_older_emitters():
    """XLA:CPU's older loop emitters, as `zoo.train` runs JAX (`zoo.runtime.xla_flags`): 18% less
    time for test_padding, test_lstm_backward, test_jax_threefry and test_jax_target_log_probs
    (130 -> 106 s). TensorFlow's XLA reads XLA_FLAGS too, and an entry it does not know
    ends the process: only where both jaxlib and TensorFlow are releases that know it."""
    import importlib.metadata
    from zoo.runtime import xla_flags
    try:
        tf_version = tuple(int(x) for x in importlib.metadata.version("tensorflow").split(".")[:2])
    except importlib.metadata.PackageNotFoundError:
        tf_version = None
    known = tf_version is None or (2, 21) <= tf_version < (2, 22)
    if known and xla_flags.jaxlib_verified() and "fusion_emitters" not in os.environ["XLA_FLAGS"]:
        os.environ["XLA_FLAGS"] += " " + xla_flags.FUSION_EMITTERS


_with_older_emitters()

import pytest  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
_SHARED_DATA = REPO.parent / "shared" / "data"


def data_dir():
    """The corpus directory for tests: $TFLM_DATA_DIR, else ../shared/data beside the repo."""
    env = os.environ.get("TFLM_DATA_DIR")
    if env:
        return pathlib.Path(env)
    return _SHARED_DATA


def ptb_available():
    d = data_dir()
    return all((d / "penn" / f"{s}.txt").exists() for s in ("train", "valid", "test"))


@pytest.fixture
def ptb_dir():
    if not ptb_available():
        pytest.skip(f"Penn Treebank not found under {data_dir()} (set TFLM_DATA_DIR)")
    return data_dir()


@pytest.fixture(autouse=True)
def _fresh_keras_session():
    """Keras' global state reset before each test, without the full garbage collection
    `clear_session` runs by default: on a test process holding TensorFlow's graphs that
    collection took about 0.9 s a test, 1,408 s of the suite's 3,353 (`--durations`,
    2026-11-29). Python's own collector still frees what cycles hold."""
    import keras
    keras.utils.clear_session(free_memory=False)
    yield


TINY_RUN_FLAGS = ["--set", "corpus.train_tokens=4000", "--set", "corpus.valid_tokens=1000",
                  "--set", "corpus.test_tokens=1000", "--set", "corpus.vocab_size=40",
                  "--set", "model.hidden_dim=16", "--set", "model.embed_dim=8",
                  "--set", "training.bptt=10", "--batch-size", "8", "--quiet"]


@pytest.fixture(scope="session")
def tiny_run(tmp_path_factory):
    """A finished `python -m zoo.train` run (one epoch, synthetic 40-word language, AWD-LSTM
    8 / 16), made once per test process. Tests must not modify it: copy it first
    (`shutil.copytree`) to write into it."""
    from zoo import train
    out = tmp_path_factory.mktemp("tiny") / "run"
    assert train.main(["--epochs", "1", "--seed", "3", "--out", str(out),
                       *TINY_RUN_FLAGS]) == 0
    before = _listing(out)
    yield out
    changed = sorted(set(before.items()) ^ set(_listing(out).items()))
    assert not changed, (f"a test wrote into the shared tiny_run folder (copy it first): "
                         f"{sorted({name for name, _ in changed})}")


def _listing(folder):
    """{relative path: (size, mtime in ns)} of every file below `folder`."""
    return {str(p.relative_to(folder)): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*")) if p.is_file()}


_NATIVE_LOG_LINE = re.compile(r"^[IWEF]\d{4} [\d:.]+ +\d+ [\w.]+:\d+\] |"
                              r"^WARNING: All log messages before absl::InitializeLog")


def without_native_log_lines(text):
    """`text` without the C++ runtime's log lines (TensorFlow / XLA, e.g. "E0000 ...
    util.cc:131] oneDNN supports DT_BOOL only on platforms with AVX-512", which TensorFlow
    prints mid-run on some CPUs whatever zoo.runtime.quiet_start filtered at start-up)."""
    return "".join(line for line in text.splitlines(keepends=True)
                   if not _NATIVE_LOG_LINE.match(line))


# Variants of a test (backends, heads, cases) whose sibling variants, or the CI test named
# beside them, stay in CI: the long tier (-m slow) runs them, so CI keeps one or two backends
# of each check and stays under its 15 minutes.
# Durations: the full suite on the 2-core CI machine, `--durations`, 2026-11-28.
SLOW_VARIANTS = {
    "tests/tflm/layers/test_cnf_heads.py::test_flow_heads_fit_and_reload[torch]",  # 21 s
    "tests/tflm/layers/test_importance_sampling.py::"
    "test_sampled_softmax_trains_under_fit_and_reloads[torch]",  # 17 s
    "tests/tflm/test_language_model.py::"
    "test_evaluate_is_the_models_nll_whatever_the_window_length[jax-softmax]",  # 22 s
    "tests/tflm/test_language_model.py::"
    "test_evaluate_is_the_models_nll_whatever_the_window_length[torch-doc]",  # 17 s
    'tests/tflm/test_padding.py::test_training_on_padded_windows_equals_unpadded[torch-{"type":'
    ' "doc", "num_components_per_layer": [0, 2, 3], "cv_regularization": 0.05}]',  # 11 s
    "tests/tflm/layers/test_past_decode.py::"
    "test_pdr_value_fit_and_reload_on_other_backends[jax]",  # 15 s
    "tests/zoo/models/test_mogrifier.py::test_fit_on_other_backends[torch-mos]",  # 17 s
    "tests/tflm/layers/test_mogrifier.py::test_other_backends_match_the_equations[torch]",  # 10 s
    "tests/tflm/layers/test_mos_recompute.py::"
    "test_recomputed_mixture_equals_batched_autodiff[jax]",  # 13 s
    "tests/zoo/test_cache_pointer.py::"
    "test_other_backends_equal_the_direct_computation[torch]",  # 10 s
    # 2026-12-07 (`--durations=0`, this machine: CI at 17 minutes). Each README claim keeps a
    # CI test: the one named after the variant checks the same thing.
    "tests/zoo/test_cache_pointer.py::"
    "test_other_backends_equal_the_direct_computation[jax]",  # 7 s; test_without_tensorflow[jax]
    "tests/zoo/test_dynamic_eval.py::"
    "test_formula_and_parity_hold_on_the_other_keras_backends[jax]",  # 18 s; the same
    "tests/zoo/test_train.py::"
    "test_steps_per_execution_trains_as_single_steps[jax]",  # 16 s; [tensorflow],
    # and test_scanned_steps
    "tests/zoo/models/test_mogrifier.py::"
    "test_fit_on_other_backends[jax-softmax]",  # 15 s; tests/tflm/layers/test_mogrifier.py[jax]
    "tests/tflm/backends/test_torch_multi_tensor.py::"
    "test_multi_tensor_step_equals_the_per_variable_step[asgd]",  # 11 s; its other optimizers
    "tests/tools/test_qmatrix_export.py::"
    "test_export_on_other_backends_equals_the_eager_forward[torch]",  # 9 s; [jax]
    "tests/test_result_write_faults.py::"
    "test_a_failed_result_write_keeps_the_previous_file[zoo.dynamic_eval]",  # 8 s; the others
    "tests/zoo/presets/test_text8_wt103_presets.py::"
    "test_wt103_presets_train_shortened_on_a_miniature[awd_lstm_mos_wt103]",  # 8 s;
    # [awd_lstm_wt103]
    "tests/zoo/models/test_precision.py::"
    "test_zoo_train_trains_under_mixed_bfloat16_on_jax_and_torch[jax]",  # 8 s; the policy test
    "tests/tflm/backends/test_backend_ops.py::"
    "test_backend_ops_against_numpy[torch]",  # 7 s; test_torch_linear, [jax]
    "tests/tflm/test_padding.py::"
    'test_training_on_padded_windows_equals_unpadded[jax-"softmax"]',  # 21 s;
    # test_compiled_lengths' JAX run pads and equals the unpadded weights
    "tests/tflm/layers/test_cnf_heads.py::"
    "test_flow_heads_fit_and_reload[tensorflow]",  # 16 s; test_transfer's ccnf run, the README's
    "tests/tflm/ode/test_ode.py::"
    "test_other_backends_agree_with_tensorflow[jax]",  # 8 s; test_neural_ode_head[jax]
    "tests/zoo/runs/test_window_shapes.py::"
    "test_window_shapes_per_backend[torch]",  # 8 s; [tensorflow], [jax]
    "tests/zoo/models/test_keras_registration.py::"
    "test_keras_load_model_after_import_zoo_in_any_order[keras_first]",  # 7 s; [zoo_first]
    "tests/zoo/models/test_keras_registration.py::"
    "test_keras_load_model_after_import_zoo_in_any_order[tflm_between]",  # 7 s; [zoo_first]
    # The flow heads' per-head variants: `node`, their ODE solver, stays in CI for each.
    "tests/zoo/runs/test_xla_evaluation.py::test_every_head_evaluates_the_same_under_xla[cnf]",
    "tests/zoo/runs/test_xla_evaluation.py::test_every_head_evaluates_the_same_under_xla[ccnf]",
    "tests/tools/test_qmatrix_export.py::"
    "test_tensorflow_window_forward_equals_the_eager_forward_for_every_head[cnf]",
    "tests/tools/test_qmatrix_export.py::"
    "test_tensorflow_window_forward_equals_the_eager_forward_for_every_head[ccnf]",
    "tests/tools/test_word_similarity.py::"
    "test_both_tools_give_the_same_figures_on_the_other_backends[jax]",  # 6 s; no README claim
    "tests/tflm/backends/test_torch_layer_calls.py::"
    "test_direct_calls_train_the_same_weights_as_keras_calls[mogrifier_ptb]",  # 7 s;
    "tests/tflm/backends/test_torch_layer_calls.py::"
    "test_direct_calls_train_the_same_weights_as_keras_calls[zaremba_small_mos_ptb]",  # 4 s;
    # both: [awd_lstm_ptb], the README's, the same call_layer
    # 2026-12-07, stop 65 (the suite at 843 s): the default implementation, which
    # [tensorflow] runs too
    "tests/tflm/backends/test_jax_mixture_target_log_probs.py::"
    "test_every_backend_gives_the_mixture_at_the_targets[torch]",  # 8 s; [tensorflow]
    # 2026-12-07, stop 66: [jax] back in CI (its totals' dtype without a warning)
    "tests/tflm/backends/test_assign_add.py::"
    "test_assign_add_equals_keras_and_metric_totals_stay_float64[tensorflow]",  # [torch]
}


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marks
def pytest_collection_modifyitems(config, items):
    ids = {item.nodeid for item in items}
    files = {item.nodeid.split("::")[0] for item in items}
    missing = [v for v in SLOW_VARIANTS if v.split("::")[0] in files and v not in ids]
    if missing:
        raise pytest.UsageError(f"tests/conftest.py SLOW_VARIANTS names tests that no longer "
                                f"exist (renamed?): {missing}")
    for item in items:
        if item.nodeid in SLOW_VARIANTS:
            item.add_marker(pytest.mark.slow)
