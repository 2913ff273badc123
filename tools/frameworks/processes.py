"""Starting the worker processes: which backends exist, their environment, their results."""

import importlib.util
import json
import os
import pathlib
import subprocess
import sys
import time

# The folder holding the `tools` package (a clone, or site-packages when installed): a worker
# imports the same code as the process that started it.
PACKAGE_ROOT = pathlib.Path(__file__).resolve().parents[2]
WORKER_MODULE = "tools.frameworks.worker"
BACKENDS = ("tensorflow", "jax", "torch", "torch-native")
_PACKAGE = {"tensorflow": "tensorflow", "jax": "jax", "torch": "torch", "torch-native": "torch"}


def backend_available(name):
    """(True, "") or (False, reason) without importing the framework."""
    if name not in BACKENDS:
        return False, f"unknown backend (choose from {', '.join(BACKENDS)})"
    package = _PACKAGE[name]
    if importlib.util.find_spec(package) is None:
        return False, f"Python package {package!r} is not installed"
    if name != "torch-native" and importlib.util.find_spec("keras") is None:
        return False, "Python package 'keras' is not installed"
    return True, ""


def worker_env(backend, device, threads=0, malloc="keep"):
    """The environment of one worker: thread pools, glibc malloc, backend and device."""
    env = dict(os.environ)
    if malloc == "keep":
        env["MALLOC_MMAP_MAX_"] = "0"
        env["MALLOC_TRIM_THRESHOLD_"] = str(2 ** 40)
    if threads:
        n = str(int(threads))
        for key in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS",
                    "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS"):
            env[key] = n
        flags = [f for f in env.get("XLA_FLAGS", "").split() if "multi_thread_eigen" not in f
                 and "intra_op_parallelism" not in f]
        flags.append(f"--xla_cpu_multi_thread_eigen={'false' if threads == 1 else 'true'}")
        env["XLA_FLAGS"] = " ".join(flags)
    env["PYTHONPATH"] = str(PACKAGE_ROOT) + (os.pathsep + env["PYTHONPATH"]
                                             if env.get("PYTHONPATH") else "")
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
    if backend != "torch-native":
        env["KERAS_BACKEND"] = backend
    if device == "cpu":
        env["CUDA_VISIBLE_DEVICES"] = ""
        env["JAX_PLATFORMS"] = "cpu"
    return env


def run_worker(spec, out, timeout):
    """Run one worker process; returns its result dict (failed / timeout reported)."""
    name = spec["backend"] if spec["phase"] == "run" else "init"
    spec_path = out / f"spec_{name}.json"
    spec_path.write_text(json.dumps(spec, indent=1))
    log_path = out / "logs" / f"{name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = worker_env(spec["backend"], spec["device"], spec.get("threads", 0),
                     spec.get("malloc", "keep"))
    started = time.perf_counter()
    with open(log_path, "w") as log:
        try:
            # in this process's directory, where the relative paths of the spec point
            proc = subprocess.run([sys.executable, "-m", WORKER_MODULE, str(spec_path)],
                                  env=env, stdout=log, stderr=subprocess.STDOUT,
                                  timeout=timeout)
            code = proc.returncode
        except subprocess.TimeoutExpired:
            return {"backend": spec["backend"], "status": "failed",
                    "reason": f"timed out after {timeout:.0f} s (log: {log_path})"}
    result_path = pathlib.Path(spec["result_path"])
    if not result_path.exists():
        tail = log_path.read_text(errors="replace").strip().splitlines()[-3:]
        return {"backend": spec["backend"], "status": "failed",
                "reason": f"worker exited with code {code} and no result: {' | '.join(tail)}"}
    result = json.loads(result_path.read_text())
    result["process_wall_s"] = time.perf_counter() - started
    result["log"] = str(log_path)
    return result


def pick_init_backend():
    """The Keras backend that makes the shared start (TensorFlow when installed)."""
    for name in ("tensorflow", "jax", "torch"):
        if backend_available(name)[0]:
            return name
    return None
