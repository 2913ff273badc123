"""The command lines' quiet start (`zoo.runtime.quiet_start`): TensorFlow's start-up lines are dropped
from stderr, everything else (Python warnings, other C++ lines) is kept. The whole command
without those lines: tests/zoo/test_train.py::test_cli_module_runs_without_start_up_noise."""

import os
import subprocess
import sys
import textwrap

import pytest

from tests.conftest import REPO
from zoo.runtime import quiet_start

NOISE = [
    "WARNING: All log messages before absl::InitializeLog() is called are written to STDERR",
    "I0000 00:00:1795461606.546738   30094 cudart_stub.cc:31] Could not find cuda drivers on "
    "your machine, GPU will not be used.",
    "I0000 00:00:1795461631.756346   30268 cpu_feature_guard.cc:227] This TensorFlow binary is "
    "optimized to use available CPU instructions in performance-critical operations.",
    "To enable the following instructions: AVX2 FMA, in other operations, rebuild TensorFlow "
    "with the appropriate compiler flags.",
    "E0000 00:00:1795461613.216599   30094 cuda_platform.cc:52] failed call to cuInit: "
    "INTERNAL: CUDA error: Failed call to cuInit: UNKNOWN ERROR (303)",
    "I0000 00:00:1795552390.799845   10420 port.cc:153] oneDNN custom operations are on. You "
    "may see slightly different numerical results due to floating-point round-off errors "
    "from different computation orders. To turn them off, set the environment variable "
    "`TF_ENABLE_ONEDNN_OPTS=0`.",
    "E0000 00:00:1795855129.430731   11378 util.cc:131] oneDNN supports DT_BOOL only on "
    "platforms with AVX-512. Falling back to the default Eigen-based implementation if "
    "present.",
]
KEPT = "E0000 00:00:1795461613.216599   30094 some_kernel.cc:12] a real error"


def test_filtered_stderr_drops_start_up_lines_and_keeps_the_rest():
    # File descriptor 2 is the process's own: a subprocess, without TensorFlow (fast).
    code = textwrap.dedent(f"""
        import os, sys, warnings
        from zoo.runtime.quiet_start import filtered_stderr
        with filtered_stderr():
            for line in {[*NOISE[:2], KEPT, *NOISE[2:]]!r}:
                os.write(2, (line + "\\n").encode())
            warnings.warn("a Python warning")
        try:
            with filtered_stderr():
                os.write(2, ({NOISE[0]!r} + "\\n").encode())
                print("written before the error", file=sys.stderr)
                raise KeyboardInterrupt
        except KeyboardInterrupt:
            print("stderr is back", file=sys.stderr)
    """)
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stderr.splitlines()
    assert lines[0] == KEPT
    assert "UserWarning: a Python warning" in lines[1]
    assert lines[-2:] == ["written before the error", "stderr is back"]
    assert not set(NOISE) & set(lines), proc.stderr


@pytest.mark.parametrize("line", NOISE)
def test_each_start_up_line_is_noise(line):
    assert quiet_start.is_noise(line)


@pytest.mark.parametrize("line", [KEPT, "UserWarning: cuda drivers", "zoo.train: error: x"])
def test_other_lines_are_not_noise(line):
    assert not quiet_start.is_noise(line)


def test_an_explicit_log_level_is_respected(monkeypatch):
    monkeypatch.setenv("TF_CPP_MIN_LOG_LEVEL", "0")
    quiet_start.set_environment()
    assert quiet_start.wants_tensorflow_logs()
    monkeypatch.delenv("TF_CPP_MIN_LOG_LEVEL")
    assert not quiet_start.wants_tensorflow_logs()
    quiet_start.set_environment()
    assert os.environ["TF_CPP_MIN_LOG_LEVEL"] == "2"


@pytest.mark.parametrize("backend,ok", [("torch", True), ("jax", True), ("tensorflow", False)])
def test_start_without_tensorflow_installed(tmp_path, backend, ok):
    """A GPU image with PyTorch and JAX but no TensorFlow (hidden here by a package that
    fails to import as a missing one does): the command lines start on PyTorch and JAX, and
    on TensorFlow the missing module is reported."""
    shadow = tmp_path / "tensorflow"
    shadow.mkdir()
    (shadow / "__init__.py").write_text(
        'raise ModuleNotFoundError("No module named \'tensorflow\'", name="tensorflow")\n')
    env = dict(os.environ, KERAS_BACKEND=backend,
               PYTHONPATH=os.pathsep.join([str(tmp_path), str(REPO)]))
    code = "from zoo.runtime import quiet_start; quiet_start.start(); print('started')"
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                         text=True, timeout=120)
    if ok:
        assert out.returncode == 0, out.stderr
        assert out.stdout.strip() == "started"
    else:
        assert out.returncode != 0
        assert "No module named 'tensorflow'" in out.stderr


def test_the_once_only_dt_bool_note_never_reaches_a_run():
    # TensorFlow prints oneDNN's DT_BOOL note the first time it transposes a boolean tensor
    # on the CPU, mid-run (a zoo model's evaluation step does); start() has it printed, and
    # dropped, while stderr is filtered. A subprocess: start() acts before TensorFlow loads.
    code = textwrap.dedent("""
        import sys
        from zoo.runtime import quiet_start
        quiet_start.start()
        import tensorflow as tf
        step = tf.function(lambda x: tf.transpose(x > 0))
        print(step(tf.ones((2, 3))).shape, file=sys.stderr)
    """)
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env.update(KERAS_BACKEND="tensorflow", CUDA_VISIBLE_DEVICES="",
               PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.strip() == "(3, 2)", proc.stderr
