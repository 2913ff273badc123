"""Run a snippet of Python, or a test file's tests, under another Keras backend (each backend
needs its own process; TensorFlow's snippets, from the TensorFlow session, run in this
one)."""

import contextlib
import importlib.util
import io
import os
import sys
import textwrap
import traceback

import keras
import pytest

from tests import preloaded_python
from tests.conftest import REPO

_MODULE_OF = {"jax": "jax", "torch": "torch", "tensorflow": "tensorflow"}


def _env(backend):
    """The environment of a command under `backend`: one for snippets and test files alike,
    so that both are forks of the same preloaded interpreter (another environment would
    start, and import for, another)."""
    return dict(os.environ, KERAS_BACKEND=backend, TF_CPP_MIN_LOG_LEVEL="2",
                JAX_PLATFORMS="cpu", CUDA_VISIBLE_DEVICES="",
                PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def run_in_backend(backend, code, timeout=300, fresh=False):
    """Run `code` with KERAS_BACKEND=backend from the repo root; return its stdout.

    Skips the calling test when the backend's package is not installed; fails it (with the
    subprocess's stderr) when the snippet raises. The process is a fork of an interpreter
    with the backend imported (`tests.preloaded_python`), or with `fresh` a new one (for
    code that reads what a fork inherits: settings read at import, the imports themselves).
    TensorFlow's snippets, from the TensorFlow session, run in this process instead
    (`run_here`): TensorFlow is not preloaded, so each would be a fresh import (about 8 s
    beside the suite).
    """
    if importlib.util.find_spec(_MODULE_OF[backend]) is None:
        pytest.skip(f"Keras backend {backend!r} is not installed")
    if backend == "tensorflow" == keras.backend.backend() and not fresh:
        return run_here(code)
    proc = preloaded_python.run([sys.executable, "-c", textwrap.dedent(code)], _env(backend),
                                REPO, timeout=timeout, fresh=fresh)
    if proc.returncode != 0:
        pytest.fail(f"snippet failed under KERAS_BACKEND={backend}:\n{proc.stderr[-4000:]}")
    return proc.stdout


def run_here(code):
    """Run the snippet `code` in this process, as `python -c` would from the repo root (a
    namespace of its own, named `__main__`); return what it printed. A snippet that raises
    fails the calling test with its traceback. The Keras settings a snippet may change
    (dtype policy, floatx, epsilon) are put back afterwards."""
    policy, floatx = keras.config.dtype_policy(), keras.config.floatx()
    epsilon, cwd, printed = keras.config.epsilon(), os.getcwd(), io.StringIO()
    try:
        os.chdir(REPO)
        with contextlib.redirect_stdout(printed):
            exec(compile(textwrap.dedent(code), "<snippet>", "exec"), {"__name__": "__main__"})
    except SystemExit as stop:
        if stop.code not in (None, 0):
            pytest.fail(f"snippet exited with {stop.code!r}:\n{printed.getvalue()[-4000:]}")
    except Exception:  # noqa: BLE001 -- any error of the snippet fails the test, as in a child
        pytest.fail(f"snippet failed under KERAS_BACKEND=tensorflow (in this process):\n"
                    f"{traceback.format_exc()[-4000:]}")
    finally:
        os.chdir(cwd)
        keras.config.set_dtype_policy(policy)
        keras.config.set_floatx(floatx)
        keras.config.set_epsilon(epsilon)
    return printed.getvalue()


def run_tests_in_backend(backend, test_file, keyword, timeout=900):
    """Run the tests of `test_file` that `-k keyword` selects with KERAS_BACKEND=backend,
    from the TensorFlow session (Keras fixes its backend per process); returns pytest's
    output. Skips the calling test under another session or without the backend's package;
    fails it, with the output, when a selected test fails."""
    if keras.backend.backend() != "tensorflow":
        pytest.skip("run from the TensorFlow session, which starts one process per backend")
    if importlib.util.find_spec(_MODULE_OF[backend]) is None:
        pytest.skip(f"Keras backend {backend!r} is not installed")
    proc = preloaded_python.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                 str(test_file), "-k", keyword], _env(backend), REPO,
                                timeout=timeout)
    assert proc.returncode == 0, f"under KERAS_BACKEND={backend}:\n{proc.stdout[-6000:]}"
    return proc.stdout
